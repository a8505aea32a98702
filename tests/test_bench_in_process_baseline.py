"""``bench.daemon_bench``'s in-process baseline times its runs from a full collection of the bench
process's heap (ADR 0089): a full pass owed for what the process built before -- another kind's
imports, the HTTP client's objects -- is paid before the window, not charged to the runs in it."""

from __future__ import annotations

import gc
import importlib
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytestmark = pytest.mark.inprocess  # the bench's Runtime: its threads, in this process

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def daemon_bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(ROOT))  # bench/ is a package of the repository, not installed
    return importlib.import_module("bench.daemon_bench")


async def test_the_window_opens_right_after_a_full_collection(
    daemon_bench: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last collection before the window's first clock read is a full one, and nothing has
    been allocated toward the next since; the runs in the window are still measured."""
    collections: list[int] = []  # the generation of each collection that ended, in order
    at_reads: list[tuple[int, tuple[int, int, int]]] = []  # (collections so far, gc counts)

    def ended(phase: str, info: dict[str, Any]) -> None:
        if phase == "stop":
            collections.append(int(info["generation"]))

    real = time.process_time

    def process_time() -> float:
        at_reads.append((len(collections), gc.get_count()))
        return real()

    gc.callbacks.append(ended)
    monkeypatch.setattr(time, "process_time", process_time)
    try:
        per_delta = await daemon_bench._in_process(
            daemon_bench.FAKE_MODEL, "memory://", None, runs=4, concurrency=2
        )
    finally:
        gc.callbacks.remove(ended)
    assert per_delta > 0
    before, counts = at_reads[0]  # the window's start
    assert before > 0 and collections[before - 1] == 2, collections[max(0, before - 3) : before]
    assert counts[1:] == (0, 0), "a full pass leaves no older generation owed"
