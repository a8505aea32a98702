"""Whether the daemon can take runs now: what ``GET /readyz`` answers (ADR 0151).

``/healthz`` is liveness: the process answers, nothing is read. Readiness asks the store whether
it takes writes, as cheaply as it can: what it knows without asking the database each time (its
writes' last outcome, a ``stat`` of a SQLite file), else one check that writes nothing (a
PostgreSQL connection and a read-only query). That check is made at most once every
``every_s`` whatever the number of callers, and waits at most ``wait_s``: a probe answered every
second by a load balancer and an orchestrator costs the store one round trip a second, and a
store that hangs makes the probe answer "unready" in bounded time rather than hang with it.
"""

from __future__ import annotations

import asyncio

from thoughtgate.store.base import EventStore

__all__ = ["SHUTTING_DOWN", "Readiness"]

SHUTTING_DOWN = "shutting_down"
"""The reason once a shutdown began: the daemon starts no new runs (``RunManager.closing``)."""


class Readiness:
    """The store's answer to "do you take writes?", shared by every ``/readyz`` caller."""

    def __init__(self, store: EventStore, *, every_s: float = 1.0, wait_s: float = 2.0) -> None:
        self.store = store
        self.every_s = every_s
        self.wait_s = wait_s
        self._checked_at: float | None = None
        self._found: str | None = None
        self._checking: asyncio.Future[str | None] | None = None

    async def refusal(self) -> str | None:
        """Why the store refuses writes now (one word), or ``None``. What the store knows
        without asking is taken every time; the check that asks the database is shared by
        concurrent callers and reused for ``every_s``."""
        known = self.store.write_refusal()
        if known is not None:
            return known
        loop = asyncio.get_running_loop()
        checking = self._checking
        if checking is None:
            at = self._checked_at
            if at is not None and loop.time() - at < self.every_s:
                return self._found
            checking = self._checking = asyncio.ensure_future(self._check())
        # shielded: a caller that goes away does not cancel the others' answer
        return await asyncio.shield(checking)

    async def _check(self) -> str | None:
        try:
            found = await self.store.check_writes(self.wait_s)
        except Exception:  # a check that fails says what a failing write would
            found = "store_unavailable"
        finally:
            self._checking = None
        self._found = found
        self._checked_at = asyncio.get_running_loop().time()
        return found
