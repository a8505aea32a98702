"""Store URLs: where the embedded default lives and which backend a URL selects."""

from __future__ import annotations

import logging
from pathlib import Path

from platformdirs import user_data_dir

from thoughtgate.errors import StoreError, StoreReadOnlyError, UsageError, public_url
from thoughtgate.store.base import EventStore

log = logging.getLogger("thoughtgate.store")

__all__ = ["default_store_url", "describe_store", "open_store", "sqlite_path"]


def default_store_url() -> str:
    """``sqlite:///<user data dir>/thoughtgate/thoughtgate.db``."""
    return f"sqlite:///{Path(user_data_dir('thoughtgate')) / 'thoughtgate.db'}"


def sqlite_path(url: str) -> Path:
    """SQLAlchemy's convention: ``sqlite:///rel.db`` is relative to the cwd, ``sqlite:////abs.db``
    (or ``sqlite:///`` + an absolute path) is absolute."""
    if not url.startswith("sqlite:///"):
        raise UsageError(f"bad sqlite url {url!r}; expected sqlite:///PATH")
    return Path(url.removeprefix("sqlite:///"))


def describe_store(url: str) -> str:
    """What a message says of the store ``url`` names: a SQLite or memory URL as it is, a
    PostgreSQL one by its database, host, port and schema, never its password
    (``thoughtgate serve``'s listening line goes to whatever collects the operator's logs)."""
    if not url.startswith(("postgresql:", "postgres:")):
        return url
    try:
        from thoughtgate.store.pg_errors import describe_target
        from thoughtgate.store.postgres import split_schema_param
    except ImportError:
        return "a PostgreSQL database"
    conninfo, schema = split_schema_param(url)
    return describe_target(conninfo, schema)


async def open_store(url: str, *, sweep: bool = True) -> EventStore:
    """Open the store a URL names: ``memory://``, ``sqlite:///PATH``, ``postgresql://...``.

    With ``sweep`` (the default) runs left open by a process that is gone are closed as
    interrupted right away (``store.leases``), so no reader finds a run "running" forever.
    """
    store: EventStore
    if url.startswith("memory:"):
        from thoughtgate.store.memory import MemoryStore

        store = MemoryStore()
    elif url.startswith("sqlite:"):
        from thoughtgate.store.sqlite import SQLiteStore

        store = await SQLiteStore.open(sqlite_path(url))
    elif url.startswith(("postgresql:", "postgres:")):
        try:
            from thoughtgate.store.postgres import PostgresStore
        except ImportError as exc:
            raise UsageError(
                "a PostgreSQL store needs the postgres extra: pip install 'thoughtgate[postgres]' "
                f"({exc})"
            ) from None
        store = await PostgresStore.open(url)
    else:
        # a mistyped scheme (``postgress://user:password@host/db``) keeps its password: not shown
        raise UsageError(
            f"unsupported store url {public_url(url)!r}; allowed: sqlite:///PATH, memory://, "
            "postgresql://..."
        )
    if sweep:
        await _sweep(store)
    return store


async def _sweep(store: EventStore) -> None:
    """Close orphaned runs; a store we cannot write (a read-only file) is read as it is."""
    from thoughtgate.store.leases import close_orphaned_runs

    try:
        await close_orphaned_runs(store)
    except StoreReadOnlyError:
        pass
    except StoreError as exc:  # opening worked; reads may still be useful
        log.warning("could not close runs left open by a stopped process: %s", exc)
