"""One SQLite connection on one dedicated thread; the one place sqlite3 errors become StoreErrors.

Why a dedicated thread per connection rather than ``asyncio.to_thread``: a ``sqlite3.Connection``
belongs to one thread at a time, and SQLite admits one writer per database anyway. Giving the
store's writer connection its own single thread makes in-process writers queue in FIFO order on
that thread instead of spinning on ``SQLITE_BUSY``, keeps the connection (and its prepared
statement cache) alive between calls, and cannot be starved by unrelated blocking work in the
loop's default executor. Reads use a second connection on a second thread: in WAL mode readers
never wait for the writer, so a replay does not queue behind appends.

Exception mapping (``translate_error``)::

    sqlite3.Error
    ├── SQLITE_FULL                 → StoreError "database or disk is full" (write rolled back)
    ├── SQLITE_READONLY*            → StoreReadOnlyError
    ├── SQLITE_NOTADB               → NotOurDatabaseError
    ├── SQLITE_BUSY / SQLITE_LOCKED → StoreUnavailableError (locked past the busy timeout)
    ├── SQLITE_CANTOPEN / PERM      → StoreUnavailableError
    └── anything else               → StoreError (corruption, I/O errors, constraint failures)
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from thoughtgate.errors import (
    NotOurDatabaseError,
    StoreError,
    StoreReadOnlyError,
    StoreUnavailableError,
)

__all__ = ["SQLiteThread", "in_write_transaction", "translate_error"]

T = TypeVar("T")

# Primary result codes (https://sqlite.org/rescode.html); extended codes keep them in the low byte.
_PERM, _BUSY, _LOCKED, _READONLY, _IOERR, _CORRUPT, _FULL, _CANTOPEN, _NOTADB = (
    3,
    5,
    6,
    8,
    10,
    11,
    13,
    14,
    26,
)


def translate_error(
    exc: sqlite3.Error, path: Path | str, action: str, *, busy_timeout: float = 0.0
) -> StoreError:
    """Map a driver error into the thoughtgate tree; the message names the database and action."""
    code = getattr(exc, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    where = f"SQLite database {path}"
    if primary == _FULL:
        return StoreError(
            f"cannot {action}: database or disk is full ({where}); the write was rolled back and "
            "nothing of it was stored"
        )
    if primary == _READONLY:
        return StoreReadOnlyError(
            f"cannot {action}: {where} is read-only (the file or its directory is not writable); "
            f"nothing recorded was changed and it can still be read ({exc})"
        )
    if primary == _NOTADB:
        return NotOurDatabaseError(
            f"{where} is not a SQLite database ({exc}); it was left untouched"
        )
    if primary in (_BUSY, _LOCKED):
        return StoreUnavailableError(
            f"cannot {action}: {where} stayed locked by another connection for more than "
            f"{busy_timeout:g}s ({exc})"
        )
    if primary in (_CANTOPEN, _PERM):
        return StoreUnavailableError(
            f"cannot {action}: cannot open {where} ({exc}); check that the file and its directory "
            "exist and are readable and writable"
        )
    if primary == _CORRUPT:
        return StoreError(f"cannot {action}: {where} is corrupt ({exc})")
    if primary == _IOERR:
        return StoreError(f"cannot {action}: I/O error on {where} ({exc})")
    return StoreError(f"cannot {action}: {exc} ({where})")


def in_write_transaction(conn: sqlite3.Connection, body: Callable[[sqlite3.Connection], T]) -> T:
    """Run ``body`` in ``BEGIN IMMEDIATE`` … ``COMMIT``: all of it is stored, or none of it.

    ``IMMEDIATE`` takes the database's write lock before the first read, so a value read inside
    (the run's last sequence number) cannot change before we commit, even with writers in other
    processes; waiting for that lock is bounded by the connection's busy timeout.
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = body(conn)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            # The original error is the one worth reporting; SQLite discards the txn anyway.
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        raise
    return result


class SQLiteThread:
    """Owns one connection; ``call`` runs a function with it on the owning thread."""

    def __init__(self, name: str, path: Path | str, *, busy_timeout: float) -> None:
        self.path = path
        self.busy_timeout = busy_timeout
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._conn: sqlite3.Connection | None = None
        self._closed = False

    async def start(self, connect: Callable[[], sqlite3.Connection], action: str) -> None:
        """Open the connection on the owning thread (``connect`` may also check and migrate)."""

        def run() -> None:
            try:
                self._conn = connect()
            except sqlite3.Error as exc:
                raise translate_error(
                    exc, self.path, action, busy_timeout=self.busy_timeout
                ) from exc

        try:
            await asyncio.get_running_loop().run_in_executor(self._executor, run)
        except BaseException:
            self._executor.shutdown(wait=False)
            raise

    async def call(self, action: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(connection)`` on the owning thread; ``action`` names it in error messages.

        If the awaiting task is cancelled the call still finishes on the thread: a write either
        commits or rolls back as a whole, it is never cut in half.
        """
        if self._closed:
            raise StoreError(f"cannot {action}: the store is closed ({self.path})")
        return await asyncio.get_running_loop().run_in_executor(
            self._executor, self._run, action, fn
        )

    def _run(self, action: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        conn = self._conn
        if conn is None:
            raise StoreError(f"cannot {action}: the store is closed ({self.path})")
        try:
            return fn(conn)
        except sqlite3.Error as exc:
            raise translate_error(exc, self.path, action, busy_timeout=self.busy_timeout) from exc

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True

        def run() -> None:
            conn, self._conn = self._conn, None
            if conn is not None:
                conn.close()

        try:
            await asyncio.get_running_loop().run_in_executor(self._executor, run)
        finally:
            self._executor.shutdown(wait=False)
