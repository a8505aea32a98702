"""User tools: typed Python functions whose JSON schema comes from their signature and docstring.

>>> @tool
... def get_weather(city: str, unit: str = "C") -> str:
...     '''Current weather for a city.'''
...     return f"18 {unit} in {city}"

A tool may be sync or async, may ask for approval (``@tool(requires_approval=True)``), may report
progress by accepting a ``progress`` keyword (an async callable taking a message), and may name a
``fallback`` whose result is used (as ``tool.degraded``) when the tool itself fails.

A plain ``def`` tool (and fallback) runs in a thread of its own, not on the event loop (ADR 0173):
one that blocks (``time.sleep``, a blocking HTTP client, disk) would otherwise stall every other
run and stream of the process and the renewal of its run's lease. ``@tool(on_loop=True)`` keeps
one on the loop's thread, for objects that must only be used from the thread that made them (a
``sqlite3`` connection opened at import, a GUI toolkit); such a tool must return quickly.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import json
import logging
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, overload

from pydantic import ConfigDict, ValidationError, create_model

from thoughtgate.errors import UsageError
from thoughtgate.providers.base import ToolSpec

__all__ = ["Tool", "ToolArgumentsError", "ToolRegistry", "load_tools", "tool"]

ProgressFn = Callable[[str], Awaitable[None]]

log = logging.getLogger("thoughtgate.tools")


class ToolArgumentsError(Exception):
    """The model's arguments do not match the tool's schema (reported back to the model)."""


@dataclass(frozen=True)
class Tool:
    """A registered tool; ``spec`` is what the model sees."""

    fn: Callable[..., Any]
    _: KW_ONLY
    name: str
    description: str
    parameters: Mapping[str, Any]
    requires_approval: bool = False
    fallback: Callable[..., Any] | None = None
    label: str = ""
    on_loop: bool = False
    _model: Any = field(default=None, repr=False)

    @property
    def spec(self) -> ToolSpec:
        return ToolSpec(self.name, self.description, self.parameters)

    def validate(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        try:
            model = self._model.model_validate(dict(arguments))
        except ValidationError as exc:
            raise ToolArgumentsError(str(exc)) from None
        return {k: getattr(model, k) for k in type(model).model_fields}

    async def call(self, arguments: Mapping[str, Any], progress: ProgressFn | None = None) -> str:
        kwargs = self.validate(arguments)
        if progress is not None and "progress" in inspect.signature(self.fn).parameters:
            kwargs["progress"] = progress
        return _as_text(await self._invoke(self.fn, kwargs))

    async def call_fallback(self, arguments: Mapping[str, Any]) -> str:
        assert self.fallback is not None
        return _as_text(await self._invoke(self.fallback, self.validate(arguments)))

    async def _invoke(self, fn: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
        if self.on_loop or inspect.iscoroutinefunction(fn):
            return await _maybe_await(fn(**kwargs))
        return await _maybe_await(await _in_thread(self.name, fn, kwargs))


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


async def _in_thread(name: str, fn: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    """``fn(**kwargs)`` in a daemon thread of its own, with the caller's context variables (as
    ``asyncio.to_thread`` copies them).

    Not the loop's default executor nor a pool (ADR 0173): a cancelled run cannot stop a thread,
    and a pool's workers are joined when the process exits -- ``asyncio.run`` waits for the
    default executor's, the interpreter for any other's -- so one tool blocked for good would
    keep ``thoughtgate run`` from exiting after Ctrl-C, or the daemon after its drain. A daemon
    thread is left behind instead: the run ends without it, and what it returns or raises after
    the caller stopped waiting is discarded and logged, never recorded. A thread per call costs
    tens of microseconds beside a model turn; how many run at once is bounded by the runs in
    flight and the calls of their turns, as it was on the loop."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Any] = loop.create_future()
    context = contextvars.copy_context()

    def settle(value: Any, error: BaseException | None) -> None:
        if done.cancelled():
            _discarded(name, error)
        elif error is not None:
            done.set_exception(error)
        else:
            done.set_result(value)

    def work() -> None:
        value: Any = None
        error: BaseException | None = None
        try:
            value = context.run(fn, **kwargs)
        except BaseException as exc:  # handed to the awaiting run, as the loop would raise it
            error = exc
        try:
            loop.call_soon_threadsafe(settle, value, error)
        except RuntimeError:  # the loop is closed: nobody waits any more
            _discarded(name, error)

    threading.Thread(target=work, name=f"thoughtgate-tool-{name}", daemon=True).start()
    return await done


def _discarded(name: str, error: BaseException | None) -> None:
    outcome = "succeeded" if error is None else f"failed ({type(error).__name__}: {error})"
    log.warning("tool %r %s after its call was cancelled; its result is discarded", name, outcome)


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, default=str, ensure_ascii=False)


def _build(
    fn: Callable[..., Any],
    *,
    name: str | None,
    description: str | None,
    requires_approval: bool,
    fallback: Callable[..., Any] | None,
    on_loop: bool,
) -> Tool:
    sig = inspect.signature(fn)
    hints = inspect.get_annotations(fn, eval_str=True)
    fields: dict[str, Any] = {}
    for pname, param in sig.parameters.items():
        if pname == "progress" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        annotation = hints.get(pname, Any)
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[pname] = (annotation, default)
    model = create_model(f"{fn.__name__}_args", __config__=ConfigDict(extra="forbid"), **fields)
    schema = model.model_json_schema()
    schema.pop("title", None)
    doc = inspect.getdoc(fn) or ""
    return Tool(
        fn,
        name=name or fn.__name__,
        description=description or doc.split("\n\n")[0] or fn.__name__,
        parameters=schema,
        requires_approval=requires_approval,
        fallback=fallback,
        label=(name or fn.__name__).replace("_", " "),
        on_loop=on_loop,
        _model=model,
    )


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...
@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    requires_approval: bool = False,
    fallback: Callable[..., Any] | None = None,
    on_loop: bool = False,
) -> Callable[[Callable[..., Any]], Tool]: ...
def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    requires_approval: bool = False,
    fallback: Callable[..., Any] | None = None,
    on_loop: bool = False,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Turn a typed function into a :class:`Tool` (usable bare or with options).

    ``on_loop``: run a plain ``def`` tool (and its fallback) on the event loop's thread rather
    than in a thread of its own -- for one that uses an object bound to the thread that made it;
    it then holds up everything else of the process while it runs (ADR 0173)."""

    def wrap(f: Callable[..., Any]) -> Tool:
        return _build(
            f,
            name=name,
            description=description,
            requires_approval=requires_approval,
            fallback=fallback,
            on_loop=on_loop,
        )

    return wrap(fn) if fn is not None else wrap


class ToolRegistry:
    """Tools by name, in registration order."""

    def __init__(self, tools: Iterable[Tool | Callable[..., Any]] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for item in tools:
            self.add(item)

    def add(self, item: Tool | Callable[..., Any]) -> Tool:
        t = item if isinstance(item, Tool) else tool(item)
        if t.name in self._tools:
            raise UsageError(f"two tools are named {t.name!r}")
        self._tools[t.name] = t
        return t

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    @property
    def specs(self) -> tuple[ToolSpec, ...]:
        return tuple(t.spec for t in self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def __iter__(self) -> Any:
        return iter(self._tools.values())


def load_tools(references: Iterable[str]) -> ToolRegistry:
    """Load ``module:attr`` references: a Tool, a function, or a list/registry of them."""
    import importlib

    registry = ToolRegistry()
    for ref in references:
        module_name, sep, attr = ref.partition(":")
        if not sep:
            raise UsageError(f"--tools {ref!r} must look like module:attr")
        try:
            target: Any = importlib.import_module(module_name)
            for part in attr.split("."):
                target = getattr(target, part)
        except (ImportError, AttributeError) as exc:
            raise UsageError(f"cannot load tools from {ref!r}: {exc}") from None
        items = target if isinstance(target, list | tuple | ToolRegistry) else [target]
        for item in items:
            if not callable(item) and not isinstance(item, Tool):
                raise UsageError(f"{ref!r} holds {item!r}, which is not a tool or a function")
            registry.add(item)
    return registry
