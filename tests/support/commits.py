"""Holding a SQLite store's admission commits, and waiting for a run manager to go idle: what the
tests of where a daemon's run starts (ADR 0040, 0091) share."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Iterator
from typing import Any

from thoughtgate.server.manager import RunManager
from thoughtgate.store import sqlite_thread

__all__ = ["admitting", "held_admission_commits", "idle"]


def admitting(done: list[Any]) -> bool:
    """Whether a group's outcomes hold a run's admission."""
    return any(o.job.action.startswith("create run") for o in done)


def held_admission_commits(monkeypatch: Any) -> Iterator[threading.Event]:
    """(For a fixture.) The writer thread's ``COMMIT`` of a group holding an admission waits for
    the event yielded (``holding`` is set once one waits)."""
    go = threading.Event()
    go.holding = threading.Event()  # type: ignore[attr-defined]
    commit = sqlite_thread.SQLiteThread._commit

    def held(self: Any, conn: sqlite3.Connection, failed: list[Any], done: list[Any]) -> Any:
        if admitting(done):
            go.holding.set()  # type: ignore[attr-defined]
            go.wait(30)
        return commit(self, conn, failed, done)

    monkeypatch.setattr(sqlite_thread.SQLiteThread, "_commit", held)
    try:
        yield go
    finally:
        go.set()


async def idle(manager: RunManager) -> None:
    """Until no execution is left in ``manager``."""
    for _ in range(1000):
        if manager.active == 0:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{manager.active} executions never ended")
