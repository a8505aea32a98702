"""Which store failures a durable run waits out (ADR 0152): the store refusing for a while, never
one that waits for someone to act."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import psycopg
import pytest

from thoughtgate.config import DurabilityConfig, load_config
from thoughtgate.errors import ConfigError, RuntimeFailure, StoreError, store_outage
from thoughtgate.store.pg_errors import translate_error as translate_pg
from thoughtgate.store.sqlite_thread import translate_error as translate_sqlite

WHERE = "PostgreSQL database test at 127.0.0.1:5432"


def _sqlite(code: int) -> sqlite3.Error:
    exc = sqlite3.OperationalError("database is locked" if code == 5 else "unable to open")
    exc.sqlite_errorcode = code  # type: ignore[attr-defined]
    return exc


@pytest.mark.parametrize(
    ("error", "waited_out"),
    [
        (translate_pg(psycopg.OperationalError("couldn't get a connection"), "x", WHERE), True),
        (
            translate_pg(
                psycopg.OperationalError(
                    'FATAL:  database "x" is not currently accepting connections'
                ),
                "x",
                WHERE,
            ),
            True,
        ),
        (
            translate_pg(
                psycopg.OperationalError('FATAL:  password authentication failed for user "u"'),
                "x",
                WHERE,
            ),
            False,
        ),
        (
            translate_pg(
                psycopg.OperationalError('FATAL:  database "x" does not exist'), "x", WHERE
            ),
            False,
        ),
        (translate_sqlite(_sqlite(5), "/tmp/runs.db", "x", busy_timeout=30), True),  # BUSY
        (translate_sqlite(_sqlite(6), "/tmp/runs.db", "x", busy_timeout=30), True),  # LOCKED
        (translate_sqlite(_sqlite(14), "/tmp/runs.db", "x"), False),  # CANTOPEN
        (StoreError("SQLite database /tmp/runs.db was removed (or its directory was)"), False),
    ],
)
def test_a_store_refusing_for_a_while_is_an_outage_one_that_needs_someone_is_not(
    error: StoreError, waited_out: bool
) -> None:
    assert (store_outage(error) is error) is waited_out


def test_an_outage_is_found_under_the_failure_it_caused() -> None:
    outage = translate_pg(psycopg.OperationalError("server closed the connection"), "x", WHERE)
    try:
        try:
            raise outage
        except StoreError as exc:
            raise RuntimeFailure("the task could not record its end") from exc
    except RuntimeFailure as caused:
        assert store_outage(caused) is outage


@pytest.mark.parametrize("value", ["-1", "soon", "1e9"])
def test_a_bad_outage_wait_is_named_with_where_it_came_from(value: str, tmp_path: Path) -> None:
    variable = "THOUGHTGATE_DURABILITY__STORE_OUTAGE_WAIT_S"
    with pytest.raises(ConfigError) as refused:
        load_config(environ={variable: value}, cwd=tmp_path)
    assert str(refused.value) == (
        f"{variable}: durability.store_outage_wait_s = '{value}': expected a number from 0 to 86400"
    )


def test_the_outage_wait_defaults_to_five_minutes_and_zero_means_no_wait() -> None:
    assert DurabilityConfig().store_outage_wait_s == 300
    assert DurabilityConfig(store_outage_wait_s=0).store_outage_wait_s == 0
