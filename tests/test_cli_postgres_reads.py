"""The read commands on a PostgreSQL store that is not there: as on SQLite, nothing is created.

A mistyped ``?schema=`` must not leave an empty thoughtgate schema behind and answer as if a real,
empty store were there: listings list nothing with a note naming the database and schema, and a
run or key named there is not found (exit 2). A command that records still creates the store.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import sql
from support.pg import PG_URL, schema_name
from typer.testing import CliRunner

from thoughtgate.cli import app
from thoughtgate.store.pg_errors import describe_target

pytestmark = pytest.mark.postgres

LOCAL = {"THOUGHTGATE_URL": None, "THOUGHTGATE_KEY": None, "COLUMNS": "400"}


@pytest.fixture
def schema() -> Iterator[str]:
    """A schema name nobody created; dropped afterwards whatever the commands did."""
    name = schema_name()
    try:
        yield name
    finally:
        with psycopg.connect(PG_URL, autocommit=True, connect_timeout=5) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def _schema_exists(name: str) -> bool:
    with psycopg.connect(PG_URL, autocommit=True, connect_timeout=5) as conn:
        row = conn.execute("SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = %s", (name,))
        return row.fetchone() is not None


def test_reads_of_a_postgres_schema_that_does_not_exist_create_nothing(schema: str) -> None:
    db = f"{PG_URL}?schema={schema}"
    where = describe_target(PG_URL, schema)  # database, host, port and schema; no password
    runner = CliRunner()

    def tg(*args: str) -> tuple[int, str, str]:
        result = runner.invoke(app, [*args, "--db", db], env=LOCAL)
        return result.exit_code, result.stdout, result.stderr

    for listing in (["runs", "--json"], ["keys", "list", "--json"]):
        code, out, err = tg(*listing)
        assert (code, json.loads(out)) == (0, []), err
        assert f"no thoughtgate store at {where} yet: nothing has been recorded there" in err
    code, out, err = tg("check-index")
    assert code == 0 and f"no thoughtgate store at {where} yet" in err, out + err
    for args in (["status", "run_abc"], ["events", "run_abc"], ["resume", "run_abc"]):
        code, _, err = tg(*args)
        assert code == 2, (args, err)
        assert f"no thoughtgate store at {where}: run 'run_abc' not found there" in err
    code, _, err = tg("keys", "revoke", "ci")
    assert code == 2 and f"no thoughtgate store at {where}: key 'ci' not found there" in err
    assert not _schema_exists(schema)
    # a command that records creates it; the reads then see it, with no note
    code, out, err = tg("keys", "create", "--role", "viewer", "--name", "ci")
    assert code == 0, err
    assert _schema_exists(schema)
    code, out, err = tg("keys", "list", "--json")
    assert code == 0 and [k["name"] for k in json.loads(out)] == ["ci"]
    assert "no thoughtgate store" not in err
    code, out, err = tg("runs", "--json")
    assert (code, json.loads(out), "no thoughtgate store" in err) == (0, [], False)


def _store_errors(db: str) -> Iterator[str]:
    """What each of a few commands (reads, a key listing, a run) prints on stderr for ``db``,
    each failing with exit 1 and nothing on stdout."""
    for args in (
        ["runs"],
        ["status", "run_abc"],
        ["keys", "list"],
        ["run", "hi", "--model", "fake:echo"],
    ):
        result = CliRunner().invoke(
            app, [*args, "--db", db], env={**LOCAL, "THOUGHTGATE_DURABILITY__ENABLED": "false"}
        )
        assert (result.exit_code, result.stdout) == (1, ""), (args, result.output)
        yield result.stderr


def test_a_role_the_server_refuses_is_an_authentication_failure_without_its_password() -> None:
    """A login PostgreSQL refuses (here a role that does not exist: SQLSTATE 28000; a wrong
    password is 28P01) was "unreachable or the connection was lost", the cause in the detail."""
    role = f"tg_no_such_role_{uuid.uuid4().hex[:8]}"
    parts = urlsplit(PG_URL)
    db = urlunsplit(parts._replace(netloc=f"{role}:hunter2@{parts.hostname}:{parts.port or 5432}"))
    where = describe_target(db)
    for said in _store_errors(db):
        assert said.startswith(
            f"error: cannot open the store: authentication to {where} failed (check the user and "
            "password in the store URL) ("
        ), said
        assert f'role "{role}" does not exist' in said  # the server's words, as detail
        assert "hunter2" not in said and "unreachable" not in said


def test_a_database_that_does_not_exist_is_named_with_what_to_do() -> None:
    """A database name the server does not have said "unreachable or the connection was lost";
    it names the database (not the password) and says to create it or fix the URL."""
    name = f"tg_no_such_db_{uuid.uuid4().hex[:8]}"
    parts = urlsplit(PG_URL)
    user = parts.username or "postgres"
    netloc = f"{user}:hunter2@{parts.hostname}:{parts.port or 5432}"  # trust: any password
    db = urlunsplit(parts._replace(netloc=netloc, path=f"/{name}"))
    where = describe_target(db)
    assert name in where
    for said in _store_errors(db):
        assert said.startswith(
            f"error: cannot open the store: the database does not exist ({where}); create it, "
            "or fix the database name in the store URL ("
        ), said
        assert f'database "{name}" does not exist' in said  # the server's words, as detail
        assert "hunter2" not in said and "unreachable" not in said
