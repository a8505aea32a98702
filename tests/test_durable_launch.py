"""A durable engine's launch that fails leaves the process as if it had never launched (ADR 0125).

DBOS is one per process, and so is the engine that drives it (``DurableEngine.current``). A
launch that failed -- DBOS's workflows file unusable, a PostgreSQL server refusing, a queue that
could not be registered, a daemon's start-up failing after it -- used to leave the engine
current (every later attach of the process refused: "this process already executes durable runs
for another runtime") and DBOS's instance constructed. Now it destroys DBOS and clears the
engine, the caller is told what failed and where (never a password), the runtime admits no run
it could not execute, and a second launch in the same process runs a durable run to the end.

DBOS also bound its console handler to the ``sys.stderr`` of its first construction in the
process: swapped for a while and closed (``CliRunner``, Jupyter, pytest's capture), it failed
every later construction. thoughtgate's handler writes to the stderr of the moment.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import logging
import re
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from dbos import DBOS
from dbos import _dbos as dbos_module
from psycopg import sql
from support.daemon import cli
from support.durable_engine import InProcessDaemon
from support.pg import PG_URL, schema_name

from thoughtgate.config import Config
from thoughtgate.errors import (
    RuntimeFailure,
    StoreUnavailableError,
    ThoughtgateError,
    UsageError,
)
from thoughtgate.orchestration import dbos_logs
from thoughtgate.orchestration.durable import DurableEngine, prebuilt_dbos
from thoughtgate.orchestration.runtime import RunRequest
from thoughtgate.orchestration.specs import TaskSpec
from thoughtgate.server.app import create_app
from thoughtgate.server.manager import RunManager
from thoughtgate.store.base import EventStore
from thoughtgate.store.postgres import PostgresStore
from thoughtgate.store.sqlite import SQLiteStore
from thoughtgate.store.urls import open_store

pytestmark = pytest.mark.timeout(120)

TWO_TASKS = RunRequest(
    "hi", tasks=[TaskSpec("first", model="fake:echo"), TaskSpec("second", model="fake:echo")]
)
"""A run that executes as a DBOS workflow (two tasks: its first execution takes checkpoints)."""


def _no_engine_left() -> None:
    """The process as before any launch: no current engine, no DBOS instance."""
    assert DurableEngine.current is None
    assert prebuilt_dbos() is None


async def _a_durable_run_completes(store: EventStore) -> None:
    """A second engine attaches in this process, launches, and runs a workflow to its end."""
    async with InProcessDaemon.launched(store, Config(), like="run") as daemon:
        run = await daemon.runtime.run(TWO_TASKS)
        assert run.status == "completed", run
        assert [t.output for t in run.tasks] == ["Echo: first", "Echo: second"]
        found = await DBOS.list_workflows_async(load_input=False, load_output=False)
        assert [w.workflow_id for w in found] == [run.run_id]


@pytest.mark.inprocess
@pytest.mark.parametrize("like", ["run", "serve"])
async def test_a_launch_whose_workflows_file_cannot_be_opened_leaves_nothing_behind(
    tmp_path: Path, like: Any
) -> None:
    """A directory where DBOS's workflows file goes: the launch fails naming the file, the
    failed runtime admits no run (none is stored), and, without the failed engine being
    closed, another engine of the process launches and runs."""
    (tmp_path / "broken.db.workflows").mkdir()
    failed = InProcessDaemon(await SQLiteStore.open(tmp_path / "broken.db"), Config())
    with pytest.raises(StoreUnavailableError) as raised:
        await failed.launch(like=like)
    said = str(raised.value)
    assert said.startswith("cannot launch durable runs (open its workflows database): ")
    assert f"cannot open SQLite database {tmp_path / 'broken.db.workflows'}" in said
    assert not failed.engine.launched
    _no_engine_left()

    with pytest.raises(RuntimeFailure, match="durable runs cannot start in this process: ") as no:
        await failed.runtime.run(TWO_TASKS)
    assert said in str(no.value)
    with pytest.raises(RuntimeFailure):
        await failed.runtime.run(RunRequest("hi", model="fake:echo"))  # one without a workflow
    assert await failed.store.list_runs() == [], "a run that could not execute was stored"

    good = await SQLiteStore.open(tmp_path / "good.db")
    await _a_durable_run_completes(good)
    await failed.close()


def _fails_to_construct(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(self: DBOS, **_: Any) -> None:
        raise ValueError("No valid configuration was loaded.")

    monkeypatch.setattr(DBOS, "__init__", refused)


def _fails_to_register(monkeypatch: pytest.MonkeyPatch) -> None:
    async def refused(*_: Any, **__: Any) -> None:
        raise ConnectionError("the workflows database went away")

    monkeypatch.setattr(DBOS, "register_queue_async", refused)


def _is_cancelled(monkeypatch: pytest.MonkeyPatch) -> None:
    def cancelled() -> None:
        raise asyncio.CancelledError("stopped while launching")

    monkeypatch.setattr(DBOS, "launch", cancelled)


@pytest.mark.inprocess
@pytest.mark.parametrize(
    ("fail", "raises", "says"),
    [
        (_fails_to_construct, RuntimeFailure, "cannot launch durable runs (start DBOS) on SQLite"),
        (_fails_to_register, RuntimeFailure, "cannot launch durable runs (register the queue "),
        (_is_cancelled, asyncio.CancelledError, "stopped while launching"),
    ],
    ids=["constructing DBOS", "registering its queue", "cancelled"],
)
async def test_a_launch_that_fails_at_any_step_leaves_nothing_behind(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fail: Any,
    raises: type[BaseException],
    says: str,
) -> None:
    failed = InProcessDaemon(await SQLiteStore.open(tmp_path / "first.db"), Config())
    with monkeypatch.context() as patch:
        fail(patch)
        with pytest.raises(raises) as raised:
            await failed.launch(like="serve")
    assert says in str(raised.value)
    assert isinstance(raised.value, ThoughtgateError) or raises is asyncio.CancelledError
    assert not failed.engine.launched and failed.engine.queue is None
    _no_engine_left()
    await _a_durable_run_completes(await SQLiteStore.open(tmp_path / "second.db"))
    # The failed engine may launch again once the process's engine is gone, and runs.
    await failed.launch(like="run")
    try:
        assert (await failed.runtime.run(TWO_TASKS)).status == "completed"
    finally:
        await failed.close()
    _no_engine_left()


@pytest.mark.inprocess
@pytest.mark.parametrize("launched", [False, True], ids=["built", "launched"])
async def test_a_dbos_the_application_built_first_is_refused_and_left_as_it_was(
    tmp_path: Path, launched: bool
) -> None:
    """An application that built its own DBOS (and maybe launched it) before thoughtgate's
    launch: DBOS would hand thoughtgate that instance, configured by the application (its
    database, its serializer), and thoughtgate's runs would be checkpointed there. The launch
    is refused saying what to do (ADR 0136), the application's instance is left as it was
    (not destroyed, nothing of thoughtgate's in its database), no run is admitted; once the
    application destroyed its instance, the same engine launches and runs on its own."""
    apps = f"sqlite:///{tmp_path / 'app.sqlite'}"
    daemon = InProcessDaemon(await SQLiteStore.open(tmp_path / "store.db"), Config())
    try:
        theirs = DBOS(config={"name": "the-application", "system_database_url": apps})
        if launched:
            DBOS.launch()
        with pytest.raises(UsageError) as raised:
            await daemon.launch(like="run")
        said = str(raised.value)
        assert said.startswith(
            "cannot launch durable runs: this process already has a DBOS instance, built "
            "before this launch and not by thoughtgate"
        ), said
        assert f"SQLite database {tmp_path / 'store.db.workflows'}" in said
        assert "DBOS.destroy()" in said and "durability.enabled = false" in said
        assert prebuilt_dbos() is theirs
        assert theirs._launched is launched
        assert DurableEngine.current is None and not daemon.engine.launched
        with pytest.raises(RuntimeFailure, match="durable runs cannot start in this process: "):
            await daemon.runtime.run(TWO_TASKS)
        assert await daemon.store.list_runs() == []
        if launched:
            assert await DBOS.list_workflows_async() == []
        DBOS.destroy()
        await daemon.launch(like="run")
        run = await daemon.runtime.run(TWO_TASKS)
        assert run.status == "completed", run
    finally:
        await daemon.close()  # (a failure above leaves no engine, nor DBOS, to later tests)
        DBOS.destroy()
    _no_engine_left()


@pytest.mark.inprocess
def test_dbos_still_keeps_its_instance_where_the_launchs_check_reads_it() -> None:
    """DBOS has no public way to ask whether the process has built its instance: the launch
    reads the private global ``dbos._dbos._dbos_global_instance`` (``prebuilt_dbos``, ADR 0136
    amendment 1). This fails on a DBOS release that renamed or repurposed it, before anyone
    upgrades: none before DBOS is built, the instance once it is, none again once destroyed."""
    assert "_dbos_global_instance" in vars(dbos_module), "DBOS moved its instance: see ADR 0136"
    assert prebuilt_dbos() is None
    built = DBOS(config={"name": "the-application", "system_database_url": "sqlite:///:memory:"})
    try:
        assert prebuilt_dbos() is built
        assert dbos_module._dbos_global_instance is built
    finally:
        DBOS.destroy()
    assert prebuilt_dbos() is None


@pytest.mark.inprocess
@pytest.mark.parametrize("moved", ["renamed", "repurposed"])
async def test_a_dbos_that_moved_its_instance_fails_the_launch_saying_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, moved: str
) -> None:
    """Should a DBOS release keep its instance elsewhere, the launch cannot tell whether the
    application built one first: it refuses, naming the dbos version and what to do, rather
    than launch unchecked; nothing is built and no run is admitted."""
    if moved == "renamed":
        monkeypatch.delattr(dbos_module, "_dbos_global_instance")
    else:
        monkeypatch.setattr(dbos_module, "_dbos_global_instance", {"instances": []})
    daemon = InProcessDaemon(await SQLiteStore.open(tmp_path / "store.db"), Config())
    try:
        with pytest.raises(RuntimeFailure) as raised:
            await daemon.launch(like="run")
        said = str(raised.value)
        assert re.match(r"cannot launch durable runs: dbos \S+ no longer keeps", said), said
        assert "dbos._dbos._dbos_global_instance" in said and "ADR 0136" in said
        assert "durability.enabled = false" in said
        assert DurableEngine.current is None and not daemon.engine.launched
        with pytest.raises(RuntimeFailure, match="durable runs cannot start in this process: "):
            await daemon.runtime.run(TWO_TASKS)
        assert await daemon.store.list_runs() == []
    finally:
        await daemon.close()
        monkeypatch.undo()
    _no_engine_left()


@pytest.mark.inprocess
async def test_a_daemon_whose_start_up_fails_after_its_launch_closes_its_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon's start-up recovers the runs a stopped process left after launching: a
    failure there stops the start-up with the engine closed, not left current."""
    store = await SQLiteStore.open(tmp_path / "daemon.db")

    async def unreachable(self: RunManager) -> list[str]:
        raise StoreUnavailableError("the store went away while recovering")

    with monkeypatch.context() as patch:
        patch.setattr(RunManager, "recover", unreachable)
        daemon = InProcessDaemon(store, Config())
        app = create_app(daemon.runtime, shutdown_grace_s=0)
        with pytest.raises(StoreUnavailableError, match="while recovering"):
            async with app.router.lifespan_context(app):
                pytest.fail("the start-up succeeded")
    assert not daemon.engine.launched
    _no_engine_left()
    await _a_durable_run_completes(await SQLiteStore.open(tmp_path / "second.db"))
    await store.close()


@pytest.mark.external
@pytest.mark.parametrize(
    "command",
    [("run", "hi", "--model", "fake:echo"), ("serve", "--port", "0")],
    ids=["run", "serve"],
)
def test_a_command_whose_launch_fails_says_so_in_one_line_and_stores_nothing(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    """``thoughtgate run`` creates no run it could not execute; ``thoughtgate serve`` exits 1
    with the launch's error before it makes a bootstrap key nobody would be shown (ADR 0121),
    instead of a start-up traceback and exit 3."""
    (tmp_path / "store.db.workflows").mkdir()
    db = f"sqlite:///{tmp_path / 'store.db'}"
    done = cli(*command, "--db", db)
    assert done.returncode == 1, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines == [
        "error: cannot launch durable runs (open its workflows database): cannot open SQLite "
        f"database {tmp_path / 'store.db.workflows'} (unable to open database file); check that "
        "the file and its directory exist and are readable and writable"
    ], done.stderr

    async def stored() -> tuple[list[Any], list[Any]]:
        store = await open_store(db)
        try:
            return await store.list_runs(), await store.list_api_keys()
        finally:
            await store.close()

    assert asyncio.run(stored()) == ([], [])


@pytest.mark.postgres
async def test_a_postgresql_server_that_refuses_fails_the_launch_without_its_password(
    tmp_path: Path,
) -> None:
    """The workflows' server refuses connections (nothing listens on its port): the error names
    the database, not the password of the URL; the same store then launches on its server."""
    schema = schema_name()
    with socket.socket() as closed:  # bound, never listening: a connection is refused
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        store = await PostgresStore.open(PG_URL, schema=schema)
        try:
            failed = InProcessDaemon(store, Config())
            refusing = f"postgresql://postgres:hunter2-secret@127.0.0.1:{port}/test"
            failed.engine.location = dataclasses.replace(failed.engine.location, url=refusing)
            with pytest.raises(StoreUnavailableError) as raised:
                await failed.launch()
            said = str(raised.value)
            assert f"127.0.0.1:{port}" in said and f"schema {schema}_workflows" in said
            assert "hunter2" not in said and "hunter2" not in repr(raised.value.public)
            _no_engine_left()
            await _a_durable_run_completes(store)
        finally:
            await store.close()
            with psycopg.connect(PG_URL, autocommit=True) as admin:
                for name in (schema, f"{schema}_workflows"):
                    admin.execute(
                        sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name))
                    )


@pytest.fixture
def fresh_dbos_logger() -> Iterator[logging.Logger]:
    """The ``dbos`` logger as in a process where DBOS never ran: no handler of its own (DBOS
    adds its console handler at its first construction when there is none). pytest's capture
    handlers, which pytest attaches to every logger that does not propagate, stay."""
    logger = logging.getLogger("dbos")
    kept = [h for h in logger.handlers if type(h).__module__ != "_pytest.logging"]
    propagate = logger.propagate
    for handler in kept:
        logger.removeHandler(handler)
    yield logger
    for handler in kept:
        gone = handler.get_name() == dbos_logs.DBOS_CONSOLE_HANDLER  # bound to a closed stderr
        if not gone and not isinstance(handler, dbos_logs.CurrentStderr):  # (one is installed)
            logger.addHandler(handler)
    logger.propagate = propagate
    dbos_logs.install()


@pytest.mark.inprocess
async def test_a_launch_after_the_stderr_of_the_first_was_swapped_and_closed_works(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    fresh_dbos_logger: logging.Logger,
) -> None:
    """The first launch of the process runs while ``sys.stderr`` is a file an application
    swapped in and closes after (as ``CliRunner`` does: a closed text file's ``flush`` raises,
    which DBOS's construction calls on its handlers); the next launch, on the stderr swapped
    back, works and DBOS's lines go to that stderr. At thoughtgate's debug level DBOS logs its
    start; at the default level only its errors."""
    caplog.set_level(logging.DEBUG, logger="thoughtgate")  # as ``serve --log-level debug``
    written = io.BytesIO()
    swapped = io.TextIOWrapper(written, encoding="utf-8")  # what CliRunner swaps in
    original = sys.stderr
    monkeypatch.setattr(sys, "stderr", swapped)
    async with InProcessDaemon.launched(
        await SQLiteStore.open(tmp_path / "first.db"), Config(), like="run"
    ):
        pass
    swapped.flush()
    first = written.getvalue().decode()
    swapped.close()
    monkeypatch.setattr(sys, "stderr", original)
    capsys.readouterr()

    await _a_durable_run_completes(await SQLiteStore.open(tmp_path / "second.db"))
    err = capsys.readouterr().err
    assert "INFO: dbos: Initializing DBOS" in first
    assert "INFO: dbos: Initializing DBOS" in err
    names = [h.get_name() for h in fresh_dbos_logger.handlers]
    assert names.count("thoughtgate-dbos-stderr") == 1
    assert dbos_logs.DBOS_CONSOLE_HANDLER not in names

    caplog.set_level(logging.WARNING, logger="thoughtgate")  # as ``thoughtgate run``
    await _a_durable_run_completes(await SQLiteStore.open(tmp_path / "third.db"))
    assert "dbos" not in capsys.readouterr().err
