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

Cycles are still collected: the young generation fills with the garbage that only the collector
can free, so a pass comes at most ``young_threshold`` net allocations later; what that holds back
at a time is bounded by the threshold, not by the daemon's age. The older generations keep
Python's ratios, so full passes come after about a hundred young ones (~1M net allocations).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["daemon_gc"]


@contextmanager
def daemon_gc(young_threshold: int) -> Iterator[None]:
    """While serving: the heap built so far collected and frozen, young collections every
    ``young_threshold`` net allocations (``server.gc_young_threshold``; the older generations'
    ratios unchanged). The process's previous thresholds come back afterwards, for a daemon
    served inside another program."""
    gc.collect()
    gc.freeze()
    previous = gc.get_threshold()
    gc.set_threshold(young_threshold, *previous[1:])
    try:
        yield
    finally:
        gc.set_threshold(*previous)
