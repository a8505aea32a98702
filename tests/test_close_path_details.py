"""A run closed because it could not resume, be queued again or be started (ADRs 0059-0063)
keeps the failure's own words apart from its public reason (ADR 0073).

The public ``reason`` (and the run's ``error``) names the failure by its class; the words --
a library's exception, which may quote anything -- go to ``run.interrupted``'s
``error_detail``: developers read them on a ``surface`` run, viewers never, and on a ``hidden``
run they are not recorded at all. Each close path is driven for real: the sweep's put-back of a
queued run on no queue, the sweep's release of a run whose process stopped, and a daemon that
cannot continue a run as a workflow (the real DBOS engine).
"""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from support.durable import one_lookup, queued_run, until
from support.durable_engine import InProcessDaemon
from typer.testing import CliRunner

from thoughtgate.access.filter import filter_event, filter_run
from thoughtgate.cli import app
from thoughtgate.cli.render import LivePrinter
from thoughtgate.config import Config
from thoughtgate.events.schema import Event
from thoughtgate.orchestration.runtime import RunRequest
from thoughtgate.store.durable import RunSpecRecord
from thoughtgate.store.leases import Owner, close_orphaned_runs
from thoughtgate.store.sqlite import SQLiteStore
from thoughtgate.testing.fake import FAKE_SCRIPTS

pytestmark = [pytest.mark.inprocess, pytest.mark.timeout(60)]

SECRET = "CLOSE-PATH-SECRET-5D1"
"""In the failing library's message: what a quote of a checkpoint or a request would be."""

KEEPS = {"surface": True, "telemetry_only": True, "hidden": False}
"""Whether a run of the mode records ``error_detail`` (where reasoning is recorded)."""


def _refusal() -> RuntimeError:
    return RuntimeError(f"the queue refused {SECRET}\n[parameters: more {SECRET}]")


async def _check(store: SQLiteStore, run_id: str, mode: str) -> None:
    """The run closed interrupted; its public texts name the class only, its words are detail
    for developers where the mode records them, and nowhere at all on a ``hidden`` run."""
    run = await store.get_run(run_id)
    assert run.status == "interrupted" and run.error is not None
    assert "RuntimeError" in run.error and SECRET not in run.error
    events = await store.read(run_id)
    (ended,) = [e for e in events if e.type == "run.interrupted"]
    assert SECRET not in ended.payload["reason"]
    if KEEPS[mode]:
        # the first line only, as every detail (ADR 0069): never the lines after it
        assert ended.payload["error_detail"] == f"RuntimeError: the queue refused {SECRET}"
        developer = filter_event(ended, "developer", mode=mode, surface="trace")
        assert developer is not None and SECRET in developer.payload["error_detail"]
    else:
        assert "error_detail" not in ended.payload
        assert all(SECRET not in repr(e.payload) for e in events), "recorded nowhere"
    for role in ("viewer", "member"):  # the trace is developers' only
        seen = filter_event(ended, role, mode=mode)
        assert seen is not None and SECRET not in repr(seen.payload)
    assert SECRET not in repr(filter_run(run, "viewer").to_json())
    if mode == "surface":
        shown = filter_event(ended, "developer", mode=mode)
        assert shown is not None and SECRET in shown.payload["error_detail"]


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    opened = await SQLiteStore.open(tmp_path / "runs.db")
    try:
        yield opened
    finally:
        await opened.close()


async def _closed_queued_run(store: SQLiteStore, mode: str) -> str:
    """A queued durable run on no queue whose put-back fails: the sweep closes it."""
    run_id = await queued_run(store, chain_of_thought=mode)

    async def requeue(run_id: str, spec: RunSpecRecord) -> None:
        raise _refusal()

    async def on_queue(run_ids: Sequence[str]) -> dict[str, float | None]:
        return {}  # on no queue (ADR 0062)

    closed = await close_orphaned_runs(store, requeue=requeue, on_queue=on_queue, lost_after_s=0)
    assert closed == [run_id]
    return run_id


@pytest.mark.parametrize("mode", sorted(KEEPS))
async def test_a_queued_run_that_cannot_be_queued_again_keeps_the_words_apart(
    store: SQLiteStore, mode: str
) -> None:
    run_id = await _closed_queued_run(store, mode)
    await _check(store, run_id, mode)


@pytest.mark.parametrize("role", ["viewer", "developer"])
def test_thoughtgate_events_shows_the_words_to_developers_only(tmp_path: Path, role: str) -> None:
    path = tmp_path / "runs.db"

    async def record() -> str:
        opened = await SQLiteStore.open(path)
        try:
            return await _closed_queued_run(opened, "surface")
        finally:
            await opened.close()

    run_id = asyncio.run(record())
    db = f"sqlite:///{path}"
    shown = CliRunner().invoke(app, ["events", run_id, "--db", db, "--view-as", role, "--json"])
    assert shown.exit_code == 0, shown.output
    (ended,) = [e for e in json.loads(shown.stdout) if e["type"] == "run.interrupted"]
    assert ended["payload"]["reason"].endswith("it could not be queued again: RuntimeError")
    if role == "developer":
        assert ended["payload"]["error_detail"] == f"RuntimeError: the queue refused {SECRET}"
    else:
        assert SECRET not in shown.stdout


def test_the_live_printer_says_why_an_interrupted_run_could_not_go_on() -> None:
    """``thoughtgate run`` prints the words under the interruption when its copy has them."""
    out = io.StringIO()
    printer = LivePrinter(Console(file=out, width=200))
    payload = {"status": "interrupted", "reason": "it could not resume: RuntimeError"}
    printer.show(
        Event(1, "run_x", "run.interrupted", {**payload, "error_detail": "RuntimeError: gone"})
    )
    printer.show(Event(2, "run_y", "run.interrupted", payload))
    printer.end()
    lines = [line.strip() for line in out.getvalue().splitlines() if line.strip()]
    assert lines == [
        "interrupted: it could not resume: RuntimeError",
        "said: RuntimeError: gone",
        "interrupted: it could not resume: RuntimeError",
    ]


@pytest.mark.parametrize("mode", ["surface", "hidden"])
async def test_a_run_whose_process_stopped_and_cannot_resume_keeps_the_words_apart(
    tmp_path: Path, mode: str
) -> None:
    store = await SQLiteStore.open(tmp_path / "runs.db")
    daemon = InProcessDaemon(store, Config())
    await daemon.launch()
    try:
        runtime, engine = daemon.runtime, daemon.engine
        run, _ = await runtime.admit(
            RunRequest("hi", model="fake:echo", chain_of_thought=mode), queue=daemon.queue
        )
        engine.unreserve(run.run_id)  # it never starts here: as if its process had stopped
        runtime.forget_admitted(run.run_id)
        me = runtime.leases.owner

        async def requeue(run_id: str, _: object) -> None:
            raise _refusal()

        restarted = Owner(me.host, me.pid, "restarted")
        await close_orphaned_runs(store, me=restarted, requeue=requeue)
        await _check(store, run.run_id, mode)
    finally:
        await daemon.close()


@pytest.mark.parametrize("mode", ["surface", "hidden"])
async def test_a_run_that_cannot_continue_as_a_workflow_keeps_the_words_apart(
    tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(FAKE_SCRIPTS, "unasked-tool", one_lookup)  # needs a checkpoint
    store = await SQLiteStore.open(tmp_path / "runs.db")
    daemon = InProcessDaemon(store, Config())
    await daemon.launch()

    async def refused(run_id: str) -> Any:
        raise _refusal()

    try:
        monkeypatch.setattr(daemon.engine, "start", refused)
        run, rank = await daemon.runtime.admit(
            RunRequest("hi", model="fake:unasked-tool", chain_of_thought=mode),
            queue=daemon.queue,
        )
        await daemon.engine.submit(run.run_id, daemon.queue, priority=rank)
        await until(lambda: daemon.ended(run.run_id))
        assert "could not continue as a workflow" in ((await store.get_run(run.run_id)).error or "")
        await _check(store, run.run_id, mode)
    finally:
        await daemon.close()
