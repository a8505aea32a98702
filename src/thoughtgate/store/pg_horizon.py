"""Telling the operator when a transaction holds PostgreSQL's run lists still (ADR 0140, 0146).

Run-list changes are read below the snapshot's horizon: the oldest transaction id still running
in this database (other databases' transactions are passed over once learned, ADR 0146). Any
session of this database -- another application's included -- left idle in a transaction after a
write holds every live run list of the store until it ends. Nothing is lost (the lists catch up at
once then), but from the outside it looks like a daemon that stopped listing runs. The readers
already notice the case (committed changes waiting above the horizon, and the id holding it);
this turns a long one into one warning that names the session holding it, and one line when it
lets go, so the operator is not left to guess.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import psycopg

__all__ = ["HorizonWatch"]

log = logging.getLogger("thoughtgate.store")

_HOLDER = (
    "SELECT a.pid, coalesce(nullif(a.application_name, ''), '(none)'), "
    "coalesce(a.state, '(hidden)'), extract(epoch FROM now() - a.xact_start) "
    "FROM pg_locks AS l JOIN pg_stat_activity AS a USING (pid) "
    "WHERE l.locktype = 'transactionid' AND l.mode = 'ExclusiveLock' AND l.granted "
    "AND l.transactionid::text::bigint = %(xid)s"
)
"""The session whose transaction holds the horizon (``pg_locks`` names every transaction's pid
to any role; ``state`` and ``xact_start`` of another role's session need ``pg_read_all_stats``)."""
_PREPARED = (
    "SELECT gid, extract(epoch FROM now() - prepared) FROM pg_prepared_xacts "
    "WHERE transaction::text::bigint = %(xid)s"
)


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

    async def warn(self, conn: psycopg.AsyncConnection[Any], holder: int) -> None:
        """Log the warning, naming the session or prepared transaction whose transaction id,
        ``holder`` (64-bit), holds the horizon."""
        held = 0.0 if self._since is None else time.monotonic() - self._since
        params = {"xid": holder % (1 << 32)}
        row = await (await conn.execute(_HOLDER, params)).fetchone()
        prepared = None if row else await (await conn.execute(_PREPARED, params)).fetchone()
        if row is not None:
            pid, application, state, age = row
            who = (
                f"session pid {pid} (application {application}, {state}, "
                f"in its transaction for {float(age or 0):.0f}s)"
            )
        elif prepared is not None:
            who = (
                f"prepared transaction {prepared[0]!r} (prepared {float(prepared[1]):.0f}s ago; "
                "COMMIT PREPARED or ROLLBACK PREPARED ends it)"
            )
        else:
            who = f"transaction {holder}, which had just ended or could not be placed"
        log.warning(
            "PostgreSQL run lists have waited %.1fs for an older transaction to end: %s. Live run "
            "lists of this database show no new changes until it ends (nothing is lost; they "
            "catch up then). idle_in_transaction_session_timeout bounds such waits.",
            held,
            who,
        )
