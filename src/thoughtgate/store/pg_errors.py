"""The one place psycopg errors become StoreErrors, with a message naming the database and action.

::

    psycopg.Error
    ├── DiskFull (53100)                  → StoreError "database or disk is full" (rolled back)
    ├── ReadOnlySqlTransaction (25006)    → StoreReadOnlyError (a standby, or read-only default)
    ├── InsufficientPrivilege (42501)     → StoreError "permission denied"
    ├── OperationalError                  → StoreUnavailableError (cannot connect, connection lost,
    │                                       server shutting down)
    └── anything else                     → StoreError
"""

from __future__ import annotations

import psycopg
from psycopg import errors as pg

from thoughtgate.errors import StoreError, StoreReadOnlyError, StoreUnavailableError

__all__ = ["describe_target", "translate_error"]


def describe_target(conninfo: str, schema: str | None = None) -> str:
    """``PostgreSQL database test at 127.0.0.1:5432, schema s`` (never the password)."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        return "PostgreSQL (unparseable connection string)"
    host = params.get("host") or params.get("hostaddr") or "localhost"
    port = params.get("port") or "5432"
    dbname = params.get("dbname") or params.get("user") or "(default)"
    where = f"PostgreSQL database {dbname} at {host}:{port}"
    return f"{where}, schema {schema}" if schema else where


def translate_error(exc: psycopg.Error, action: str, where: str) -> StoreError:
    """Map a driver error into the thoughtgate tree."""
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, pg.DiskFull):
        return StoreError(
            f"cannot {action}: database or disk is full ({where}); the write was rolled back "
            f"and nothing of it was stored ({detail})"
        )
    if isinstance(exc, pg.ReadOnlySqlTransaction):
        return StoreReadOnlyError(
            f"cannot {action}: {where} is read-only (a standby, or default_transaction_read_only); "
            f"nothing recorded was changed ({detail})"
        )
    if isinstance(exc, pg.InsufficientPrivilege):
        return StoreError(f"cannot {action}: permission denied on {where} ({detail})")
    if isinstance(exc, psycopg.OperationalError):
        return StoreUnavailableError(
            f"cannot {action}: {where} is unreachable or the connection was lost ({detail})"
        )
    return StoreError(f"cannot {action}: {detail} ({where})")
