"""User tools: typed Python functions whose JSON schema comes from their signature and docstring.

>>> @tool
... def get_weather(city: str, unit: str = "C") -> str:
...     '''Current weather for a city.'''
...     return f"18 {unit} in {city}"

A tool may be sync or async, may ask for approval (``@tool(requires_approval=True)``), may report
progress by accepting a ``progress`` keyword (an async callable taking a message), and may name a
``fallback`` whose result is used (as ``tool.degraded``) when the tool itself fails.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, overload

from pydantic import ConfigDict, ValidationError, create_model

from thoughtgate.errors import UsageError
from thoughtgate.providers.base import ToolSpec

__all__ = ["Tool", "ToolArgumentsError", "ToolRegistry", "load_tools", "tool"]

ProgressFn = Callable[[str], Awaitable[None]]


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
        return _as_text(await _maybe_await(self.fn(**kwargs)))

    async def call_fallback(self, arguments: Mapping[str, Any]) -> str:
        assert self.fallback is not None
        return _as_text(await _maybe_await(self.fallback(**self.validate(arguments))))


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


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
) -> Callable[[Callable[..., Any]], Tool]: ...
def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    requires_approval: bool = False,
    fallback: Callable[..., Any] | None = None,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Turn a typed function into a :class:`Tool` (usable bare or with options)."""

    def wrap(f: Callable[..., Any]) -> Tool:
        return _build(
            f,
            name=name,
            description=description,
            requires_approval=requires_approval,
            fallback=fallback,
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
