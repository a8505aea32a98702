"""The daemon's garbage collector policy (ADR 0045): while serving, the young generation is
collected every ``server.gc_young_threshold`` net allocations instead of Python's 700, so a run's
short-lived objects die by reference counting before a pass walks them. What users rely on: the
setting is what the daemon serves with, and memory stays bounded -- reference cycles, which only
the collector frees, are still freed without anyone calling ``gc.collect()``. And (ADR 0166) a
burst of objects that stay alive a while, such as a thousand SSE readers connecting at once, is
walked by young passes only, not again and again by middle passes that stop every stream."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from thoughtgate.config import Config
from thoughtgate.errors import ConfigError
from thoughtgate.server.gc_policy import MIDDLE_THRESHOLD, OLD_THRESHOLD, daemon_gc

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
        assert gc.get_threshold() == (5_000, MIDDLE_THRESHOLD, OLD_THRESHOLD)
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


class _Passes:
    """The collector's passes per generation while counting (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.by_generation = [0, 0, 0]

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "stop":
            self.by_generation[info["generation"]] += 1

    def __enter__(self) -> _Passes:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


def test_a_burst_of_live_objects_is_walked_by_young_passes_only(collector: None) -> None:
    """Twenty young generations' worth of objects that are all alive until the burst ends (a
    thousand readers' connections, ~200 containers each): under Python's middle ratio every
    eleventh young pass would walk all of them promoted so far, a stall of every stream."""
    threshold = Config().server.gc_young_threshold
    with daemon_gc(threshold), _Passes() as passes:
        burst = [[] for _ in range(20 * threshold)]
        del burst  # freed by reference counting, as a reader that leaves is
    young, middle, full = passes.by_generation
    assert young + middle + full >= 19  # a pass per young generation's worth
    assert (middle, full) == (0, 0)  # each one the young generation's


def test_cycles_that_outlive_a_young_pass_are_still_collected(collector: None) -> None:
    """A cycle still in use when its young pass comes (a run's state while the run is in
    flight) waits for a middle pass; it still comes, after ``MIDDLE_THRESHOLD`` young ones."""
    threshold = Config().server.gc_young_threshold
    _Run.freed = 0
    with daemon_gc(threshold):
        in_flight = [_Run() for _ in range(threshold)]
        for _ in range(3):  # young passes while they are in use: they outlive them
            _ = [[] for _ in range(2 * threshold)]
        del in_flight  # the runs end; only the collector can free them
        assert _Run.freed == 0
        passes = 0
        while _Run.freed < threshold and passes < 3 * MIDDLE_THRESHOLD:
            # the daemon goes on allocating: a young pass each (the free lists' reuse is not
            # counted)
            _ = [[] for _ in range(2 * threshold)]
            passes += 1
    assert _Run.freed == threshold
