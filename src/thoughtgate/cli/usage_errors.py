"""Typer's own usage errors as one line, like every other error of the CLI.

A missing argument, an unknown command or option, or a value out of range is found by Typer
before any thoughtgate code runs, and Typer prints it as a usage line, a hint and a boxed panel
on several lines. A script reading stderr, or a user copying the message, gets what
``one_line_errors`` gives thoughtgate's own errors instead: ``error: <what>`` on one line,
with where to read more, and exit code 2 (``ExitCode.USAGE``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import typer
from rich.markup import escape
from typer.core import TyperGroup

from thoughtgate.cli.common import err_console
from thoughtgate.cli.exit_codes import ExitCode

__all__ = ["OneLineUsageErrors"]


@contextlib.contextmanager
def _one_line() -> Iterator[None]:
    try:
        yield
    except typer.TyperException as exc:
        # With no arguments Typer prints the help itself and then raises: nothing to reword.
        if type(exc).__name__ == "NoArgsIsHelpError":
            raise
        ctx = getattr(exc, "ctx", None)
        where = f" (see {ctx.command_path} --help)" if ctx is not None else ""
        err_console.print(
            f"[bold red]error:[/] {escape(exc.format_message())}{escape(where)}",
            highlight=False,
            markup=True,
            soft_wrap=True,
        )
        usage = exc.exit_code == ExitCode.USAGE
        raise typer.Exit(ExitCode.USAGE if usage else ExitCode.FAILED) from None


class OneLineUsageErrors(TyperGroup):
    """The root command: what Typer finds wrong while parsing (here or in a subcommand, which
    the root's ``invoke`` parses) is printed by :func:`_one_line`."""

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: Any = None,
        **extra: Any,
    ) -> Any:
        with _one_line():
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: Any) -> Any:
        with _one_line():
            return super().invoke(ctx)
