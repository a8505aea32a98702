"""Options several commands share, each with its help text and a metavar that says what to type."""

from __future__ import annotations

import copy
import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import typer
from typer.core import TyperArgument, TyperCommand

__all__ = [
    "STORE_INT_MAX",
    "ApiKeyOpt",
    "ApproveAllOpt",
    "ArgumentsByName",
    "BaseUrlOpt",
    "ConfigOpt",
    "DbOpt",
    "JsonOpt",
    "KeyFromEnvironment",
    "KeyOpt",
    "LocalOnlyUrlOpt",
    "LocalOpt",
    "OptionSpec",
    "ReadOptions",
    "RunIdArg",
    "ToolsOpt",
    "UrlFromEnvironment",
    "UrlOpt",
    "ViewAsOpt",
    "a_run_id",
    "option_group",
    "with_read_options",
    "within_store_ints",
]

STORE_INT_MAX = 2**63 - 1
"""The largest ``--after`` or ``--limit``: what the stores' integers hold, as the daemon takes
(a larger one stopped SQLite with a traceback)."""


def within_store_ints(value: int | None) -> int | None:
    """An ``--after`` / ``--limit`` callback: refuses a value above :data:`STORE_INT_MAX`. The
    option declares only its ``min``, so ``--help`` reads ``[x>=1]``, not
    ``[1<=x<=9223372036854775807]``."""
    if value is not None and value > STORE_INT_MAX:
        raise typer.BadParameter(f"{value} is too large (at most {STORE_INT_MAX}).")
    return value


DbOpt = Annotated[
    str | None,
    typer.Option(
        "--db",
        metavar="URL",
        help="The store: sqlite:///PATH, postgresql://…, memory:// (default: THOUGHTGATE_DB, "
        "store.url, else a file in your user data directory).",
    ),
]
ConfigOpt = Annotated[
    str | None,
    typer.Option(
        "--config",
        metavar="PATH",
        help="thoughtgate.toml to use (default: THOUGHTGATE_CONFIG, else ./thoughtgate.toml).",
    ),
]
ViewAsOpt = Annotated[
    str | None,
    typer.Option(
        "--view-as",
        metavar="ROLE",
        help="Preview what a lower role sees: viewer | member | developer | admin (default: "
        "your local role, access.local_role).",
    ),
]
JsonOpt = Annotated[
    bool, typer.Option("--json", help="Print one JSON document on stdout, nothing else.")
]


def _shown_by_name(kind: Any) -> Any:
    """A copy of the param type ``kind`` with no metavar: Typer prints the type's metavar beside
    an argument's name in ``--help``, and ``<str>`` when the type has none."""
    named = copy.copy(kind)
    named.get_metavar = lambda *_args, **_kwargs: ""  # a falsy one: nothing shown
    return named


class ArgumentsByName(TyperCommand):
    """The ``cls`` of every command taking an argument: ``--help`` shows it by its metavar alone,
    ``status [OPTIONS] RUN_ID`` and ``RUN_ID  The run's id…``, where Typer writes
    ``{RUN_ID}`` and ``RUN_ID  <str>  The run's id…``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            if isinstance(param, TyperArgument) and param.metavar:
                param.type = _shown_by_name(param.type)

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            one = isinstance(param, TyperArgument) and param.required and param.nargs == 1
            if one and param.metavar:  # an optional one stays [NAME], as Typer writes it
                pieces.append(param.metavar)
            else:
                pieces.extend(param.get_usage_pieces(ctx))
        return pieces


RUN_ID_NEEDED = "give a run's id or a unique start of it (thoughtgate runs lists them)"


def a_run_id(value: str) -> str:
    """A ``RUN_ID`` argument's callback: an empty or blank one is a usage error (exit 2). As a
    prefix it started every run's id, and was answered "'' matches several runs"."""
    if not value.strip():
        raise typer.BadParameter(f"empty: {RUN_ID_NEEDED}")
    return value


RunIdArg = Annotated[
    str,
    typer.Argument(
        metavar="RUN_ID",
        callback=a_run_id,
        help="The run's id, or any unique start of it (with or without 'run_').",
        show_default=False,
    ),
]


class UrlFromEnvironment(str):
    """A daemon's address read from ``THOUGHTGATE_URL``, not given as ``--url``: a command with
    ``--local`` leaves it unused, where ``--url`` with ``--local`` is a contradiction (ADR 0162)."""

    __slots__ = ()


def _marking_the_environment(
    kind: type[str],
) -> Callable[[typer.Context, typer.CallbackParam, str | None], str | None]:
    """An option callback that returns a value read from its environment variable as ``kind``
    (a ``str`` subclass), so a command can tell it from one typed on the command line."""

    def callback(ctx: typer.Context, param: typer.CallbackParam, value: str | None) -> str | None:
        source = ctx.get_parameter_source(param.name or "")
        if value and source is not None and source.name == "ENVIRONMENT":
            return kind(value)
        return value

    return callback


_url_source = _marking_the_environment(UrlFromEnvironment)


UrlOpt = Annotated[
    str | None,
    typer.Option(
        "--url",
        metavar="URL",
        envvar="THOUGHTGATE_URL",
        show_envvar=True,
        callback=_url_source,
        help="Talk to this daemon (thoughtgate serve) instead of the local store; "
        "what you see is what --key's role may see.",
    ),
]
LocalOnlyUrlOpt = Annotated[
    str | None,
    typer.Option(
        "--url",
        metavar="URL",
        envvar="THOUGHTGATE_URL",
        hidden=True,
        callback=_url_source,
        help="Refused: this command works on the local store only.",
    ),
]
"""A command a daemon has no endpoint for reads ``THOUGHTGATE_URL`` only to refuse it (unless
``--local``): a user who exported a daemon's address must not act on the local store unawares
(ADR 0162)."""
LocalOpt = Annotated[
    bool,
    typer.Option(
        "--local",
        help="Use the local store (--db, THOUGHTGATE_DB or store.url) although THOUGHTGATE_URL "
        "is set.",
    ),
]


class KeyFromEnvironment(str):
    """A daemon key read from ``THOUGHTGATE_KEY``, not given as ``--key``: without a daemon's
    address it is not used (a note says so), where a ``--key`` without ``--url`` is refused."""

    __slots__ = ()


_key_source = _marking_the_environment(KeyFromEnvironment)


KeyOpt = Annotated[
    str | None,
    typer.Option(
        "--key",
        metavar="KEY",
        envvar="THOUGHTGATE_KEY",
        show_envvar=True,
        callback=_key_source,
        help="The daemon API key for --url (prefer the environment variable: a flag shows in "
        "the process list).",
    ),
]
BaseUrlOpt = Annotated[
    str | None,
    typer.Option(
        "--base-url",
        metavar="URL",
        help="The provider's base URL (beats ANTHROPIC_BASE_URL etc. and the config).",
    ),
]
ApiKeyOpt = Annotated[
    str | None,
    typer.Option(
        "--api-key",
        metavar="KEY",
        help="The provider's API key (beats ANTHROPIC_API_KEY etc. and the config).",
    ),
]
ToolsOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--tools", metavar="MODULE:ATTR", help="Python tools the model may call (repeatable)."
    ),
]
ApproveAllOpt = Annotated[
    bool,
    typer.Option(
        "--approve-all",
        help="Approve every tool call that asks for approval (else you are asked on a terminal; "
        "without one the call waits orchestration.approval_timeout_s and is not run).",
    ),
]


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """Where a command finds runs and how it shows them: the options every command that reads
    runs ends with, in this order (``with_read_options``)."""

    view_as: str | None
    db: str | None
    config: str | None
    json_out: bool
    url: str | None
    key: str | None


OptionSpec = tuple[str, object, object]
"""One option of a group: its parameter name, its ``Annotated`` type, its default."""


_READ_PARAMETERS: tuple[OptionSpec, ...] = (
    ("view_as", ViewAsOpt, None),
    ("db", DbOpt, None),
    ("config", ConfigOpt, None),
    ("json_out", JsonOpt, False),
    ("url", UrlOpt, None),
    ("key", KeyOpt, None),
)


def option_group(
    name: str, make: Callable[..., Any], options: tuple[OptionSpec, ...]
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """A decorator that gives a command the ``options`` in place of its keyword parameter
    ``name``, as typer sees parameters, and passes them to it as one ``name=make(**options)``:
    options several commands share are declared once, and ``--help`` lists them where the
    command declares the group."""

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        own = inspect.signature(command, eval_str=True)
        added = [
            inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=hint)
            for n, hint, default in options
        ]
        parameters: list[inspect.Parameter] = []
        for parameter in own.parameters.values():
            parameters.extend(added if parameter.name == name else [parameter])

        @functools.wraps(command)
        def wrapper(*args: Any, **kwargs: Any) -> None:
            group = make(**{n: kwargs.pop(n) for n, _, _ in options})
            command(*args, **{name: group}, **kwargs)

        signature = own.replace(parameters=parameters)
        wrapper.__signature__ = signature  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in signature.parameters.values()}
        return wrapper

    return decorate


with_read_options = option_group("read", ReadOptions, _READ_PARAMETERS)
"""Give a command the read options (``--view-as --db --config --json --url --key``) in place of
its last parameter, ``*, read: ReadOptions``: the commands that read runs declare them once,
here, and ``--help`` lists them last."""
