"""A SQLite store whose file is removed (its directory with it) or replaced while a process has it
open (ADR 0149).

SQLite goes on writing into the unlinked file through the descriptors it holds, in WAL mode without
a word: before this, a daemon whose store directory was removed mid-run reported the run
``completed``, took new runs and answered ``/healthz`` ok, and all of it was gone once it exited. A
write is now refused instead, rolled back, with the reason; a run executing then fails to record
anything more, and ``thoughtgate run`` says so rather than printing the run as still ``running``.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from support.daemon import HANG_S, cli_env
from support.durable import until
from support.store_conformance import deltas, make_run
from support.ticker import ticker_prompt
from typer.testing import CliRunner

from thoughtgate.cli import app
from thoughtgate.errors import StoreError
from thoughtgate.orchestration.runtime import RunRequest, Runtime
from thoughtgate.store.records import OPEN_RUN_STATUSES
from thoughtgate.store.sqlite import SQLiteStore

WAIT_S = 60.0
"""Only a hang reaches it."""


@pytest.mark.inprocess
async def test_a_write_after_the_stores_directory_was_removed_is_refused(tmp_path: Path) -> None:
    store = await SQLiteStore.open(tmp_path / "store" / "s.db")
    try:
        run = make_run(tasks=1)
        await store.create_run(run)
        assert [e.seq for e in await store.append(run.run_id, deltas(2))] == [1, 2]
        shutil.rmtree(tmp_path / "store")
        with pytest.raises(StoreError, match=r"s\.db was removed \(or its directory was\)"):
            await store.append(run.run_id, deltas(1, start=2))
        with pytest.raises(StoreError, match="was removed"):
            await store.create_run(make_run())
    finally:
        await store.close()


@pytest.mark.inprocess
async def test_a_write_after_the_stores_file_was_replaced_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = await SQLiteStore.open(path)
    try:
        run = make_run()
        await store.create_run(run)
        other = tmp_path / "other.db"
        sqlite3.connect(other).close()
        other.replace(path)  # a restored backup, or another program's file, moved over it
        with pytest.raises(StoreError, match="was replaced by another file"):
            await store.append(run.run_id, deltas(1))
    finally:
        await store.close()


@pytest.mark.inprocess
async def test_a_run_whose_store_is_removed_mid_run_is_never_reported_ended(
    tmp_path: Path,
) -> None:
    """The run's script waits on a file in the store's directory: removing the directory lets it
    go on, into a store that refuses everything from then on."""
    directory = tmp_path / "store"
    store = await SQLiteStore.open(directory / "s.db")
    hold = directory / "hold"
    hold.touch()
    try:
        runtime = Runtime(store)
        run = await runtime.create_run(
            RunRequest(ticker_prompt(5, 0, hold), model="fake:ticker", chain_of_thought="surface")
        )
        execution = asyncio.create_task(runtime.execute(run.run_id))

        async def waiting_on_hold() -> bool:
            return (await store.get_run(run.run_id)).status == "running"

        await until(waiting_on_hold)
        shutil.rmtree(directory)
        with pytest.raises(StoreError, match="was removed"):
            await asyncio.wait_for(execution, WAIT_S)
        assert (await store.get_run(run.run_id)).status in OPEN_RUN_STATUSES
    finally:
        await store.close()


def _remove_once_the_run_is_recorded(directory: Path) -> None:
    """The run waits on ``hold`` (in the directory) until the directory is gone."""
    db = directory / "s.db"
    while True:
        try:
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
                if conn.execute("SELECT count(*) FROM runs").fetchone()[0]:
                    break
        except sqlite3.Error:  # not created (or not migrated) yet
            pass
        threading.Event().wait(0.02)
    shutil.rmtree(directory)


@pytest.mark.inprocess
def test_thoughtgate_run_whose_store_is_removed_says_so_and_exits_1(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    directory.mkdir()
    db = directory / "s.db"
    hold = directory / "hold"
    hold.touch()
    remover = threading.Thread(
        target=_remove_once_the_run_is_recorded, args=(directory,), daemon=True
    )
    remover.start()
    result = CliRunner().invoke(
        app,
        ["run", ticker_prompt(5, 0, hold), "--model", "fake:ticker", "--db", f"sqlite:///{db}"],
        env={"THOUGHTGATE_DURABILITY__ENABLED": "false", "COLUMNS": "400"},
    )
    remover.join(WAIT_S)
    assert result.exit_code == 1, result.output
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("error: run run_")
    # (removed once the run is recorded: before or after its execution claimed it)
    assert re.search(
        r"stopped without recording its end, .* still shows it (pending|running):", error
    )
    assert "was removed (or its directory was)" in error
    assert "status" not in result.stdout  # no panel showing the run as still under way


@pytest.mark.external
def test_a_durable_thoughtgate_run_whose_store_is_removed_says_so_and_exits_1(
    tmp_path: Path,
) -> None:
    """A durable execution logs its failure as its workflow's outcome and returns, the run open:
    the command still fails, after that line."""
    directory = tmp_path / "store"
    directory.mkdir()
    hold = directory / "hold"
    hold.touch()
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "thoughtgate", "run", ticker_prompt(5, 0, hold),
            "--model", "fake:ticker", "--tools", "support.served:SERVER_TOOLS",
            "--db", f"sqlite:///{directory / 's.db'}",
        ],
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        _remove_once_the_run_is_recorded(directory)
        out, err = proc.communicate(timeout=HANG_S)
    finally:
        proc.kill()
    assert proc.returncode == 1, (out, err)
    error = err.strip().splitlines()[-1]
    assert re.search(
        r"^error: run run_\w+ stopped without recording its end, .* (pending|running)$", error
    )
    assert "was removed (or its directory was)" in err  # the execution's own line, above it
    assert "status" not in out
