"""One process at a time sets up a PostgreSQL workflows schema (ADR 0062).

``DBOS.launch`` creates and migrates its system schema (``<schema>_workflows``) when it is missing
or behind: ``CREATE SCHEMA``, tables, functions, triggers and indexes, some of them
``CONCURRENTLY``, each in its own transaction. It serialises that work itself with a session
advisory lock -- but one key for the whole database, whatever the schema, which it waits for at
most 30 s before migrating *without* it. So when any process of the database (another
thoughtgate, another application on DBOS) holds that key for 30 s -- a ``CREATE INDEX
CONCURRENTLY`` waits for every older transaction of the database -- replicas starting together on
one fresh schema run the same DDL at once, and all but one may fail to start (``tuple concurrently
updated``, ``column ... already exists``).

So before launching DBOS, a process takes a session advisory lock of its own, keyed by the
workflows schema, on a connection of its own, and holds it until the launch returns: the replicas
of one schema set it up one after the other (the next finds it migrated and runs no DDL), while
processes on other schemas do not wait for them. The lock ends with the connection, so a process
that dies while holding it holds it no more. A waiting process asks again every few tenths of a
second (a wait inside one statement would deadlock with the holder's ``CREATE INDEX
CONCURRENTLY``), for a bounded time, then fails saying what it waited for.

A set-up can take minutes on a busy database (DBOS's 30 s wait for its lock, then each ``CREATE
INDEX CONCURRENTLY`` waiting for the database's older transactions), all of it inside
``DBOS.launch``, a blocking call on the event loop's thread: nothing else runs meanwhile, so a
thread says every :data:`SETUP_NOTE_S` what the process still waits for, rather than a daemon that
prints nothing between "Waiting for application startup" and its first request."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg

from thoughtgate.errors import RuntimeFailure
from thoughtgate.store.pg_errors import describe_target, translate_error

__all__ = ["SETUP_NOTE_S", "SETUP_WAIT_S", "setting_up", "setup_lock_key"]

log = logging.getLogger("thoughtgate.durable")

SETUP_WAIT_S = 300.0
"""How long a process waits for another one setting up the same workflows schema: a migration
that builds indexes ``CONCURRENTLY`` waits for the database's older transactions, so it may take
a while on a busy database; past this, something holds the lock that will not let it go."""


SETUP_NOTE_S = 10.0
"""How often a set-up under way says that it still is (a set-up with nothing to do takes well
under a second; a migration on an idle database a few seconds)."""


def setup_lock_key(schema: str) -> str:
    """The text whose ``hashtext`` keys the lock (the store's own migrations use another)."""
    return f"thoughtgate workflows setup {schema}"


@contextlib.asynccontextmanager
async def setting_up(
    conninfo: str, schema: str, *, wait_s: float = SETUP_WAIT_S
) -> AsyncIterator[None]:
    """Hold the setup lock of workflows schema ``schema`` for the duration of the block.

    ``pg_pool`` is imported here, not at the top: it needs ``psycopg_pool`` (the ``postgres``
    extra), and every durable run imports this module, on the core install's SQLite store too."""
    from thoughtgate.store.pg_pool import connect

    where = describe_target(conninfo, schema)
    action = "set up the durable runs' workflows"
    try:
        conn = await connect(conninfo, application_name="thoughtgate:workflows-setup")
    except psycopg.Error as exc:
        raise translate_error(exc, action, where, conninfo=conninfo) from exc
    async with conn:
        try:
            await _lock(conn, setup_lock_key(schema), where, wait_s)
        except psycopg.Error as exc:
            raise translate_error(exc, action, where, conninfo=conninfo) from exc
        with _saying_while_slow(where):
            yield  # the lock ends with the connection


@contextlib.contextmanager
def _saying_while_slow(where: str, every_s: float = SETUP_NOTE_S) -> Iterator[None]:
    """Log, from a thread, every ``every_s`` seconds the block lasts, that the set-up of
    ``where`` is still under way and what it may wait for: the block blocks the event loop."""
    done = threading.Event()
    started = time.monotonic()

    def note() -> None:
        while not done.wait(every_s):
            log.info(
                "still setting up the workflows of %s after %.0f s: DBOS waits up to 30 s for "
                "its database-wide migration lock (any DBOS application of this database may "
                "hold it), and each CREATE INDEX CONCURRENTLY for the database's older "
                "transactions",
                where,
                time.monotonic() - started,
            )

    noting = threading.Thread(target=note, name="thoughtgate-setup-progress", daemon=True)
    noting.start()
    try:
        yield
    finally:
        done.set()
        noting.join()


async def _lock(conn: psycopg.AsyncConnection[Any], key: str, where: str, wait_s: float) -> None:
    """Ask for the lock until it is granted (``poll_advisory_lock``: never inside a statement,
    whose snapshot the holder's ``CREATE INDEX CONCURRENTLY`` would wait for; DBOS waits for its
    own lock the same way), for ``wait_s`` at most."""
    from thoughtgate.store.pg_pool import poll_advisory_lock

    def waiting() -> None:
        log.info("waiting for another process setting up the workflows of %s", where)

    if not await poll_advisory_lock(conn, key, wait_s=wait_s, waiting=waiting):
        raise RuntimeFailure(
            f"another process has been setting up the workflows of {where} for {wait_s:g} s "
            "and has not finished; nothing was changed. Look for it in pg_stat_activity "
            "(application_name 'thoughtgate:workflows-setup', its query naming this schema, "
            "holds the lock; a long CREATE INDEX CONCURRENTLY waits for the database's older "
            "transactions), then start this process again."
        )
