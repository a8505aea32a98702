"""The daemon's policy for Python's cyclic garbage collector, decided here and nowhere else.

Two things make the interpreter's defaults a poor fit for a streaming daemon (ADR 0045):

* What exists once the daemon is built (modules, the app, the config) lives as long as the
  process, yet every full collection would walk it again: it is collected once and frozen.
* Each provider delta allocates a few short-lived dicts, lists and tuples that reference counting
  frees within the event; an in-flight run holds many more objects for its tens of milliseconds.
  With the default young threshold (700 net container allocations) the collector runs every few
  events, finds almost nothing, and promotes each run's working objects to the older generations,
  whose passes then walk every run in flight again. A threshold of ten thousand lets most of
  them die young, by reference counting, before any pass sees them: the collector's CPU at 100
  concurrent runs fell from ~80-90 to ~30-55 ms per phase.

A pass walks every live object of the generations it collects, garbage or not. When a thousand
SSE readers connect at once, the ~200 container objects each one holds (its coroutines, closures,
tasks; none of them in a reference cycle: they die by reference counting when it leaves) fill the
young generation twenty times over; each young pass promotes them, and with Python's middle ratio
of 10 every eleventh young pass walked all of them promoted so far: ~20-40 ms stalls of every
stream, two a burst (ADR 0166). So the middle generation is collected after ``MIDDLE_THRESHOLD``
(100) young passes instead of 10, and a full pass follows every second middle one
(``OLD_THRESHOLD`` 1 instead of 10), so that full passes still come after ~200 young passes (~2M
net allocations; Python's ratios: ~120).

Cycles are still collected: the young generation fills with the garbage that only the collector
can free, so a pass comes at most ``young_threshold`` net allocations later. A cycle still in use
at its young pass (a run's state while the run is in flight) waits for the next middle or full
pass, about a hundred young passes (~1M net allocations) later: at 100 concurrent runs the
daemon's live heap then grows by some 30,000 objects between middle passes and its RSS settles
~5 MB higher, and that pass, which frees them, takes ~40 ms instead of ~15 (ADR 0166). What that
holds back at a time is bounded by the thresholds, not by the daemon's age.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

__all__ = ["MIDDLE_THRESHOLD", "OLD_THRESHOLD", "daemon_gc"]

MIDDLE_THRESHOLD: Final = 100
"""Young passes between two passes of the middle generation while serving (Python's: 10)."""
OLD_THRESHOLD: Final = 1
"""Middle passes beyond which the next pass is a full one while serving (Python's: 10). Python's
own rule still holds a full pass back until the objects it would newly walk are a quarter of
those that survived the last one."""


@contextmanager
def daemon_gc(young_threshold: int) -> Iterator[None]:
    """While serving: the heap built so far collected and frozen, young collections every
    ``young_threshold`` net allocations (``server.gc_young_threshold``), middle ones every
    :data:`MIDDLE_THRESHOLD` young ones, full ones after :data:`OLD_THRESHOLD` middle ones. The
    process's previous thresholds come back afterwards, for a daemon served inside another
    program."""
    gc.collect()
    gc.freeze()
    previous = gc.get_threshold()
    gc.set_threshold(young_threshold, MIDDLE_THRESHOLD, OLD_THRESHOLD)
    try:
        yield
    finally:
        gc.set_threshold(*previous)
