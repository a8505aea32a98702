"""The PostgreSQL test fixtures' schemas: each records the process that owns it, and a sweep drops
those whose owner is gone, never another live process's (``support.pg``)."""

from __future__ import annotations

import secrets
import uuid
from typing import Any

import psycopg
import pytest
from psycopg import sql
from support.pg import KEEPER_PREFIX, PG_URL, owner_of, schema_name, sweep_abandoned_schemas


def _tag() -> str:
    return f"{secrets.randbelow(10**6)}r{secrets.token_hex(3)}"


def _schemas(conn: psycopg.Connection[Any]) -> set[str]:
    return {n for (n,) in conn.execute("SELECT nspname FROM pg_namespace").fetchall()}


def _create(conn: psycopg.Connection[Any], *names: str) -> None:
    for name in names:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))


def _drop(conn: psycopg.Connection[Any], *names: str) -> None:
    for name in names:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@pytest.mark.unit
def test_a_schema_name_records_its_owner_and_only_such_names_have_one() -> None:
    assert owner_of("tg_test_o4242r0a1b2c_0123abcd") == "4242r0a1b2c"
    assert owner_of("tg_test_o4242r0a1b2c_0123abcd_workflows") == "4242r0a1b2c"
    for unowned in (
        "tg_test_0123456789ab",  # named before owners were recorded: nobody can tell whose
        "tg_test_0123456789ab_workflows",
        "tg_bench_0123456789ab",
        "public",
        "tg_test_o4242_0123abcd; DROP",
        "tg_test_o_0123abcd",
    ):
        assert owner_of(unowned) is None, unowned


@pytest.mark.external
@pytest.mark.postgres
def test_the_sweep_drops_only_the_schemas_of_owners_that_are_gone() -> None:
    """A schema (and DBOS's beside it) whose owner's keeper is gone is dropped; one whose
    owner's keeper is connected (another xdist worker, another run on any machine) is kept,
    until that keeper goes; one that records no owner (an older run's, or not the tests') and
    any other schema are never touched; this process's own, named by ``schema_name``, stay."""
    alive, dead = _tag(), _tag()
    mine = schema_name()  # this process's keeper is connected from here on
    live_schemas = [f"tg_test_o{alive}_{uuid.uuid4().hex[:8]}"]
    live_schemas.append(f"{live_schemas[0]}_workflows")
    dead_schemas = [f"tg_test_o{dead}_{uuid.uuid4().hex[:8]}"]
    dead_schemas.append(f"{dead_schemas[0]}_workflows")
    unowned = [f"tg_test_{uuid.uuid4().hex[:12]}", f"tg_sweep_{uuid.uuid4().hex[:8]}"]
    everything = [mine, *live_schemas, *dead_schemas, *unowned]
    with psycopg.connect(PG_URL, autocommit=True, connect_timeout=5) as admin:
        _create(admin, *everything)
        try:
            keeper = psycopg.connect(
                PG_URL, autocommit=True, connect_timeout=5, application_name=KEEPER_PREFIX + alive
            )
            with keeper:
                dropped = sweep_abandoned_schemas(admin)
                assert set(dead_schemas) <= set(dropped)
                assert not {mine, *live_schemas, *unowned} & set(dropped)
                left = _schemas(admin)
                assert not set(dead_schemas) & left
                assert {mine, *live_schemas, *unowned} <= left
            # the other owner is gone now: its keeper ended with it
            dropped = _await_sweep(admin, live_schemas)
            assert not {mine, *unowned} & set(dropped)
            assert {mine, *unowned} <= _schemas(admin)
        finally:
            _drop(admin, *everything)


def _await_sweep(admin: psycopg.Connection[Any], expected: list[str]) -> list[str]:
    """Sweep until ``expected`` is dropped: the server lists a closed session until its backend
    has exited, a moment after the client closed it."""
    dropped: list[str] = []
    for _ in range(200):
        dropped += sweep_abandoned_schemas(admin)
        if set(expected) <= set(dropped):
            return dropped
        admin.execute("SELECT pg_sleep(0.05)")
    raise AssertionError(f"{expected} outlived their owner's keeper; dropped {dropped}")
