"""Options several commands share, each with its help text and a metavar that says what to type."""

from __future__ import annotations

from typing import Annotated

import typer

__all__ = [
    "ApiKeyOpt",
    "ApproveAllOpt",
    "BaseUrlOpt",
    "ConfigOpt",
    "DbOpt",
    "JsonOpt",
    "KeyOpt",
    "RunIdArg",
    "ToolsOpt",
    "UrlOpt",
    "ViewAsOpt",
]

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
        help="Preview what a lower role sees: viewer | member | developer | admin.",
    ),
]
JsonOpt = Annotated[
    bool, typer.Option("--json", help="Print one JSON document on stdout, nothing else.")
]
RunIdArg = Annotated[
    str,
    typer.Argument(
        metavar="RUN_ID",
        help="The run's id, or any unique start of it (with or without 'run_').",
        show_default=False,
    ),
]
UrlOpt = Annotated[
    str | None,
    typer.Option(
        "--url",
        metavar="URL",
        envvar="THOUGHTGATE_URL",
        show_envvar=True,
        help="Talk to this daemon (thoughtgate serve) instead of the local store; "
        "what you see is what --key's role may see.",
    ),
]
KeyOpt = Annotated[
    str | None,
    typer.Option(
        "--key",
        metavar="KEY",
        envvar="THOUGHTGATE_KEY",
        show_envvar=True,
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
    typer.Option("--approve-all", help="Approve every tool call that asks for approval."),
]
