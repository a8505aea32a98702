"""Helpers for tests of live fan-out across PostgreSQL replicas: a tail kept in a list, a store
used from another process, and the run list's changes settled."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import thoughtgate.store

__all__ = ["changes_settled", "run_store_script", "tail_into"]

SRC = Path(thoughtgate.store.__file__).resolve().parents[2]


async def changes_settled(store: Any) -> None:
    """Until no committed run-list change of ``store`` (a ``PostgresStore``) waits above the
    horizon (ADR 0140): other tests' transactions in the same database hold it back a moment;
    other databases' (another test's) no longer, once learned as a reader learns them (ADR 0146)."""
    for _ in range(1000):
        async with store._conn("test") as conn:
            row = await store._horizon_read(conn, "since", {"after": 0})
        if not row[1]:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("committed run-list changes stayed above the horizon for 10 s")


def tail_into(store: Any, run_id: str, got: list[Any]) -> asyncio.Task[None]:
    """A task following the run's tail to its end, keeping every event in ``got``."""

    async def follow() -> None:
        async for event in store.tail(run_id):
            got.append(event)

    return asyncio.create_task(follow())


async def run_store_script(code: str, *args: str) -> None:
    """Run ``code`` in another Python process (with this checkout's ``src``) and require it to
    exit 0; ``args`` are its ``sys.argv[1:]``."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        code,
        *args,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(SRC)},
    )
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()
