"""``EventStore``: the one object a backend is, holding the store's three concerns.

* the event log (:class:`~thoughtgate.store.log.EventLog`): append, read, tail, finish a run,
  and the one observation point every committed batch passes;
* the run index (:class:`~thoughtgate.store.run_index.RunIndex`): run and task records, leases,
  the run list;
* the key store (:class:`~thoughtgate.store.key_store.KeyStore`): API keys and server secrets.

Backends: memory (tests), SQLite (the embedded default), PostgreSQL (scale-out); each implements
all three on one connection set, because a run's end writes the log and the index in one
transaction. Code depends on the concern it uses (ticket signing takes a ``KeyStore``, a recorder
an ``EventLog``); the facade is for what opens, closes or spans them. One conformance case per
concern (``tests/support/store_conformance.py``) runs on every backend.
"""

from __future__ import annotations

from thoughtgate.store.apart_backfill import MovesApart
from thoughtgate.store.key_store import KeyStore
from thoughtgate.store.log import (
    UNCLAIMED,
    EventLog,
    Holder,
    RunEnding,
    RunListener,
    RunWakeups,
)
from thoughtgate.store.run_index import OpenRun, OpenRuns, RunIndex

REFUSAL_HELD_S = 30.0
"""How long a refused write keeps a store reported as refusing writes when nothing is written
after it (ADR 0151). Under way, a refusal is followed by the next write within seconds (the
sweep's every ``lease * 2/3``, a client's retry), which either renews it or clears it; left
alone, the store is taken back after this long without a write of its own, and the next write
that fails renews it."""

__all__ = [
    "REFUSAL_HELD_S",
    "UNCLAIMED",
    "EventLog",
    "EventStore",
    "Holder",
    "KeyStore",
    "OpenRun",
    "OpenRuns",
    "RunEnding",
    "RunIndex",
    "RunListener",
    "RunWakeups",
]


class EventStore(EventLog, RunIndex, KeyStore, MovesApart):
    """A backend: the event log, the run index and the key store over one database (and the
    backfill of ADR 0167, which moves apart the reasoning of rows written before ADR 0160)."""

    def __init__(self) -> None:
        self.wakeups = RunWakeups()

    async def close(self) -> None:  # noqa: B027 (optional hook; the memory store has nothing to do)
        """Release connections; the store is unusable afterwards."""

    def write_refusal(self) -> str | None:
        """Why this store refuses writes now, as one short word (``store_removed``,
        ``store_refuses_writes``, ...), from what it knows without asking the database (its
        writes' last outcome, a ``stat`` of its file); ``None`` when, as far as it knows, it
        takes them. Cheap enough to ask once a second with every live stream open (ADR 0151).
        """
        return None

    async def check_writes(self, wait_s: float) -> str | None:
        """:meth:`write_refusal`, or what asking the database once without writing finds
        (PostgreSQL: a connection within ``wait_s`` and a read-only check); ``GET /readyz``
        asks it at most once a second (ADR 0151)."""
        return self.write_refusal()
