"""The command line: thin commands over the core API (``thoughtgate --help``)."""

from __future__ import annotations

import importlib

import typer

from thoughtgate import log_records
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
)

for _name in COMMAND_MODULES:
    importlib.import_module(_name).register(app)


def main() -> None:
    # whatever a command logs (a store's or provider's failure, a traceback) shows exceptions
    # by class and code, never their text: its reader may not be a developer (ADR 0104)
    log_records.install()
    app()
