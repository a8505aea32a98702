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
    ├── OperationalError                  → StoreUnavailableError, an outage (cannot connect,
    │                                       connection lost, the pool's wait ran out, server
    │                                       shutting down: ADR 0152)
    └── anything else                     → StoreError
"""

from __future__ import annotations

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
    unquoted,
)

__all__ = ["describe_target", "translate_error", "writes_refused"]

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
_PIECE_DELIMITERS = re.compile(r"[@/?#:,&=\s]")
"""Where libpq's URL parse may cut a password typed without its escapes: the user info, host,
port, database and query delimiters, the separators of hosts and parameters, and spaces
(which it trims)."""
_PARSED_APART = ("user", "host", "hostaddr", "port", "dbname")
"""What libpq parses out of a URL's user info, host and path, where no ``@`` belongs."""


def _typed_password(conninfo: str) -> str | None:
    """The text typed where a URL's password may be, read as widely as it can be: from the
    ``:`` after the user to the last ``@`` (a password holding ``@``, ``/``, ``?`` or ``#``
    unescaped ends there, whatever libpq made of it); ``None`` when there is no such text."""
    _, sep, rest = conninfo.partition("://")
    userinfo, at, _ = rest.rpartition("@")
    if not (sep and at):
        return None
    _, colon, typed = userinfo.partition(":")
    return typed if colon and typed else None


_QUERY_PASSWORD = re.compile(r"[?&]password=(.*)", re.DOTALL)
"""A URL's password given as a query parameter and all that follows it: in a URL that does not
parse, a bare ``&`` may have ended it early (``?password=&7`` said ``... parameter: "7"``)."""
_KEYWORD_PASSWORD = re.compile(r"(?:^|\s)password\s*=\s*(.*)", re.DOTALL)
"""A key/value string's password and all that follows it: when the string does not parse, where
the password ends cannot be told (``password=S ek`` -- libpq said ``missing "=" after "ek"``)."""
_KEYWORD_DELIMITERS = re.compile(r"[\s'\\=]+")
"""Where a key/value string's parse may cut a password: spaces, quotes, escapes and ``=``."""


def _typed_elsewhere(conninfo: str, params: dict[str, str] | None) -> list[str]:
    """The text typed as a password outside a URL's user info -- a URL's ``?password=``, a
    key/value string's ``password=`` -- when libpq could not parse the string (else its parsed
    password is the one to mask), with each piece of it: libpq's parse error quotes a piece
    (``invalid percent-encoded token: "S%zzk"``, ``missing "=" after "ek"``)."""
    if params is not None:
        return []
    if "://" in conninfo:
        said = _QUERY_PASSWORD.search(conninfo)
        if said is None:
            return []
        rest = said.group(1)
        return [rest, *_PIECE_DELIMITERS.split(rest), *re.split(r"[%&=]", rest)]
    said = _KEYWORD_PASSWORD.search(conninfo)
    if said is None:
        return []
    rest = said.group(1).strip()
    return [rest, *_KEYWORD_DELIMITERS.split(rest)]


def _parsed(conninfo: str) -> dict[str, str] | None:
    """libpq's reading of ``conninfo``: ``None`` when it cannot read it (a ``%``-escape that is
    not UTF-8, ``%87``, is read by libpq but not decoded by psycopg)."""
    try:
        return {k: str(v) for k, v in psycopg.conninfo.conninfo_to_dict(conninfo).items()}
    except (psycopg.ProgrammingError, UnicodeDecodeError):
        return None


def _read_as_typed(conninfo: str, params: dict[str, str] | None) -> bool:
    """Whether libpq read the URL as it was meant: it could parse it, no ``@`` is in what it
    parsed apart from the password (the user, host, port and database: a password's ``@`` cut
    it short there), and the port is a number (a password's ``/`` made its start the port).
    A key/value connection string is quoted by its own rules and is read as typed when it
    parses. An ``@`` in a query value (``application_name=a@b``) is that value's."""
    if params is None:
        return False
    if "://" not in conninfo:
        return True
    if any("@" in params.get(k, "") for k in _PARSED_APART):
        return False
    return all(p.isdigit() for p in params.get("port", "0").split(",") if p)


def _worth_masking(piece: str) -> bool:
    """A piece of punctuation shorter than three characters is not looked for: every text has
    its own (``.``, ``-``), and it holds next to nothing of a password."""
    return len(piece) >= 3 or any(c.isalnum() for c in piece)


def _password_pieces(conninfo: str, params: dict[str, str] | None) -> list[str]:
    """What of ``conninfo``'s password an error must not show, longest first.

    Read as typed: the password libpq parsed (and as it was typed, escapes and all), whatever
    its length. Otherwise the URL cannot be trusted to have kept the password apart -- libpq put
    what followed a bare ``@`` in the host, or the text after a bare ``/`` in the port and the
    database -- so all the text typed after the user, up to the last ``@``, is secret, and each
    piece of it between delimiters too, one character long or more (red team, ADR 0135)."""
    pieces: set[str] = set()
    password = (params or {}).get("password")
    if password:
        pieces.add(password)
    typed = _typed_password(conninfo)
    if typed is not None:
        decoded = urllib.parse.unquote(typed)
        if _read_as_typed(conninfo, params):
            pieces.update({typed, decoded} if decoded == password else ())
        else:
            for whole in (typed, decoded):
                pieces.add(whole)
                pieces.update(_PIECE_DELIMITERS.split(whole))
    pieces.update(_typed_elsewhere(conninfo, params))
    return sorted((p for p in pieces if p and _worth_masking(p)), key=len, reverse=True)


def _masked(text: str, pieces: list[str]) -> str:
    """``text`` with each piece replaced where it stands as its own word (not inside a longer
    one: a host ``db7`` is not a password ``7``), or anywhere when it is long."""
    return unquoted(text, [(piece, _MASK) for piece in pieces])


_NO_DATABASE = re.compile(r'database ".*" does not exist')
"""What the server says (SQLSTATE 3D000, invalid catalog name) of a database that is not there.
On connecting, psycopg has only this text, as for a refused login (English only)."""


def _missing_database(exc: psycopg.Error) -> bool:
    """Whether ``exc`` is PostgreSQL saying the database does not exist (3D000)."""
    return _said(exc, "3D000", _NO_DATABASE)


_ESCAPE_HINT = "percent-encode the URL's password: @ is %40, / is %2F, a space %20"
"""What to do about a URL libpq did not read as it was meant, when it has a password typed."""


def describe_target(conninfo: str, schema: str | None = None) -> str:
    """``PostgreSQL database test at 127.0.0.1:5432, schema s`` (never the password, nor a
    piece of one a URL's parse put in the host or the database). A URL with a password that
    libpq could not read, or read apart as no one means, says how to write it instead: its
    error alone (``invalid URI query parameter: "***"``) would not tell."""
    params = _parsed(conninfo)
    typed = "://" in conninfo and _typed_password(conninfo) is not None
    hint = _ESCAPE_HINT if typed and not _read_as_typed(conninfo, params) else ""
    if params is None:
        return f"PostgreSQL (unparseable connection string{'; ' + hint if hint else ''})"
    host = params.get("host") or params.get("hostaddr") or "localhost"
    port = params.get("port") or "5432"
    dbname = params.get("dbname") or params.get("user") or "(default)"
    if not _read_as_typed(conninfo, params):  # what libpq parsed apart may hold the password
        pieces = _password_pieces(conninfo, params)
        host, port, dbname = (_masked(x, pieces) for x in (host, port, dbname))
        schema = _masked(schema, pieces) if schema else schema
    where = f"PostgreSQL database {dbname} at {host}:{port}"
    where = f"{where}, schema {schema}" if schema else where
    return f"{where} ({hint})" if hint else where


def translate_error(
    exc: psycopg.Error, action: str, where: str, *, conninfo: str | None = None
) -> StoreError:
    """Map a driver error into the thoughtgate tree. The driver's first line is quoted for the
    developer and the operator at ``debug``; its ``public`` text has its class and SQLSTATE
    there (:func:`quoting`): PostgreSQL may quote a value in it (ADR 0104). ``conninfo``: the
    connection string of a connection being made, whose password (or any piece of one) libpq's
    words may quote, masked in them."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if conninfo is not None:
        first = _masked(first, _password_pieces(conninfo, _parsed(conninfo)))
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
        error = quoting(StoreUnavailableError, text, exc, first)
        error.outage = True  # it may answer again by itself (ADR 0152)
        return error
    return quoting(StoreError, f"cannot {action}: {SAID} ({where})", exc, first)


_REFUSED_BY_CODE = (
    ("25006", "store_read_only"),  # read_only_sql_transaction: a standby, or the default
    ("53", "store_refuses_writes"),  # insufficient resources: disk full, out of memory, ...
)
"""SQLSTATEs (a code, or a class as its prefix) that say a database which answers refuses
writes, with the word ``/readyz`` gives for them (ADR 0151, amendment 3)."""


def writes_refused(exc: psycopg.Error) -> str | None:
    """Why ``exc`` says the database, answering, refuses writes now (``write_refusal``'s
    word), or ``None``: one statement was wrong (a constraint, a syntax error, a serialization
    failure, a cancelled query), or the database does not answer at all (a connection refused,
    lost or ended by a shutdown, class ``08``/``57P``, the pool's wait run out) -- which
    ``check_writes``' own connection sees as it comes and goes, where a last outcome held for
    30 s would keep a daemon unready after its database came back."""
    code = exc.sqlstate
    if code is None:
        return None
    return next((word for prefix, word in _REFUSED_BY_CODE if code.startswith(prefix)), None)
