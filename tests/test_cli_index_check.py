"""``thoughtgate check-index`` as an operator runs it: runs made by the real runtime (a fake
provider whose reasoning carries a canary), index rows then tampered with in SQL, the command
run through the CLI. The check names exactly the tampered run and fields, with exit code 4;
``--repair`` rebuilds it from the log and a second check is clean; a run still executing in
another thread is not touched without ``--include-open``; a store that is not there is not
created; no reasoning, answer or error text is ever printed."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from support.pg import PG_URL, schema_name
from typer.testing import CliRunner

from thoughtgate.cli import app
from thoughtgate.cli import index_check as cli_index_check
from thoughtgate.orchestration.runtime import RunRequest, Runtime
from thoughtgate.providers.base import TurnRequest
from thoughtgate.store import projection
from thoughtgate.store.urls import open_store
from thoughtgate.testing.fake import FakeProvider, reasoning, text
from thoughtgate.types import Chunk, UsageChunk

CANARY = "CANARY-index-check-reasoning-5b1e"
ANSWER = "The answer, never printed by the check."
PROMPT = "Which prompt? (never printed by the check)"
ERROR_TEXT = "ERROR-TEXT-written-by-hand-9c2f"
LOCAL = {"THOUGHTGATE_URL": None, "THOUGHTGATE_KEY": None, "COLUMNS": "200"}
Tamper = Callable[[str, tuple[Any, ...]], None]


async def _answer(request: TurnRequest, turn: int) -> AsyncIterator[Chunk]:
    yield reasoning(f"Let me think ({CANARY}).")
    yield text(ANSWER)
    yield UsageChunk(input_tokens=11, output_tokens=7, reasoning_tokens=3)


def _provider(model: str) -> FakeProvider:
    return FakeProvider(_answer, model=model)


async def _make_runs(db: str, count: int) -> list[str]:
    """``count`` runs executed to their end by the runtime, alternately ``surface`` (their
    reasoning in the index too) and ``hidden``; their ids, oldest first."""
    store = await open_store(db)
    try:
        runtime = Runtime(store, provider_factory=_provider)
        ids = []
        for i in range(count):
            mode = "surface" if i % 2 == 0 else "hidden"
            run = await runtime.create_run(
                RunRequest(PROMPT, model="fake:answer"), chain_of_thought=mode
            )
            await runtime.execute(run.run_id)
            ids.append(run.run_id)
        return ids
    finally:
        await store.close()


async def _row(db: str, run_id: str) -> tuple[str, dict[str, int], str | None, list[Any]]:
    store = await open_store(db)
    try:
        run = await store.get_run(run_id)
        return run.status, run.usage, run.error, [(t.status, t.output) for t in run.tasks]
    finally:
        await store.close()


def check_index(*args: str) -> tuple[int, str, str]:
    """``thoughtgate check-index ARGS``: exit code, stdout, stderr."""
    result = CliRunner().invoke(app, ["check-index", *args], env=LOCAL)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def check_json(*args: str) -> tuple[int, dict[str, Any]]:
    code, out, err = check_index(*args, "--json")
    _no_text(out + err)
    document: dict[str, Any] = json.loads(out)
    return code, document


def _no_text(printed: str) -> None:
    for secret in (CANARY, ANSWER, PROMPT, ERROR_TEXT):
        assert secret not in printed


def _fields(document: dict[str, Any]) -> dict[str, list[tuple[str, str | None]]]:
    return {
        run["run_id"]: [(d["field"], d["task_id"]) for d in run["differences"]]
        for run in document["runs"]
    }


# -- check and repair ----------------------------------------------------------------------------


def check_and_repair(db: str, tamper: Tamper) -> None:
    """Three runs; the middle one's row says ``failed`` with made-up usage, an error written by
    hand and another answer: the check names exactly it, repair restores what the log says."""
    ids = asyncio.run(_make_runs(db, 3))
    target = ids[1]
    good = asyncio.run(_row(db, target))
    assert good[0] == "completed" and good[3] == [("completed", ANSWER)]
    tamper(
        "UPDATE {runs} SET status = 'failed', usage = {json}, error = {p} WHERE run_id = {p}",
        ('{"input_tokens": 999}', ERROR_TEXT, target),
    )
    tamper("UPDATE {tasks} SET output = {p} WHERE run_id = {p}", (f"{CANARY} by hand", target))

    code, found = check_json("--db", db)
    assert code == 4
    assert (found["checked"], found["disagreeing"]) == (3, 1)
    (task_id,) = [t for f, t in _fields(found)[target] if t is not None]
    assert _fields(found) == {
        target: [("status", None), ("usage", None), ("error", None), ("output", task_id)]
    }
    by_field = {d["field"]: d for d in found["runs"][0]["differences"]}
    assert (by_field["status"]["index"], by_field["status"]["log"]) == ("failed", "completed")
    assert by_field["usage"]["index"] == {"input_tokens": 999}
    assert by_field["usage"]["log"]["input_tokens"] == good[1]["input_tokens"]
    # text only by its length
    assert by_field["error"]["index"] == {"withheld": "text", "chars": len(ERROR_TEXT)}
    assert by_field["error"]["log"] is None
    assert by_field["output"]["log"] == {"withheld": "text", "chars": len(ANSWER)}
    assert found["runs"][0]["open"] is False

    code, out, err = check_index("--db", db)  # the table for people, the same exit code
    assert code == 4 and target in out and "1 disagrees with the log" in out
    assert "<text, " in out
    _no_text(out + err)

    code, repaired = check_json("--db", db, "--repair")
    assert code == 0
    assert (repaired["repaired"], repaired["left"], repaired["skipped_open"]) == (1, 0, 0)
    assert {d["state"] for d in repaired["runs"][0]["differences"]} == {"repaired"}
    assert asyncio.run(_row(db, target)) == good

    code, clean = check_json("--db", db)
    assert code == 0 and (clean["checked"], clean["disagreeing"], clean["runs"]) == (3, 0, [])


def _sqlite_tamper(path: Path) -> Tamper:
    def tamper(statement: str, params: tuple[Any, ...]) -> None:
        query = statement.format(runs="runs", tasks="tasks", json="?", p="?")
        with contextlib.closing(sqlite3.connect(path)) as conn, conn:
            assert conn.execute(query, params).rowcount == 1

    return tamper


@pytest.mark.inprocess
def test_check_names_the_tampered_run_and_repair_rebuilds_it_on_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "tg.db"
    check_and_repair(f"sqlite:///{path}", _sqlite_tamper(path))


@pytest.mark.inprocess
def test_usage_is_shown_as_its_declaration_allows_reasoning_tokens_on_surface_runs_only(
    tmp_path: Path,
) -> None:
    """Reasoning token counts are derived from the reasoning (class ``reasoning``): on a
    ``hidden`` run no surface shows them to anyone, so neither does the check, in JSON or in its
    table; on a ``surface`` run the admin sees them, as on every display surface."""
    path = tmp_path / "tg.db"
    db = f"sqlite:///{path}"
    surface, hidden = asyncio.run(_make_runs(db, 2))
    tamper = _sqlite_tamper(path)
    for run_id in (surface, hidden):
        tamper(
            "UPDATE {runs} SET usage = {json} WHERE run_id = {p}",
            ('{"input_tokens": 999, "reasoning_tokens": 4242}', run_id),
        )
    code, found = check_json("--db", db)
    assert code == 4
    usage = {
        run["run_id"]: next(d for d in run["differences"] if d["field"] == "usage")
        for run in found["runs"]
    }
    assert usage[surface]["index"] == {"input_tokens": 999, "reasoning_tokens": 4242}
    assert usage[surface]["log"]["reasoning_tokens"] == 3
    assert usage[hidden]["index"] == {
        "input_tokens": 999,
        "reasoning_tokens": {"withheld": "reasoning"},
    }
    assert usage[hidden]["log"]["reasoning_tokens"] == {"withheld": "reasoning"}
    assert isinstance(usage[hidden]["log"]["input_tokens"], int), "the other counts are shown"
    code, out, _ = check_index("--db", db, hidden)
    assert code == 4 and "=4242" not in out  # (the table's width may fold a cell: see below)
    tampered = {"input_tokens": 999, "reasoning_tokens": 4242}
    shown = cli_index_check._shown("usage", tampered, "owner", "hidden")
    assert shown == "input_tokens=999 reasoning_tokens=<withheld>"
    assert "=4242" in cli_index_check._shown("usage", tampered, "owner", "surface")


@pytest.mark.external
@pytest.mark.postgres
def test_check_names_the_tampered_run_and_repair_rebuilds_it_on_postgres() -> None:
    schema = schema_name()

    def tamper(statement: str, params: tuple[Any, ...]) -> None:
        query = sql.SQL(statement).format(
            runs=sql.Identifier(schema, "runs"),
            tasks=sql.Identifier(schema, "tasks"),
            json=sql.SQL("%s::json"),
            p=sql.SQL("%s"),
        )
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            assert conn.execute(query, params).rowcount == 1

    try:
        check_and_repair(f"{PG_URL}?schema={schema}", tamper)
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@pytest.mark.inprocess
def test_the_walk_pages_runs_and_logs_and_takes_runs_filters_or_ids(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pages of two runs and of three events: every run is checked once, a log longer than a
    page is folded whole (no difference where there is none), and the tampered runs are found
    whichever page holds them."""
    path = tmp_path / "tg.db"
    db = f"sqlite:///{path}"
    ids = asyncio.run(_make_runs(db, 5))
    monkeypatch.setattr(cli_index_check, "PAGE", 2)
    monkeypatch.setattr(projection, "CHECK_PAGE", 3)
    assert check_json("--db", db) == (
        0,
        {
            "checked": 5,
            "disagreeing": 0,
            "repair": False,
            "repaired": 0,
            "skipped_open": 0,
            "left": 0,
            "runs": [],
        },
    )
    tamper = _sqlite_tamper(path)
    for run_id in (ids[0], ids[3]):
        tamper("UPDATE {runs} SET status = 'partial' WHERE run_id = {p}", (run_id,))
    code, found = check_json("--db", db)
    assert code == 4 and found["checked"] == 5
    assert set(_fields(found)) == {ids[0], ids[3]}
    # a filter selects by the index's values: the tampered ones say partial
    code, partial = check_json("--db", db, "--status", "partial")
    assert code == 4 and partial["checked"] == 2 and set(_fields(partial)) == {ids[0], ids[3]}
    code, hidden = check_json("--db", db, "--mode", "hidden")  # ids 1 and 3
    assert code == 4 and hidden["checked"] == 2 and set(_fields(hidden)) == {ids[3]}
    # named runs, by a unique start of their id
    code, named = check_json("--db", db, ids[1][4:16], ids[3])
    assert code == 4 and named["checked"] == 2 and set(_fields(named)) == {ids[3]}
    code, _, err = check_index("--db", db, ids[1], "--status", "partial")
    assert code == 2 and "not both" in err


# -- an open run ---------------------------------------------------------------------------------


@contextlib.contextmanager
def executing_run(db: str) -> Iterator[str]:
    """A run the runtime is executing in another thread (its own event loop and store
    connection), held mid-answer until the block ends; then it completes."""
    answering, release = threading.Event(), threading.Event()
    made: list[str] = []

    async def stalls(request: TurnRequest, turn: int) -> AsyncIterator[Chunk]:
        yield reasoning(f"Thinking ({CANARY}).")
        yield text("An answer ")
        answering.set()
        await asyncio.to_thread(release.wait)
        yield text("in two parts.")

    async def execute() -> None:
        store = await open_store(db)
        try:
            runtime = Runtime(store, provider_factory=lambda m: FakeProvider(stalls, model=m))
            run = await runtime.create_run(RunRequest(PROMPT, model="fake:stalls"))
            made.append(run.run_id)
            await runtime.execute(run.run_id)
        finally:
            await store.close()

    worker = threading.Thread(target=asyncio.run, args=(execute(),))
    worker.start()
    try:
        assert answering.wait(60), "the run never started answering"
        yield made[0]
    finally:
        release.set()
        worker.join(60)


@pytest.mark.inprocess
def test_an_open_run_is_rebuilt_only_with_include_open(tmp_path: Path) -> None:
    path = tmp_path / "tg.db"
    db = f"sqlite:///{path}"
    (ended,) = asyncio.run(_make_runs(db, 1))
    tamper = _sqlite_tamper(path)
    with executing_run(db) as run_id:
        # a row edited by hand while its run executes, and an ended run's
        for tampered in (run_id, ended):
            tamper("UPDATE {runs} SET status = 'completed' WHERE run_id = {p}", (tampered,))
        tamper("UPDATE {runs} SET status = 'failed' WHERE run_id = {p}", (ended,))

        code, found = check_json("--db", db)
        assert code == 4 and set(_fields(found)) == {run_id, ended}
        opened = {run["run_id"]: run["open"] for run in found["runs"]}
        assert opened == {run_id: True, ended: False}

        code, skipped = check_json("--db", db, "--repair")
        assert code == 4  # the open run still disagrees
        assert (skipped["repaired"], skipped["skipped_open"]) == (1, 1)
        results = {run["run_id"]: run["result"] for run in skipped["runs"]}
        assert results == {run_id: "skipped: open", ended: "repaired"}
        assert asyncio.run(_row(db, run_id))[0] == "completed"  # untouched
        assert asyncio.run(_row(db, ended))[0] == "completed"

        code, out, _ = check_index("--db", db, "--repair")
        assert code == 4 and "--include-open" in out

        code, rebuilt = check_json("--db", db, "--repair", "--include-open")
        assert code == 0 and rebuilt["repaired"] == 1
        assert asyncio.run(_row(db, run_id))[0] == "running"  # what its log says
    # the rebuilt run went on to its end as if nothing had happened
    status, _, _, tasks = asyncio.run(_row(db, run_id))
    assert (status, tasks) == ("completed", [("completed", "An answer in two parts.")])
    assert check_json("--db", db)[0] == 0


# -- who, where, and a store that is not there ---------------------------------------------------


@pytest.mark.inprocess
def test_a_missing_store_is_not_created(tmp_path: Path) -> None:
    path = tmp_path / "nowhere" / "tg.db"
    db = f"sqlite:///{path}"
    code, out, err = check_index("--db", db, "--repair")
    assert code == 0 and "checked 0 runs" in out and str(path) in err
    code, _, err = check_index("--db", db, "run_abc")
    assert code == 2 and str(path) in err
    assert not path.exists() and not path.parent.exists()


@pytest.mark.inprocess
def test_only_admins_check_and_only_the_local_store(tmp_path: Path) -> None:
    path = tmp_path / "tg.db"
    db = f"sqlite:///{path}"
    (run_id,) = asyncio.run(_make_runs(db, 1))
    _sqlite_tamper(path)("UPDATE {runs} SET status = 'failed' WHERE run_id = {p}", (run_id,))
    config = tmp_path / "thoughtgate.toml"
    config.write_text('[access]\nlocal_role = "developer"\n', encoding="utf-8")
    code, out, err = check_index("--db", db, "--config", str(config), "--repair")
    assert code == 2 and "requires role admin" in err and run_id not in out
    assert asyncio.run(_row(db, run_id))[0] == "failed"
    config.write_text('[access]\nlocal_role = "admin"\n', encoding="utf-8")
    assert check_index("--db", db, "--config", str(config))[0] == 4
    code, _, err = check_index("--db", db, "--url", "http://127.0.0.1:9")
    assert code == 2 and "check-index cannot be used with --url" in err
    code, _, err = check_index("--db", db, "--include-open")
    assert code == 2 and "--repair" in err


@pytest.mark.unit
def test_a_field_no_rule_names_is_shown_by_its_length_only() -> None:
    """Fail closed: a field a later projection compares is withheld until it is named shown."""
    from thoughtgate.cli import index_check

    secret = "CANARY-reasoning-text"
    assert "reasoning" not in index_check.SHOWN_FIELDS
    assert secret not in index_check._shown("reasoning", secret)
    assert index_check._shown("reasoning", secret) == f"<text, {len(secret)} chars>"
    assert index_check._shown("status", "failed") == '"failed"'
