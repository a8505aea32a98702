"""The command line: thin commands over the core API (``thoughtgate --help``)."""

from __future__ import annotations

import importlib
import inspect
from typing import Annotated

import typer

from thoughtgate import __version__, log_records
from thoughtgate.cli.usage_errors import OneLineUsageErrors

__all__ = ["app", "main"]

app = typer.Typer(
    name="thoughtgate",
    help="Run LLM agent work and govern who may see what the model thought.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=OneLineUsageErrors,
)

#: Each module has ``register(app)``; listed here so ``--help`` shows every command.
COMMAND_MODULES = (
    "thoughtgate.cli.runs",
    "thoughtgate.cli.demo",
    "thoughtgate.cli.mcp",
    "thoughtgate.cli.providers",
    "thoughtgate.cli.serve",
    "thoughtgate.cli.keys",
    "thoughtgate.cli.index_check",
    "thoughtgate.cli.store_maintenance",
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"thoughtgate {__version__}")
        raise typer.Exit


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            help="Print thoughtgate's version and exit.",
            is_eager=True,
            callback=_print_version,
        ),
    ] = False,
) -> None:
    """Run LLM agent work and govern who may see what the model thought."""


for _name in COMMAND_MODULES:
    importlib.import_module(_name).register(app)


def _one_line_summaries(typer_app: typer.Typer) -> None:
    """A command list shows each command's first docstring paragraph; Rich keeps the line breaks
    of its source, so a summary wrapped in the code came out broken mid-sentence. Each command
    without a ``short_help`` gets that paragraph on one line (the command's own ``--help`` is
    unchanged)."""
    for command in typer_app.registered_commands:
        doc = command.help or (command.callback.__doc__ if command.callback else None)
        if command.short_help is None and doc:
            command.short_help = " ".join(inspect.cleandoc(doc).split("\n\n")[0].split())
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            _one_line_summaries(group.typer_instance)


_one_line_summaries(app)


def main() -> None:
    # whatever a command logs (a store's or provider's failure, a traceback) shows exceptions
    # by class and code, never their text: its reader may not be a developer (ADR 0104)
    log_records.install()
    app()
