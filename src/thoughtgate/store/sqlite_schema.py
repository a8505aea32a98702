"""Opening a SQLite file safely: recognise our own database, fall back to read-only, migrate.

Everything here is synchronous and runs on the store's writer thread. The order matters: we only
read until we know the file is ours, so a foreign file is never modified (not even its journal
mode), and every migration runs inside ``BEGIN IMMEDIATE`` so that several processes opening a new
file at the same time apply each version exactly once.
"""

from __future__ import annotations

import os
import sqlite3
import time
import urllib.parse
from collections.abc import Sequence
from pathlib import Path

from thoughtgate.errors import NotOurDatabaseError, StoreReadOnlyError, StoreUnavailableError
from thoughtgate.store.migrations import (
    MIGRATIONS_TABLE,
    Migration,
    load_migrations,
    pending_migrations,
)
from thoughtgate.store.private_files import require_private
from thoughtgate.store.sqlite_thread import in_write_transaction

__all__ = [
    "SIDE_FILES",
    "SQLITE_HEADER",
    "apply_migrations",
    "connect",
    "ensure_wal",
    "open_checked",
    "split_statements",
    "writable",
]

SQLITE_HEADER = b"SQLite format 3\x00"
SIDE_FILES = ("", "-wal", "-shm", "-journal")
"""The database file and the files SQLite keeps beside it: all hold data."""
_BUSY, _LOCKED, _CANTOPEN = 5, 6, 14


def connect(path: Path, *, busy_timeout: float, immutable: bool = False) -> sqlite3.Connection:
    """A connection in autocommit mode (we issue BEGIN/COMMIT ourselves).

    ``immutable`` opens a read-only snapshot without the WAL index: the only way to read a
    database whose directory is not writable (SQLite cannot create the ``-shm`` file there).
    """
    target = f"file:{urllib.parse.quote(str(path))}?immutable=1" if immutable else str(path)
    return sqlite3.connect(
        target,
        timeout=busy_timeout,
        isolation_level=None,
        check_same_thread=False,
        uri=immutable,
        # The writer's merged statements (ADR 0030, 0033) come in a power of two of rows per
        # statement, per set of columns: some tens of them stay prepared.
        cached_statements=256,
    )


def check_header(path: Path) -> None:
    """Refuse a non-empty file that does not start with the SQLite magic string, and a path that
    cannot hold one (a directory, a path through a file, one this user may not read) in one line
    naming it, rather than a traceback."""
    try:
        with path.open("rb") as fh:
            head = fh.read(len(SQLITE_HEADER))
    except FileNotFoundError:
        return
    except OSError as exc:
        if isinstance(exc, IsADirectoryError):
            inside = f"sqlite:///{path}/thoughtgate.db"
            why = f"it is a directory, not a file (name a file in it: {inside})"
        elif isinstance(exc, NotADirectoryError):
            why = "a part of its path is a file, not a directory"
        else:
            said = exc.strerror or type(exc).__name__
            why = f"{said}; check that it and its directory are readable"
        raise StoreUnavailableError(
            f"cannot open SQLite database {path}: {why}. Point the store at another path "
            "(store.url / --db / THOUGHTGATE_DB)."
        ) from None
    if head and head != SQLITE_HEADER:
        raise NotOurDatabaseError(
            f"{path} is not a SQLite database, so it is not a thoughtgate store; it was left "
            "untouched. Point the store at another path (store.url / --db / THOUGHTGATE_DB)."
        )


def user_tables(conn: sqlite3.Connection) -> set[str]:
    rows = conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite\\_%' "
        "ESCAPE '\\'"
    ).fetchall()
    return {str(r[0]) for r in rows}


def check_ours(path: Path, tables: set[str]) -> None:
    """An empty database is fine (we will create our tables); one with other tables is not ours."""
    if tables and MIGRATIONS_TABLE not in tables:
        shown = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
        raise NotOurDatabaseError(
            f"{path} is a SQLite database that thoughtgate did not create (it has tables {shown} "
            f"but no {MIGRATIONS_TABLE} table); it was left untouched. Point the store at another "
            "path (store.url / --db / THOUGHTGATE_DB)."
        )


def applied_versions(conn: sqlite3.Connection) -> set[int]:
    return {int(r[0]) for r in conn.execute(f"SELECT version FROM {MIGRATIONS_TABLE}")}


def split_statements(script: str) -> list[str]:
    """Split a migration into statements (``executescript`` would commit our transaction)."""
    statements: list[str] = []
    current = ""
    for line in script.splitlines(keepends=True):
        current += line
        if sqlite3.complete_statement(current):
            statements.append(current.strip())
            current = ""
    if current.strip() and not all(
        ln.strip().startswith("--") or not ln.strip() for ln in current.splitlines()
    ):
        statements.append(current.strip())
    return statements


def apply_migrations(
    conn: sqlite3.Connection, path: Path, known: Sequence[Migration]
) -> list[Migration]:
    """Apply what is missing in one ``BEGIN IMMEDIATE`` transaction; returns what was applied.

    Checks are repeated inside the transaction because another process may have created or
    migrated the file between our first look and taking the write lock.
    """

    def body(c: sqlite3.Connection) -> list[Migration]:
        tables = user_tables(c)
        check_ours(path, tables)
        if MIGRATIONS_TABLE not in tables:
            c.execute(
                f"CREATE TABLE {MIGRATIONS_TABLE} (version INTEGER PRIMARY KEY, "
                "name TEXT NOT NULL, applied_at REAL NOT NULL)"
            )
        todo = pending_migrations(applied_versions(c), known, where=f"SQLite database {path}")
        for migration in todo:
            for statement in split_statements(migration.sql):
                c.execute(statement)
            c.execute(
                f"INSERT INTO {MIGRATIONS_TABLE} (version, name, applied_at) VALUES (?, ?, ?)",
                (migration.version, migration.name, time.time()),
            )
        return todo

    return in_write_transaction(conn, body)


def ensure_wal(conn: sqlite3.Connection, *, busy_timeout: float) -> None:
    """Put the file in WAL mode, waiting up to ``busy_timeout`` for its write lock.

    The switch takes the write lock after a read, and SQLite answers such a lock wanted while
    another connection holds it with ``SQLITE_BUSY`` at once, without calling the busy handler
    (waiting could deadlock in general). Two processes opening a file that does not exist yet
    -- ``thoughtgate runs`` polling for a run, and the ``thoughtgate run`` about to record it --
    meet here: the one that found the other switching the file failed to open. So a busy
    switch is tried again, with the busy handler's pauses, as long as a lock wait may last;
    once the other has switched the file, it is in WAL mode and nothing is left to do.
    """
    deadline = time.monotonic() + busy_timeout
    pause = 0.001
    while True:
        try:
            mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
            if str(mode).lower() != "wal":
                conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            busy = (exc.sqlite_errorcode & 0xFF) in (_BUSY, _LOCKED)
            if not busy or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.1)


def open_checked(
    path: Path, *, busy_timeout: float, max_bytes: int | None = None
) -> tuple[sqlite3.Connection, bool]:
    """Open, verify and migrate the database; returns the connection and whether it had to be
    opened as an immutable snapshot (then the other connections must be too).

    Once the file is known to be ours, it and its side files are made private to their owner
    (``private_files.require_private``: tightened with a warning, or refused).

    Raises ``NotOurDatabaseError`` (foreign file, untouched), ``StoreError`` (newer schema, or
    open to other users and cannot be made private) or ``StoreReadOnlyError`` (needs creating or
    upgrading but cannot be written). sqlite3 errors are left to the caller's one translation
    point.
    """
    check_header(path)
    known = load_migrations("sqlite")
    conn = connect(path, busy_timeout=busy_timeout)
    immutable = False
    try:
        try:
            tables = user_tables(conn)
        except sqlite3.OperationalError as exc:
            # A WAL database in a read-only directory cannot be opened normally (SQLite needs to
            # create "-shm" beside it). Without a "-wal" file the main file holds every committed
            # transaction and nobody can write there either, so an immutable snapshot is exact.
            wal = Path(f"{path}-wal")
            if exc.sqlite_errorcode & 0xFF != _CANTOPEN or not path.exists() or wal.exists():
                raise
            conn.close()
            conn = connect(path, busy_timeout=busy_timeout, immutable=True)
            tables = user_tables(conn)
            immutable = True
        check_ours(path, tables)
        for suffix in SIDE_FILES:
            require_private(Path(f"{path}{suffix}"), "SQLite database")
        applied = applied_versions(conn) if MIGRATIONS_TABLE in tables else set()
        todo = pending_migrations(applied, known, where=f"SQLite database {path}")
        can_write = not immutable and writable(path)
        if todo:
            if not can_write:
                raise StoreReadOnlyError(
                    f"SQLite database {path} needs {'upgrading' if applied else 'creating'} "
                    f"to schema version {known[-1].version}, but it is read-only; nothing was "
                    "changed. Make the file and its directory writable, or use another path."
                )
            ensure_wal(conn, busy_timeout=busy_timeout)
            apply_migrations(conn, path, known)
        elif can_write:
            ensure_wal(conn, busy_timeout=busy_timeout)
        conn.execute("PRAGMA synchronous = FULL")
        if max_bytes is not None:
            page_size = int(conn.execute("PRAGMA page_size").fetchone()[0])
            conn.execute(f"PRAGMA max_page_count = {max(1, max_bytes // page_size)}")
    except BaseException:
        conn.close()
        raise
    return conn, immutable


def writable(path: Path) -> bool:
    """Best effort (root ignores permission bits); a failed write still maps to read-only."""
    file_ok = os.access(path, os.W_OK) if path.exists() else True
    return file_ok and os.access(path.parent, os.W_OK)
