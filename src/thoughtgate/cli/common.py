"""What every command shares: loading config and store, the reader's role, errors, output."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from thoughtgate.access.roles import Role, parse_role
from thoughtgate.cli.exit_codes import ExitCode
from thoughtgate.config import Config, load_config, resolve_store
from thoughtgate.errors import AccessDeniedError, RunNotFoundError, ThoughtgateError, UsageError
from thoughtgate.inert import inert_line, inert_text
from thoughtgate.store.base import EventStore
from thoughtgate.store.urls import open_store

__all__ = [
    "Context",
    "StdoutClosed",
    "console",
    "err_console",
    "inert_text",
    "one_line_errors",
    "print_json",
    "resolve_run_id",
    "run_async",
    "terminal_closed",
    "terminals",
]


class StdoutClosed(BrokenPipeError):
    """Whoever read standard output stopped reading (``thoughtgate events RUN | head -1``)."""


def _stdout_to_devnull() -> None:
    """What is still printed goes nowhere, the interpreter's last flush included."""
    with contextlib.suppress(OSError, ValueError):  # (a stdout without a file: a test runner's)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def terminals() -> list[int]:
    """The file descriptors of standard output and error that are a terminal now (asked before
    it hangs up: a hung-up terminal no longer answers ``isatty``)."""
    found = []
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # (no file: a test runner's)
            if stream.isatty():
                found.append(stream.fileno())
    return found


def terminal_closed(fds: list[int]) -> None:
    """The terminal hung up (SIGHUP): whatever is still printed to it would fail (``EIO``) while
    the run's end is recorded or printed, so ``fds`` (:func:`terminals`, asked before) go
    nowhere from now on. Only those: an output redirected to a file or a pipe still gets the
    run's panel or ``--json`` document (ADR 0165)."""
    for fd in fds:
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, fd)
            os.close(devnull)


class _Console(Console):
    def on_broken_pipe(self) -> None:
        """Rich raises ``SystemExit`` here, which leaves asyncio's loop from whichever task
        printed (a live run's follower) and is reported as a traceback ("Task exception was
        never retrieved"). An ordinary exception ends the command through ``one_line_errors``
        instead: quietly, exit 1, after what it was doing (a run) has ended as it would."""
        self.quiet = True
        _stdout_to_devnull()
        raise StdoutClosed


console: Console = _Console()
err_console = Console(stderr=True)
T = TypeVar("T")


def print_json(value: Any) -> None:
    """Machine output: one JSON document on stdout, nothing else."""
    try:
        sys.stdout.write(json.dumps(value, ensure_ascii=False, default=str) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        _stdout_to_devnull()
        raise StdoutClosed from None


async def _sharing_clients(coro: Coroutine[Any, Any, T]) -> T:
    """The command's provider connections are shared by all its runs and closed at its end."""
    from thoughtgate.providers.clients import shared_clients  # httpx only when a command runs

    async with shared_clients().lease():
        return await coro


def run_async(
    coro: Coroutine[Any, Any, T],
    *,
    runner: Callable[[Coroutine[Any, Any, T]], T] = asyncio.run,
) -> T:
    """Run a command body (with ``runner``: ``asyncio.run`` unless the command picks another
    event loop); a ThoughtgateError becomes one clear line and a non-zero exit."""
    with one_line_errors():
        return runner(_sharing_clients(coro))


@contextlib.contextmanager
def one_line_errors() -> Iterator[None]:
    """A ThoughtgateError raised inside becomes one clear line on stderr (one line per problem,
    when it names several) and its exit code (``UsageError``: 2, else 1); Ctrl-C exits 130. For
    command code outside ``run_async`` too, e.g. checking options before anything is opened."""
    try:
        yield
    except ThoughtgateError as exc:
        # The message is plain text: brackets in it ("thoughtgate[mcp]") are not markup. One
        # line, never wrapped at the terminal's width: a path, URL or run id broken by a newline
        # cannot be copied, nor found by a script reading stderr.
        # Several problems found at once (a config file's) are one line each. An error may quote
        # words another program chose (a server at --url, a driver): their control characters are
        # shown, not obeyed (red team, ADR 0135).
        for line in str(exc).splitlines() or [""]:
            err_console.print(
                f"[bold red]error:[/] {escape(inert_line(line))}",
                highlight=False,
                markup=True,
                soft_wrap=True,
            )
        code = ExitCode.USAGE if isinstance(exc, UsageError) else ExitCode.FAILED
        raise typer.Exit(code) from None
    except StdoutClosed:  # nobody reads what is left to print: nothing to say either
        raise typer.Exit(ExitCode.FAILED) from None
    except KeyboardInterrupt:
        err_console.print("interrupted")
        raise typer.Exit(ExitCode.INTERRUPTED) from None


async def resolve_run_id(store: EventStore, given: str) -> str:
    """A full run id from what was typed: the id itself, or any unique start of it, with or
    without the ``run_`` prefix (``git``-style short ids)."""
    given = given.strip()
    prefix = given if given.startswith("run_") else f"run_{given}"
    found = await store.find_run_ids(prefix, limit=6)
    if given in found or len(found) == 1:
        return given if given in found else found[0]
    if not found:
        raise RunNotFoundError(given)
    shown = ", ".join(found[:5]) + (", …" if len(found) > 5 else "")
    raise UsageError(f"{given!r} matches several runs ({shown}); type more of the id")


class Context:
    """Config, store and effective role for one command invocation."""

    def __init__(self, *, config_path: str | None, db: str | None, view_as: str | None) -> None:
        self.config: Config = load_config(config_path)
        self.db_url = resolve_store(db, None, self.config.store.url)
        local = parse_role(self.config.access.local_role)
        role = parse_role(view_as) if view_as else local
        if role > local:
            raise AccessDeniedError(
                f"--view-as {role.label} is above your local role {local.label}; "
                "it can only preview a lower role"
            )
        self.role: Role = role
        self._store: EventStore | None = None

    async def store(self) -> EventStore:
        if self._store is None:
            self._store = await open_store(self.db_url)
        return self._store

    async def close(self) -> None:
        if self._store is not None:
            await self._store.close()

    async def using(self, body: Callable[[EventStore], Awaitable[T]]) -> T:
        try:
            return await body(await self.store())
        finally:
            await self.close()
