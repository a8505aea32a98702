"""The daemon's garbage collector policy (ADR 0045): while serving, the young generation is
collected every ``server.gc_young_threshold`` net allocations instead of Python's 700, so a run's
short-lived objects die by reference counting before a pass walks them. What users rely on: the
setting is what the daemon serves with, and memory stays bounded -- reference cycles, which only
the collector frees, are still freed without anyone calling ``gc.collect()``."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from thoughtgate.config import Config
from thoughtgate.errors import ConfigError
from thoughtgate.server.gc_policy import daemon_gc

pytestmark = pytest.mark.unit


@pytest.fixture
def collector() -> Iterator[None]:
    """The test process's collector as it was: enabled, its thresholds, nothing frozen after."""
    enabled, threshold = gc.isenabled(), gc.get_threshold()
    gc.enable()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)
        if not enabled:
            gc.disable()


class _Run:
    """Stands for a run's state that refers to itself (a callback holding its owner, say)."""

    freed = 0

    def __init__(self) -> None:
        self.me = self

    def __del__(self) -> None:
        _Run.freed += 1


def test_the_daemon_serves_with_its_young_threshold_and_restores_the_processs(
    collector: None,
) -> None:
    before = gc.get_threshold()
    with daemon_gc(5_000):
        assert gc.get_threshold() == (5_000, *before[1:])
        assert gc.get_freeze_count() > 0  # the start-up heap is left out of every pass
    assert gc.get_threshold() == before


def test_the_default_threshold_is_above_pythons_and_validated() -> None:
    assert Config().server.gc_young_threshold == 10_000
    configured = Config.from_mapping({"server": {"gc_young_threshold": 50_000}})
    assert configured.server.gc_young_threshold == 50_000
    with pytest.raises(ConfigError, match="gc_young_threshold"):
        Config.from_mapping({"server": {"gc_young_threshold": 0}})  # 0 would mean never


def test_cycles_created_per_run_are_still_collected_under_the_default(collector: None) -> None:
    threshold = Config().server.gc_young_threshold
    runs = 10 * threshold
    _Run.freed = 0
    with daemon_gc(threshold):
        for _ in range(runs):
            _Run()  # unreachable at once, but only the collector can free it
        unfreed = runs - _Run.freed
    # Never more than a young generation's worth waits for its pass (plus a pass's stragglers).
    assert unfreed <= 2 * threshold
