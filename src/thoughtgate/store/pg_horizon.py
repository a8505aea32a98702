"""Telling the operator when a foreign transaction holds PostgreSQL's run lists still (ADR 0140).

Run-list changes are read below the snapshot's horizon: the oldest transaction id still running in
the whole cluster. Any session -- another application's included -- left idle in a transaction
after a write holds every live run list of that server until it ends. Nothing is lost (the lists
catch up at once then), but from the outside it looks like a daemon that stopped listing runs.
The readers already notice the case (committed changes waiting above the horizon); this turns a
long one into one warning that names the session holding it, and one line when it lets go, so the
operator is not left to guess.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import psycopg

__all__ = ["HorizonWatch"]

log = logging.getLogger("thoughtgate.store")

_OLDEST_WRITER = (
    "SELECT pid, coalesce(nullif(application_name, ''), '(none)'), coalesce(state, '(hidden)'), "
    "extract(epoch FROM now() - xact_start) FROM pg_stat_activity "
    "WHERE backend_xid IS NOT NULL ORDER BY age(backend_xid) DESC LIMIT 1"
)
"""The session with the oldest transaction id this role can see (other roles' sessions show
no ``backend_xid`` without ``pg_read_all_stats``)."""


class HorizonWatch:
    """How long committed run-list changes have waited behind an older transaction, with one
    warning per hold once it has lasted ``warn_after`` seconds."""

    #: Long enough that an ordinary write transaction (milliseconds) never trips it, short
    #: enough that an operator watching an empty run list finds the reason in the log.
    warn_after: float = 10.0

    def __init__(self) -> None:
        self._since: float | None = None
        self._warned = False

    def due(self) -> bool:
        """A reader found changes held back: whether this is the moment to warn (once a hold)."""
        now = time.monotonic()
        if self._since is None:
            self._since = now
        if self._warned or now - self._since < self.warn_after:
            return False
        self._warned = True
        return True

    def moved(self) -> None:
        """A reader found nothing held back: the hold, if any, is over."""
        if self._warned and self._since is not None:
            log.info(
                "PostgreSQL run lists moving again after %.1fs held behind an older transaction",
                time.monotonic() - self._since,
            )
        self._since = None
        self._warned = False

    async def warn(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Log the warning, naming the oldest writer this role can see."""
        held = 0.0 if self._since is None else time.monotonic() - self._since
        row = await (await conn.execute(_OLDEST_WRITER)).fetchone()
        if row is None:
            who = (
                "a transaction this role cannot see (another role's session; grant "
                "pg_read_all_stats to name it) or a prepared transaction (pg_prepared_xacts)"
            )
        else:
            pid, application, state, age = row
            who = (
                f"session pid {pid} (application {application}, {state}, "
                f"in its transaction for {float(age or 0):.0f}s)"
            )
        log.warning(
            "PostgreSQL run lists have waited %.1fs for an older transaction to end: %s. Live "
            "run lists on this server show no new changes until it ends (nothing is lost; "
            "they catch up then). idle_in_transaction_session_timeout bounds such waits.",
            held,
            who,
        )
