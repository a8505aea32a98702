"""The one place psycopg errors become StoreErrors, with a message naming the database and action.

::

    psycopg.Error
    ├── DiskFull (53100)                  → StoreError "database or disk is full" (rolled back)
    ├── ReadOnlySqlTransaction (25006)    → StoreReadOnlyError (a standby, or read-only default)
    ├── InsufficientPrivilege (42501)     → StoreError "permission denied"
    ├── class 28 (28000, 28P01), or a     → StoreUnavailableError "authentication failed (check
    │   login refused as one              │   the user and password in the store URL)"
    ├── 3D000 (InvalidCatalogName), or    → StoreUnavailableError "the database does not exist
    │   libpq's words for it              │   (create it, or fix the database name in the URL)"
    ├── OperationalError                  → StoreUnavailableError (cannot connect, connection lost,
    │                                       server shutting down)
    └── anything else                     → StoreError
"""

from __future__ import annotations

import contextlib
import re
import urllib.parse

import psycopg
from psycopg import errors as pg

from thoughtgate.errors import (
    SAID,
    StoreError,
    StoreReadOnlyError,
    StoreUnavailableError,
    quoting,
)

__all__ = ["describe_target", "translate_error"]

_LOGIN_REFUSED = re.compile(
    r"password authentication failed|authentication failed for user|"
    r'role ".*" does not exist|is not permitted to log in|no pg_hba\.conf entry|'
    r"pg_hba\.conf rejects connection|fe_sendauth: no password supplied"
)
"""What the server (class 28, ``FATAL:``) or libpq says of a refused login. A connection that
fails has no SQLSTATE in psycopg (libpq gives none before a session exists): its text is all
there is. (English only: a server set to another language falls back to "unreachable".)"""


def _said(exc: psycopg.Error, sqlstate: str, words: re.Pattern[str]) -> bool:
    """Whether ``exc`` is the server saying ``sqlstate`` (a code, or a class as its prefix): by
    its SQLSTATE when it has one, else -- a connection that failed: libpq gives none before a
    session exists -- by its ``words`` (English only)."""
    if exc.sqlstate is not None:
        return exc.sqlstate.startswith(sqlstate)
    return isinstance(exc, psycopg.OperationalError) and words.search(str(exc)) is not None


def _login_refused(exc: psycopg.Error) -> bool:
    """Whether ``exc`` is PostgreSQL refusing the login: the user, its password, or pg_hba.conf
    (SQLSTATE class 28, invalid authorization specification)."""
    return _said(exc, "28", _LOGIN_REFUSED)


_MASK = "***"
_URL_DELIMITERS = re.compile(r"[@/?#:]")


def _password_pieces(conninfo: str) -> list[str]:
    """The password ``conninfo`` holds, and, for a URL, every piece of the text where it was
    typed: a password with ``@``, ``/``, ``?`` or ``#`` in it, not percent-encoded, is parsed
    into the host, port or database, where no parsed ``password`` names it (red team, ADR 0135).
    Longest first; pieces of one character are left (they would mask every digit)."""
    pieces: set[str] = set()
    with contextlib.suppress(psycopg.ProgrammingError):
        password = psycopg.conninfo.conninfo_to_dict(conninfo).get("password")
        if password:
            pieces.add(str(password))
    _, sep, rest = conninfo.partition("://")
    if sep and "@" in rest:
        _, colon, typed = rest.rsplit("@", 1)[0].partition(":")  # (up to the last @)
        if colon and typed:
            pieces.update((typed, urllib.parse.unquote(typed)))
            pieces.update(_URL_DELIMITERS.split(typed))
    return sorted((p for p in pieces if len(p) > 1), key=len, reverse=True)


def _masked(text: str, conninfo: str | None) -> str:
    if conninfo is None:
        return text
    for piece in _password_pieces(conninfo):
        text = text.replace(piece, _MASK)
    return text


_NO_DATABASE = re.compile(r'database ".*" does not exist')
"""What the server says (SQLSTATE 3D000, invalid catalog name) of a database that is not there.
On connecting, psycopg has only this text, as for a refused login (English only)."""


def _missing_database(exc: psycopg.Error) -> bool:
    """Whether ``exc`` is PostgreSQL saying the database does not exist (3D000)."""
    return _said(exc, "3D000", _NO_DATABASE)


def describe_target(conninfo: str, schema: str | None = None) -> str:
    """``PostgreSQL database test at 127.0.0.1:5432, schema s`` (never the password, nor a
    piece of one a URL's parse put in the host or the database)."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        return "PostgreSQL (unparseable connection string)"
    host = params.get("host") or params.get("hostaddr") or "localhost"
    port = params.get("port") or "5432"
    dbname = params.get("dbname") or params.get("user") or "(default)"
    where = f"PostgreSQL database {dbname} at {host}:{port}"
    return _masked(f"{where}, schema {schema}" if schema else where, conninfo)


def translate_error(
    exc: psycopg.Error, action: str, where: str, *, conninfo: str | None = None
) -> StoreError:
    """Map a driver error into the thoughtgate tree. The driver's first line is quoted for the
    developer and the operator at ``debug``; its ``public`` text has its class and SQLSTATE
    there (:func:`quoting`): PostgreSQL may quote a value in it (ADR 0104). ``conninfo``: the
    connection string of a connection being made, whose password (or any piece of one) libpq's
    words may quote, masked in them."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    first = _masked(first, conninfo)
    if isinstance(exc, pg.DiskFull):
        return quoting(
            StoreError,
            f"cannot {action}: database or disk is full ({where}); the write was rolled back "
            f"and nothing of it was stored ({SAID})",
            exc,
            first,
        )
    if isinstance(exc, pg.ReadOnlySqlTransaction):
        return quoting(
            StoreReadOnlyError,
            f"cannot {action}: {where} is read-only (a standby, or default_transaction_read_only); "
            f"nothing recorded was changed ({SAID})",
            exc,
            first,
        )
    if isinstance(exc, pg.InsufficientPrivilege):
        text = f"cannot {action}: permission denied on {where} ({SAID})"
        return quoting(StoreError, text, exc, first)
    if _login_refused(exc):
        text = (
            f"cannot {action}: authentication to {where} failed (check the user and password in "
            f"the store URL) ({SAID})"
        )
        return quoting(StoreUnavailableError, text, exc, first)
    if _missing_database(exc):  # ``where`` names it (from the URL, never with its password)
        text = (
            f"cannot {action}: the database does not exist ({where}); create it, or fix the "
            f"database name in the store URL ({SAID})"
        )
        return quoting(StoreUnavailableError, text, exc, first)
    if isinstance(exc, psycopg.OperationalError):
        text = f"cannot {action}: {where} is unreachable or the connection was lost ({SAID})"
        return quoting(StoreUnavailableError, text, exc, first)
    return quoting(StoreError, f"cannot {action}: {SAID} ({where})", exc, first)
