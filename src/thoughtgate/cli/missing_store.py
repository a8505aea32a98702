"""A local SQLite store that does not exist, seen by a command that must not create it.

Opening a SQLite store creates its file and directories. That is right for the commands whose
job is to record (``run``, ``demo``, ``serve``, ``mcp``, ``keys create``), and wrong for the
others: a mistyped ``--db`` would leave a stray empty database behind and answer as if a real,
empty store were there. So the reads (``runs``, ``status``, ``events``, ``trace``,
``keys list``) and the commands that act on something already recorded (``resume``,
``keys revoke``) look first, and say which path they looked at:

* a listing lists nothing and notes the path on stderr (:func:`note_no_store`): an empty answer
  is true, and a script reading stdout gets the same shape as for an empty store;
* a command given a run or a key fails with :func:`nothing_there`, a usage error (exit 2, the
  code of an unknown run or key) naming the path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from thoughtgate.cli.common import err_console
from thoughtgate.errors import UsageError
from thoughtgate.store.urls import sqlite_path

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["missing_local_store", "note_no_store", "nothing_there"]


def missing_local_store(url: str) -> Path | None:
    """The path of a SQLite store ``url`` names that does not exist yet, else None (the file is
    there, or the store is not a local file: memory, PostgreSQL, ``sqlite:///:memory:``)."""
    if not url.startswith("sqlite:"):
        return None
    path = sqlite_path(url)
    return None if str(path) == ":memory:" or path.exists() else path


def nothing_there(path: Path, what: str) -> UsageError:
    """The error for ``what`` ("run 'run_ab'") asked of the missing store at ``path``."""
    return UsageError(
        f"no thoughtgate store at {path}: {what} not found there "
        "(check --db, THOUGHTGATE_DB or store.url)"
    )


def note_no_store(path: Path) -> None:
    """Say on stderr why a listing of the missing store at ``path`` is empty."""
    err_console.print(
        f"no thoughtgate store at {path} yet: nothing has been recorded there",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )
