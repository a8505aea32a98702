"""Throwaway PostgreSQL schemas and databases that record the process owning them, and the sweep
that drops those whose owner is gone (ADR 0134; the tests' schemas since the fixtures of
``tests/support/pg.py``).

A name made here is ``tg_<kind>_o<owner>_<random>[_<label>]``: ``kind`` is ``test`` (the test
suite) or ``bench`` (``bench/``), ``owner`` the process's tag, ``label`` what the user adds
(``_workflows`` for DBOS's schema beside a store's, a bench's own word). An owner is alive while
its *keeper* is: a connection the process opens before it names anything and holds until it exits,
its ``application_name`` ``tg_<kind>_owner:<owner>``. A process killed mid-run (Ctrl-C twice, a
timeout, an OOM kill) cannot drop what it made, but its keeper ends with it (the server sees the
socket close), so the first name made by every later test or bench process sweeps them
(:func:`sweep_abandoned`): a schema or a database is dropped only when no session of the server is
its owner's keeper. A live process's (another xdist worker, a bench running beside the tests, a run
on another machine using the same server) and anything named otherwise are left alone.

``bench/`` holds this module because the bench cannot import the tests' support code, while the
tests load ``bench/`` modules already (``tests/support/bench_modules.py``).
"""

from __future__ import annotations

import atexit
import os
import re
import secrets
import threading
import uuid
from typing import Any, Literal

__all__ = ["KEEPER_PREFIXES", "Owner", "owner_of", "sweep_abandoned"]

Kind = Literal["test", "bench"]
KEEPER_PREFIXES: dict[str, str] = {"test": "tg_test_owner:", "bench": "tg_bench_owner:"}
"""The ``application_name`` of an owner's keeper, before the owner's tag, by kind."""
_OWNED: re.Pattern[str] = re.compile(r"tg_(?:test|bench)_o([0-9a-z]+)_[0-9a-f]{8}(?:_[a-z_]+)?")
"""A name :meth:`Owner.name` made: the owner's tag is group 1."""


def owner_of(name: str) -> str | None:
    """The tag of the process that owns the schema or database ``name``; ``None`` when its name
    records none (named before owners were recorded, or not by the tests or the bench)."""
    found = _OWNED.fullmatch(name)
    return found.group(1) if found else None


class Owner:
    """This process, as the owner of the names it makes on one server (one per kind and URL)."""

    def __init__(self, url: str, kind: Kind) -> None:
        self.url = url
        self.kind = kind
        self._lock = threading.Lock()
        self._keeper: Any = None
        self._tag = ""

    def tag(self) -> str:
        """This process's tag, its keeper opened (and the abandoned names swept) the first
        time."""
        import psycopg

        with self._lock:
            if self._keeper is None or self._keeper.closed:
                tag = f"{os.getpid()}r{secrets.token_hex(3)}"
                keeper = psycopg.connect(
                    self.url,
                    autocommit=True,
                    connect_timeout=5,
                    application_name=KEEPER_PREFIXES[self.kind] + tag,
                )
                self._keeper, self._tag = keeper, tag
                atexit.register(keeper.close)  # it would end with the process anyway
                sweep_abandoned(keeper)
            return self._tag

    def name(self, suffix: str = "") -> str:
        """A new schema or database name owned by this process (not created: whoever uses it
        creates it). ``suffix`` (lower case and ``_`` only, starting with ``_``) is kept at the
        end."""
        return f"tg_{self.kind}_o{self.tag()}_{uuid.uuid4().hex[:8]}{suffix}"


def sweep_abandoned(admin: Any) -> list[str]:
    """Drop every schema and database :meth:`Owner.name` made whose owner's keeper is gone, and
    return their names. ``admin``: an autocommit connection (``DROP DATABASE`` runs outside a
    transaction) to a database that is none of them.

    The names are listed before the live keepers: a name is made after its owner's keeper
    connected, so an owner alive when the names were listed is among the keepers. A schema still
    locked, or a database someone is still connected to (an orphaned daemon of its owner), is left
    for a later sweep rather than forced."""
    import psycopg
    from psycopg import sql

    schemas = [
        name
        for (name,) in admin.execute(
            "SELECT nspname FROM pg_namespace "
            "WHERE nspname LIKE 'tg\\_test\\_o%' OR nspname LIKE 'tg\\_bench\\_o%'"
        ).fetchall()
        if owner_of(name) is not None
    ]
    databases = [
        name
        for (name,) in admin.execute(
            "SELECT datname FROM pg_database "
            "WHERE datname LIKE 'tg\\_test\\_o%' OR datname LIKE 'tg\\_bench\\_o%'"
        ).fetchall()
        if owner_of(name) is not None
    ]
    live = set()
    for (name,) in admin.execute(
        "SELECT application_name FROM pg_stat_activity "
        "WHERE application_name LIKE %s OR application_name LIKE %s",
        tuple(prefix + "%" for prefix in KEEPER_PREFIXES.values()),
    ).fetchall():
        live.add(name.partition(":")[2])
    gone = []
    admin.execute("SET lock_timeout = '2s'")
    try:
        for name in schemas:
            if owner_of(name) in live:
                continue
            try:
                admin.execute(
                    sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name))
                )
            except psycopg.errors.LockNotAvailable:
                continue
            gone.append(name)
        for name in databases:
            if owner_of(name) in live:
                continue
            try:
                admin.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))
            except (psycopg.errors.ObjectInUse, psycopg.errors.LockNotAvailable):
                continue
            gone.append(name)
    finally:
        admin.execute("RESET lock_timeout")
    return gone
