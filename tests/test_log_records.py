"""No exception's own words in any log below ``--log-level debug`` (ADR 0104).

A store's, a provider's or a library's exception quotes data: PostgreSQL's DETAIL the failing
row (reasoning included), a provider's error its response body, pydantic its input values,
orjson a fragment of its input. These tests drive such failures through real log paths -- a
``thoughtgate serve`` on PostgreSQL, ``log.exception`` and ``%s`` call sites, asyncio's and
uvicorn's own error lines -- and look for the marker in what was written.
"""

from __future__ import annotations

import asyncio
import gc
import io
import logging
import time
import uuid
from collections.abc import Iterator

import httpx
import orjson
import psycopg
import pydantic
import pytest
from psycopg import sql
from support.daemon import ServeProcess, auth
from support.pg import PG_URL

from thoughtgate import log_records
from thoughtgate.errors import ProviderError, StoreError
from thoughtgate.log_records import exception_summary, safe_traceback
from thoughtgate.store.pg_errors import translate_error

LEAK = "LOGLEAK"


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


@pytest.mark.external
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


@pytest.mark.external
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


@pytest.mark.external
def test_at_debug_the_words_are_logged_as_raised(
    failures: list[BaseException], written: io.StringIO
) -> None:
    log_records.install(full=True)
    logging.getLogger("thoughtgate.test").warning("stopped: %s", failures[0])
    assert f"REASONING-{LEAK}" in written.getvalue()


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


@pytest.mark.external
@pytest.mark.parametrize("level", ["info", "debug"])
def test_a_daemons_store_failure_quoting_a_row_logs_no_reasoning(level: str) -> None:
    """A daemon on PostgreSQL whose reasoning's event append fails with an error quoting the
    payload in its first line (a cast in a CHECK constraint: any constraint, trigger, index or
    generated column that casts a value quotes it so), and requests with malformed and invalid
    bodies quoting the marker: the failure is logged by its code at ``info``, as raised at
    ``debug``."""
    schema = f"tg_test_{uuid.uuid4().hex[:12]}"
    server = ServeProcess(
        "--db",
        f"{PG_URL}?schema={schema}",
        "--log-level",
        level,
        "--tools",
        "support.served:SERVER_TOOLS",
    )
    server.start(expect_key=True)
    try:
        with psycopg.connect(PG_URL, autocommit=True, connect_timeout=5) as admin:
            admin.execute(
                sql.SQL(
                    "ALTER TABLE {}.events ADD CONSTRAINT reasoning_is_a_number CHECK "
                    "(payload::text NOT LIKE '%%REASONING-%%' OR payload::text::int > 0) NOT VALID"
                ).format(sql.Identifier(schema))
            )
        key = server.bootstrap_key
        assert key
        with httpx.Client(base_url=server.base_url, headers=auth(key), timeout=30) as c:
            c.post("/v1/runs", content=f'{{"prompt": "REASONING-{LEAK}" oops')
            c.post("/v1/runs", json={"prompt": [f"REASONING-{LEAK}"], "model": 3})
            body = {
                "prompt": f"canary {LEAK}",
                "model": "fake:canary",
                "chain_of_thought": "surface",
            }
            run_id = c.post("/v1/runs", json=body).json()["run_id"]
            deadline = time.monotonic() + 60
            while c.get(f"/v1/runs/{run_id}").json()["status"] in ("queued", "running"):
                assert time.monotonic() < deadline, "the run did not end"
                time.sleep(0.2)
        time.sleep(0.5)  # the daemon's lines about the run's end
        logs = server.stdout_text() + "".join(server.stderr_lines)
        if level == "debug":
            assert f"REASONING-{LEAK}" in logs  # the developer's level: the words as raised
        else:
            assert "InvalidTextRepresentation (SQLSTATE 22P02)" in logs, (
                logs
            )  # the failure is logged ...
            assert LEAK not in logs, logs  # ... without the row it quoted
    finally:
        server.stop()
        with psycopg.connect(PG_URL, autocommit=True, connect_timeout=5) as admin:
            admin.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
            )
