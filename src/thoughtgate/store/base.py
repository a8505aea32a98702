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

__all__ = [
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


class EventStore(EventLog, RunIndex, KeyStore):
    """A backend: the event log, the run index and the key store over one database."""

    def __init__(self) -> None:
        self.wakeups = RunWakeups()

    async def close(self) -> None:  # noqa: B027 (optional hook; the memory store has nothing to do)
        """Release connections; the store is unusable afterwards."""
