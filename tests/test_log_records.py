"""No exception's own words in any log below ``--log-level debug`` (ADR 0104).

A store's, a provider's or a library's exception quotes data: PostgreSQL's DETAIL the failing
row (reasoning included), a provider's error its response body, pydantic its input values,
orjson a fragment of its input. These tests drive such failures through real log paths -- a
``thoughtgate serve`` on PostgreSQL, ``log.exception`` and ``%s`` call sites, asyncio's and
uvicorn's own error lines -- and look for the marker in what was written.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import io
import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import httpx
import orjson
import psycopg
import pydantic
import pytest
from psycopg import sql
from support.daemon import REPO, ServeProcess, auth, cli_env
from support.pg import PG_URL, schema_name

from thoughtgate import log_records
from thoughtgate.errors import ProviderError, StoreError
from thoughtgate.log_records import exception_summary, safe_traceback
from thoughtgate.store.pg_errors import translate_error

LEAK = "LOGLEAK"
ENDED = ("completed", "failed", "cancelled", "interrupted")


def _wait_ended(client: httpx.Client, run_id: str) -> None:
    deadline = time.monotonic() + 60
    while client.get(f"/v1/runs/{run_id}").json()["status"] not in ENDED:
        assert time.monotonic() < deadline, "the run did not end"
        time.sleep(0.2)


@pytest.fixture
def written() -> Iterator[io.StringIO]:
    """Everything logged from now on, formatted as the daemon's stderr handler formats it, with
    the safe records installed (and the factory as it was afterwards)."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(levelname)s: %(name)s: %(message)s"))
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    before = logging.getLogRecordFactory()
    log_records.install()
    try:
        yield out
    finally:
        logging.setLogRecordFactory(before)
        root.removeHandler(handler)
        root.setLevel(level)


def _pg_row_error() -> psycopg.Error:
    """A real PostgreSQL error whose DETAIL quotes the row it refused."""
    with psycopg.connect(PG_URL, autocommit=True, connect_timeout=5) as conn:
        conn.execute("CREATE TEMP TABLE t (payload text, n int CHECK (n > 0))")
        try:
            conn.execute("INSERT INTO t VALUES (%s, -1)", (f"REASONING-{LEAK}",))
        except psycopg.Error as exc:
            return exc
    raise AssertionError("the insert should have failed")


def _pg_input_error() -> psycopg.Error:
    """A real PostgreSQL error whose first line (which a ``StoreError`` quotes) holds a value."""
    with psycopg.connect(PG_URL, autocommit=True, connect_timeout=5) as conn:
        try:
            conn.execute("SELECT %s::int", (f"REASONING-{LEAK}",))
        except psycopg.Error as exc:
            return exc
    raise AssertionError("the cast should have failed")


def _failures() -> list[BaseException]:
    """Real exceptions whose text quotes the marker, as the libraries raise them."""
    pg_error = _pg_row_error()
    input_error = _pg_input_error()
    try:
        raise translate_error(input_error, "append events", "PostgreSQL database test") from (
            input_error
        )
    except StoreError as exc:
        store_error = exc
    response = httpx.Response(
        400,
        text=f'{{"error": "prompt is too long: THINK-{LEAK}"}}',
        request=httpx.Request("POST", "https://provider.example/v1/messages"),
    )
    try:
        response.raise_for_status()
    except httpx.HTTPStatusError as exc:
        status_error = exc
    said = f"context too long: THINK-{LEAK}"
    provider = ProviderError(said, provider="anthropic", status=400, by_provider=True, detail=said)
    try:
        pydantic.TypeAdapter(int).validate_python(f"REASONING-{LEAK}")
    except pydantic.ValidationError as exc:
        invalid = exc
    try:
        orjson.loads(f'{{"reasoning": "REASONING-{LEAK}" oops}}')
    except orjson.JSONDecodeError as exc:
        malformed = exc
    return [pg_error, store_error, status_error, provider, invalid, malformed]


@pytest.fixture(scope="module")
def failures() -> list[BaseException]:
    found = _failures()
    # these quote the marker in their text, else the tests prove nothing (httpx's quotes the
    # URL, orjson's keeps the input in ``doc``)
    for exc in found:
        if not isinstance(exc, httpx.HTTPStatusError | orjson.JSONDecodeError):
            assert LEAK in str(exc)
    return found


@pytest.mark.postgres
def test_an_exception_as_an_argument_is_logged_by_its_class_and_code(
    failures: list[BaseException], written: io.StringIO
) -> None:
    log = logging.getLogger("thoughtgate.test")
    for exc in failures:
        log.warning("could not close run r1: %s", exc)
        log.error("as repr: %r", exc)
        log.error(exc)
    text = written.getvalue()
    assert LEAK not in text
    assert "could not close run r1: CheckViolation (SQLSTATE 23514)" in text
    assert "HTTPStatusError (HTTP 400)" in text
    assert "provider anthropic returned HTTP 400" in text
    assert "ValidationError (1 validation error)" in text
    assert "JSONDecodeError" in text
    # thoughtgate's own words stay, the driver's line in them is its code
    assert (
        "cannot append events: InvalidTextRepresentation (SQLSTATE 22P02) "
        "(PostgreSQL database test)" in text
    )


@pytest.mark.postgres
def test_a_traceback_keeps_its_frames_not_its_exceptions_words(
    failures: list[BaseException], written: io.StringIO
) -> None:
    log = logging.getLogger("thoughtgate.test")
    for exc in failures:
        try:
            raise RuntimeError("wrapped") from exc
        except RuntimeError:
            log.exception("a live reader failed")
    text = written.getvalue()
    assert LEAK not in text
    assert "Traceback (most recent call last):" in text
    assert 'raise RuntimeError("wrapped") from exc' in text  # the frames: code
    assert "psycopg.errors.CheckViolation: SQLSTATE 23514, its text is logged at debug" in text
    assert "The above exception was the direct cause of the following exception:" in text


@pytest.mark.postgres
def test_at_debug_the_words_are_logged_as_raised(
    failures: list[BaseException], written: io.StringIO
) -> None:
    log_records.install(full=True)
    logging.getLogger("thoughtgate.test").warning("stopped: %s", failures[0])
    assert f"REASONING-{LEAK}" in written.getvalue()


@pytest.mark.postgres
def test_a_library_quoting_the_exception_it_handles_in_an_f_string_is_caught(
    failures: list[BaseException], written: io.StringIO
) -> None:
    """DBOS (the durable engine) logs ``f"Error executing workflow {id}: {e}"`` inside its
    ``except`` blocks: the record carries no exception, but one is being handled."""
    dbos = logging.getLogger("dbos")
    # DBOS, once launched in this process (a durable test before this one), logs through its
    # own handler and stops propagation: the record factory acts all the same, but this test
    # reads the root's handler, so the logger is pointed there for its duration.
    kept = (dbos.propagate, dbos.level, dbos.disabled)
    dbos.propagate, dbos.disabled = True, False
    dbos.setLevel(logging.NOTSET)
    try:
        for exc in failures:
            try:
                raise exc
            except Exception as e:
                dbos.warning(f"Error executing workflow w1: {e}")
    finally:
        dbos.propagate, dbos.disabled = kept[0], kept[2]
        dbos.setLevel(kept[1])
    text = written.getvalue()
    assert LEAK not in text
    assert "Error executing workflow w1: CheckViolation (SQLSTATE 23514)" in text


@pytest.mark.unit
def test_asyncio_never_retrieved_task_is_logged_without_its_words(written: io.StringIO) -> None:
    """asyncio's own line prints the task's ``repr``, which quotes the exception's."""

    async def fail() -> None:
        raise ValueError(f"bad input REASONING-{LEAK}")

    async def main() -> None:
        task = asyncio.get_running_loop().create_task(fail())
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        del task

    asyncio.run(main())
    gc.collect()
    text = written.getvalue()
    assert "Task exception was never retrieved" in text
    assert "ValueError: its text is logged at debug level only" in text
    assert LEAK not in text


@pytest.mark.unit
def test_a_group_and_a_note_show_no_words() -> None:
    inner = ValueError(f"REASONING-{LEAK}")
    inner.add_note(f"note REASONING-{LEAK}")
    try:
        raise ExceptionGroup("two failed", [inner, KeyError(LEAK)])
    except ExceptionGroup as group:
        text = safe_traceback(group)
    assert LEAK not in text
    assert "ValueError: its text is logged at debug level only" in text
    assert exception_summary(inner) == "ValueError"


_STORED: Final = "(payload::text || coalesce(apart::text, ''))"
REFUSE_REASONING: Final = f"{_STORED} NOT LIKE '%%REASONING-%%' OR {_STORED}::int > 0"
"""A CHECK on the events that refuses the reasoning's by a cast, which quotes the stored text
(the row's payload and the part kept apart, where the reasoning is since ADR 0160) in the
error's first line (any constraint, trigger, index or generated column that casts a value quotes
it so)."""
TOOLS = ("--tools", "support.served:SERVER_TOOLS")


def _admin(statement: str, schema: str) -> None:
    with psycopg.connect(PG_URL, autocommit=True, connect_timeout=5) as admin:
        admin.execute(sql.SQL(statement).format(sql.Identifier(schema)))


def _refuse(schema: str, check: str) -> None:
    _admin(f"ALTER TABLE {{}}.events ADD CONSTRAINT refuses CHECK ({check}) NOT VALID", schema)


@contextlib.contextmanager
def _daemon_refusing(check: str, *args: str) -> Iterator[tuple[ServeProcess, str]]:
    """A ``thoughtgate serve`` on a schema of its own whose events must pass ``check``, and its
    owner key."""
    schema = schema_name()
    server = ServeProcess("--db", f"{PG_URL}?schema={schema}", *TOOLS, *args)
    server.start(expect_key=True)
    try:
        _refuse(schema, check)
        assert server.bootstrap_key
        yield server, server.bootstrap_key
    finally:
        server.stop()
        _admin("DROP SCHEMA IF EXISTS {} CASCADE", schema)


def _canary_run(client: httpx.Client) -> str:
    """A run whose reasoning carries the marker, once it has ended."""
    body = {"prompt": f"canary {LEAK}", "model": "fake:canary", "chain_of_thought": "surface"}
    run_id = str(client.post("/v1/runs", json=body).json()["run_id"])
    _wait_ended(client, run_id)
    return run_id


@pytest.mark.postgres
@pytest.mark.parametrize("level", ["info", "debug"])
def test_a_daemons_store_failure_quoting_a_row_logs_no_reasoning(level: str) -> None:
    """A daemon on PostgreSQL whose reasoning's event append fails with an error quoting the
    payload (:data:`REFUSE_REASONING`), and requests with malformed and invalid bodies quoting
    the marker: the failure is logged by its code at ``info``, as raised at ``debug``."""
    with _daemon_refusing(REFUSE_REASONING, "--log-level", level) as (server, key):
        with httpx.Client(base_url=server.base_url, headers=auth(key), timeout=30) as c:
            c.post("/v1/runs", content=f'{{"prompt": "REASONING-{LEAK}" oops')
            c.post("/v1/runs", json={"prompt": [f"REASONING-{LEAK}"], "model": 3})
            _canary_run(c)
        time.sleep(0.5)  # the daemon's lines about the run's end
        logs = server.stdout_text() + "".join(server.stderr_lines)
    if level == "debug":
        assert f"REASONING-{LEAK}" in logs  # the developer's level: the words as raised
    else:
        assert "InvalidTextRepresentation (SQLSTATE 22P02)" in logs, logs  # the failure ...
        assert LEAK not in logs, logs  # ... without the payload it quoted


@pytest.fixture
def refusing_schema() -> Iterator[str]:
    """A store on PostgreSQL (its schema made by ``thoughtgate keys create``, a command that
    records: a read creates none) whose events must pass :data:`REFUSE_REASONING`."""
    schema = schema_name()
    url = f"{PG_URL}?schema={schema}"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "thoughtgate",
            "keys",
            "create",
            "--name",
            "setup",
            "--role",
            "viewer",
            "--db",
            url,
        ],
        env=cli_env(),
        cwd=str(REPO),
        capture_output=True,
        check=True,
        timeout=120,
    )
    try:
        _refuse(schema, REFUSE_REASONING)
        yield url
    finally:
        _admin("DROP SCHEMA IF EXISTS {} CASCADE", schema)


@pytest.mark.postgres
def test_the_clis_logs_of_a_store_failure_show_no_reasoning(refusing_schema: str) -> None:
    """``thoughtgate run`` logs the failure (Python's last-resort handler, WARNING and up) by
    its code, not with the payload its driver quoted."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "thoughtgate",
            "run",
            f"canary {LEAK}",
            "--model",
            "fake:canary",
            "--cot",
            "surface",
            "--tools",
            "support.served:SERVER_TOOLS",
            "--db",
            refusing_schema,
        ],
        env=cli_env(),
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert f"REASONING-{LEAK}" not in done.stderr + done.stdout
    assert "InvalidTextRepresentation (SQLSTATE 22P02)" in done.stderr, done.stderr


@pytest.mark.postgres
async def test_the_mcp_servers_logs_of_a_store_failure_show_no_reasoning(
    refusing_schema: str, tmp_path: Path
) -> None:
    """``thoughtgate mcp`` logs on stderr, which its host shows its user: the failure by its
    code, not with the payload its driver quoted."""
    from mcp import ClientSession, StdioServerParameters, stdio_client

    env = {k: v for k, v in cli_env().items() if k in ("PYTHONPATH", "HOME", "PATH", "TMPDIR")}
    params = StdioServerParameters(
        command=sys.executable,
        args=[
            *("-m", "thoughtgate", "mcp", "--db", refusing_schema, "--role", "developer"),
            *("--tools", "support.served:SERVER_TOOLS"),
        ],
        env=env,
        cwd=str(REPO),
    )
    errors = tmp_path / "stderr.txt"
    with errors.open("w") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            args = {
                "prompt": f"canary {LEAK}",
                "model": "fake:canary",
                "chain_of_thought": "surface",
            }
            result = await session.call_tool("orchestration_run", args)
            assert result.is_error
    logged = errors.read_text()
    assert f"REASONING-{LEAK}" not in logged
    assert "InvalidTextRepresentation (SQLSTATE 22P02)" in logged, logged


@pytest.mark.postgres
def test_a_runs_public_error_does_not_quote_its_drivers_words() -> None:
    """A ``StoreError`` quotes its driver's first line, which may hold a value (here the
    reasoning's payload a cast refused): a run's public ``error`` names the driver's error by
    its code; the words are in the developer-only ``error_detail``. Nor does the daemon's log
    quote them."""
    check = f"type <> 'reasoning.delta' OR {REFUSE_REASONING}"  # the run's end is stored
    with _daemon_refusing(check) as (server, key):
        with httpx.Client(base_url=server.base_url, headers=auth(key), timeout=30) as owner:
            made = owner.post("/v1/keys", json={"name": "member", "role": "member"}).json()
            run_id = _canary_run(owner)
            owners_events = owner.get(f"/v1/runs/{run_id}/events").text
        with httpx.Client(
            base_url=server.base_url, headers=auth(made["key"]), timeout=30
        ) as member:
            seen = member.get(f"/v1/runs/{run_id}").json()
            events = member.get(f"/v1/runs/{run_id}/events").text
        logs = server.stdout_text() + "".join(server.stderr_lines)
    assert seen["status"] == "failed"
    assert "InvalidTextRepresentation (SQLSTATE 22P02)" in seen["error"], seen
    assert f"REASONING-{LEAK}" not in str(seen) + events
    assert f"REASONING-{LEAK}" in owners_events  # the developer-only error_detail
    assert f"REASONING-{LEAK}" not in logs
