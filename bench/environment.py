"""Where every bench finds the repository, a free loopback port and the PostgreSQL server.

One place, so that all benches honour the same variables: a bench that read only
``THOUGHTGATE_TEST_PG_URL`` while the others read ``THOUGHTGATE_BENCH_PG_URL`` first would measure
another server than the rest of ``make bench`` without saying so.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path
from typing import Any

from bench.pg_owners import Owner

__all__ = [
    "LOOPBACK",
    "PG_URL",
    "REPO",
    "callgrind_control",
    "child_env",
    "consumer_row",
    "drop_schemas",
    "drop_schemas_async",
    "free_port",
    "throwaway_schema",
]

REPO = Path(__file__).resolve().parents[1]
LOOPBACK = "127.0.0.1"

PG_URL = os.environ.get(
    "THOUGHTGATE_BENCH_PG_URL",
    os.environ.get("THOUGHTGATE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test"),
)
"""``THOUGHTGATE_BENCH_PG_URL``, else the tests' server (``THOUGHTGATE_TEST_PG_URL``), else the
local one: each bench works in a throwaway schema on it (:func:`throwaway_schema`)."""


def free_port() -> int:
    """A loopback port nothing listens on now (a child process binds it next)."""
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        return int(probe.getsockname()[1])


def child_env(src: str | Path = REPO / "src") -> dict[str, str]:
    """This environment, with ``src`` (the thoughtgate sources measured: this checkout's unless a
    bench compares another) and the repository (for ``bench``) on the child's ``PYTHONPATH``."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(REPO)])}


def consumer_row(command: list[str], src: str | Path) -> dict[str, Any]:
    """Run a bench's consumer process on ``src``'s sources (hash seed 0, so two processes of the
    same code count the same instructions) and return its last line of output, read as JSON."""
    out = subprocess.run(
        command,
        env={**child_env(src), "PYTHONHASHSEED": "0"},
        cwd=str(REPO),
        capture_output=True,
        text=True,
    )
    if out.returncode:
        raise SystemExit(f"consumer on {src} failed:\n{out.stderr[-4000:]}")
    row: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return row


def callgrind_control(*args: str) -> None:
    """``callgrind_control`` on this process (which runs under valgrind's callgrind)."""
    subprocess.run(["callgrind_control", *args, str(os.getpid())], capture_output=True, check=True)


_OWNER = Owner(PG_URL, "bench")


def throwaway_schema(label: str = "") -> str:
    """A new schema name on :data:`PG_URL` for one bench, ``tg_bench_o<owner>_<random>`` then
    ``_<label>`` if given (lower case and ``_``); :func:`drop_schemas` removes it. The name records
    this process, so a bench killed before its clean-up leaves it to the next bench's or test
    run's sweep (``bench.pg_owners``, ADR 0134)."""
    name: str = _OWNER.name(f"_{label}" if label else "")
    return name


def _schemas(schema: str) -> tuple[str, str]:
    # the store's schema and, for a durable store, DBOS's beside it (ADR 0013)
    return schema, f"{schema}_workflows"


def drop_schemas(schema: str) -> None:
    """Drop a throwaway schema and its durable workflows' schema, whichever exist."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(PG_URL, connect_timeout=3, autocommit=True) as admin:
        for name in _schemas(schema):
            admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


async def drop_schemas_async(schema: str) -> None:
    """:func:`drop_schemas` from a bench's event loop."""
    import psycopg
    from psycopg import sql

    async with await psycopg.AsyncConnection.connect(
        PG_URL, connect_timeout=3, autocommit=True
    ) as admin:
        for name in _schemas(schema):
            query = sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name))
            await admin.execute(query)
