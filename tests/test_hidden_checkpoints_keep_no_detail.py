"""A ``hidden`` run's checkpoints keep no failure's own words (ADR 0073).

ADR 0071 keeps a failure's words (``error_detail``) out of a ``hidden`` run's events; the
durable engine also stores each step's result in its workflows database (DBOS's step outputs),
where a model turn's result carried the provider's error text whatever the mode, and a step's
foreign exception its whole message. Here a provider refuses the first of two tasks (its turn is
checkpointed: it does not end the run) with a text quoting the request; the workflows database
of a ``hidden`` run holds no byte of it, that of a ``surface`` run does (the detail a resumed
execution records for developers), and either way the run's ending is the same.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from support.durable import until
from support.durable_engine import InProcessDaemon
from support.scripts import failing

from thoughtgate.config import Config
from thoughtgate.engine.steps import StepCodec
from thoughtgate.errors import ProviderHTTPError, ReplayedFailure, failure_detail, failure_text
from thoughtgate.orchestration.durable import DbosSteps
from thoughtgate.orchestration.runtime import RunRequest
from thoughtgate.orchestration.specs import TaskSpec
from thoughtgate.providers.base import TurnRequest
from thoughtgate.store.sqlite import SQLiteStore
from thoughtgate.testing.fake import FAKE_SCRIPTS

SECRET = "CHECKPOINT-SECRET-9B2"


def _refused(request: TurnRequest, turn: int) -> AsyncIterator[Any]:
    """The provider refuses the turn, quoting the request back (as an upstream's raw body may)."""
    return failing(
        ProviderHTTPError(
            f"prompt rejected: '{SECRET}'",
            provider="fake",
            status=400,
            error_type="invalid_request_error",
            by_provider=True,
        )
    )


def _workflows_text(store_path: Path) -> str:
    """Every value in every table of the store's workflows database, as one text."""
    found: list[str] = []
    with sqlite3.connect(f"{store_path}.workflows") as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for table in tables:
            for row in conn.execute(f'SELECT * FROM "{table}"'):  # noqa: S608 - names from sqlite
                found.append(repr(row))
    return "\n".join(found)


@pytest.mark.inprocess
@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["hidden", "surface"])
async def test_a_hidden_run_s_checkpoints_hold_no_provider_words(
    tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(FAKE_SCRIPTS, "refused-quoting", _refused)
    store = await SQLiteStore.open(tmp_path / "runs.db")
    daemon = InProcessDaemon(store, Config())
    await daemon.launch()
    try:
        tasks = (TaskSpec("first", model="fake:refused-quoting"), TaskSpec("second"))
        run, rank = await daemon.runtime.admit(
            RunRequest("hi", model="fake:echo", chain_of_thought=mode, tasks=tasks),
            queue=daemon.queue,
        )
        await daemon.engine.submit(run.run_id, daemon.queue, priority=rank)
        await until(lambda: daemon.ended(run.run_id))
        ran = await store.get_run(run.run_id)
        assert [t.status for t in ran.tasks] == ["failed", "completed"]
        assert SECRET not in (ran.tasks[0].error or "")
        saved = _workflows_text(tmp_path / "runs.db")
        assert "model turn" in saved, "the first task's turn was checkpointed"
        if mode == "hidden":
            assert SECRET not in saved
            assert all(SECRET not in repr(e.payload) for e in await store.read(run.run_id))
        else:
            assert SECRET in saved  # kept where the run records reasoning, for its resume
    finally:
        await daemon.close()


_CODEC = StepCodec(lambda value: value, lambda data: data)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("mode", "kept"), [("hidden", False), ("telemetry_only", True), ("surface", True)]
)
async def test_a_step_s_foreign_exception_is_checkpointed_by_its_class_on_hidden_runs(
    mode: str, kept: bool
) -> None:
    async def failing() -> None:
        raise ValueError(f"bad input {SECRET}\n[parameters: ('{SECRET}',)]")

    steps = DbosSteps(None, mode=mode)
    recorded = await steps._attempt("a step", failing, _CODEC)
    saved = json.dumps(recorded)
    assert "[parameters" not in saved, "never the lines after the first"
    assert (SECRET in saved) is kept
    steps._raised.clear()  # as a replay in another process: from the checkpoint alone
    with pytest.raises(RuntimeError) as raised:
        steps._result("a step", recorded, _CODEC)
    said = f"ValueError: bad input {SECRET}" if kept else "ValueError"
    assert str(raised.value) == said
    # readers are told what the first execution told them: the class, the detail (ADR 0079)
    assert failure_text(raised.value) == "ValueError"
    assert failure_detail(raised.value) == (said if kept else None)
    again = await steps._attempt("replayed again", lambda: _raise(raised.value), _CODEC)
    assert again == recorded, "a replayed failure checkpoints as the original did"


async def _raise(exc: BaseException) -> None:
    raise exc


@pytest.mark.unit
@pytest.mark.parametrize("kind", ["", "Bad Name", "x\nsaid", "1Leading"])
def test_a_replayed_failure_whose_class_is_not_a_name_is_called_exception(kind: str) -> None:
    """The class is read back from a database: anything but a class name is not shown."""
    replayed = ReplayedFailure(kind, None)
    assert failure_text(replayed) == "Exception" and failure_detail(replayed) is None
