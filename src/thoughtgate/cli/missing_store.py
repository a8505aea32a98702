"""A store that does not exist, seen by a command that must not create it.

Opening a SQLite store creates its file and directories; opening a PostgreSQL one creates its
schema and tables. That is right for the commands whose job is to record (``run``, ``demo``,
``serve``, ``mcp``, ``keys create``), and wrong for the others: a mistyped ``--db`` would leave
a stray empty database behind and answer as if a real, empty store were there. So the reads
(``runs``, ``status``, ``events``, ``trace``, ``check-index``, ``keys list``) and the commands
that act on something already recorded (``resume``, ``keys revoke``) look first, and say where
they looked:

* a listing lists nothing and notes the path on stderr (:func:`note_no_store`): an empty answer
  is true, and a script reading stdout gets the same shape as for an empty store;
* a command given a run or a key fails with :func:`nothing_there`, a usage error (exit 2, the
  code of an unknown run or key) naming the path.

A PostgreSQL store is missing when its schema does not exist or holds no table at all
(:func:`missing_store`); it is named by database, host, port and schema, never its password.
A schema holding someone else's tables is not missing: opening it says it is not ours.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from thoughtgate.cli.common import err_console
from thoughtgate.errors import UsageError
from thoughtgate.store.urls import sqlite_path

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["missing_local_store", "missing_store", "note_no_store", "nothing_there"]


def missing_local_store(url: str) -> Path | None:
    """The path of a SQLite store ``url`` names that does not exist yet, else None (the file is
    there, or the store is not a local file: memory, PostgreSQL, ``sqlite:///:memory:``)."""
    if not url.startswith("sqlite:"):
        return None
    path = sqlite_path(url)
    return None if str(path) == ":memory:" or path.exists() else path


async def missing_store(url: str) -> str | None:
    """Where the store ``url`` names, when opening it would create it (a SQLite file that is not
    there, a PostgreSQL schema that does not exist or is empty), else None. Creates nothing."""
    if url.startswith(("postgresql:", "postgres:")):
        try:
            from thoughtgate.store.postgres import missing_schema
        except ImportError:  # opening says which extra to install
            return None
        return await missing_schema(url)
    path = missing_local_store(url)
    return None if path is None else str(path)


def nothing_there(where: str | Path, what: str) -> UsageError:
    """The error for ``what`` ("run 'run_ab'") asked of the missing store at ``where``."""
    return UsageError(
        f"no thoughtgate store at {where}: {what} not found there "
        "(check --db, THOUGHTGATE_DB or store.url)"
    )


def note_no_store(where: str | Path) -> None:
    """Say on stderr why a listing of the missing store at ``where`` is empty."""
    err_console.print(
        f"no thoughtgate store at {where} yet: nothing has been recorded there",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )
