"""A daemon keeps nothing per finished run in memory: users run it for weeks, and a structure that
grew with every run (a task, a reader, a run's state left in a dict) would make it slower and
larger with its history. ADR 0042 measured 4,000 runs against one daemon without a trend; this
guards what it found: after a warm-up, more finished runs leave the number of live objects of
each thoughtgate type, and of asyncio tasks, where it was."""

from __future__ import annotations

import asyncio
import collections
import gc
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.daemon import HAVE_SQLITE, Daemon, running_daemon, stream_all

pytestmark = pytest.mark.inprocess

WARM_UP = 10
RUNS = 40
"""Runs after the warm-up: a leak of one object per run shows as 40 more, the bound is half that
(a few objects come and go with the connections and caches of the moment)."""


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    if not HAVE_SQLITE:
        pytest.skip("needs the SQLite store")
    with running_daemon(sqlite_dir=tmp_path, shutdown_grace_s=0.1) as d:
        yield d


def finished_runs(daemon: Daemon, count: int) -> None:
    """``count`` runs, each started, streamed to its end by a reader and done."""
    for i in range(count):
        run_id = daemon.start_run({"prompt": f"hello {i}", "model": "fake:echo"})
        response, _ = stream_all(daemon, run_id, "developer")
        assert response.status_code == 200
        assert daemon.wait_done(run_id)["status"] == "completed"


def live_objects() -> collections.Counter[str]:
    """Live objects per type, for thoughtgate's own types and asyncio's tasks (after a full
    collection: only what something still holds). Not every type: the standard library's
    bounded caches (``urlsplit``'s 128 entries) fill up with each run's URLs on their way to
    their bound, which 40 runs do not reach."""
    gc.collect()
    counts: collections.Counter[str] = collections.Counter()
    for kind in map(type, gc.get_objects()):
        module = kind.__dict__.get("__module__")  # a C type's may be a descriptor, not a str
        if issubclass(kind, asyncio.Task):
            counts["asyncio.Task"] += 1
        elif isinstance(module, str) and module.startswith("thoughtgate"):
            counts[f"{module}.{kind.__qualname__}"] += 1
    return counts


def test_finished_runs_leave_no_objects_behind(daemon: Daemon) -> None:
    finished_runs(daemon, WARM_UP)
    before = live_objects()
    finished_runs(daemon, RUNS)
    grown = live_objects()
    grown.subtract(before)
    kept = {kind: n for kind, n in grown.items() if n >= RUNS // 2}
    assert not kept, f"objects kept per finished run after {RUNS} runs: {kept}"
