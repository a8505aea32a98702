"""A run's execution that ends leaves the daemon's runs in flight at once, and only that run:
the others still read as executing, and the one that ended as executed, with its mode."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from support.commits import idle

from thoughtgate.orchestration.runtime import RunRequest, Runtime
from thoughtgate.server.manager import RunManager
from thoughtgate.store.sqlite import SQLiteStore
from thoughtgate.testing.fake import FakeProvider, text

pytestmark = [pytest.mark.inprocess, pytest.mark.timeout(60)]


async def _until(check: Any) -> None:
    for _ in range(1000):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("never")


async def test_the_run_that_ends_is_forgotten_and_the_others_still_execute(
    tmp_path: Path,
) -> None:
    store = await SQLiteStore.open(tmp_path / "t.db")
    gate = asyncio.Semaphore(0)

    def script(request: Any, turn: int) -> AsyncIterator[Any]:
        async def gen() -> AsyncIterator[Any]:
            await gate.acquire()  # one run goes on per release
            yield text("done")

        return gen()

    manager = RunManager(Runtime(store, provider_factory=lambda m: FakeProvider(script)), grace_s=0)
    try:
        runs = [
            await manager.start(RunRequest(f"run {i}", model="fake:x"), chain_of_thought=mode)
            for i, mode in enumerate(["surface", "telemetry_only", "surface"])
        ]
        for run in runs:
            assert manager.executing_mode(run.run_id) == run.chain_of_thought
        gate.release()
        await _until(lambda: sum(manager.executing_mode(r.run_id) is None for r in runs) == 1)
        (ended,) = [r for r in runs if manager.executing_mode(r.run_id) is None]
        assert manager.executed_mode(ended.run_id) == ended.chain_of_thought
        assert (await store.get_run(ended.run_id)).status == "completed"
        for run in runs:
            if run is not ended:
                assert manager.executing_mode(run.run_id) == run.chain_of_thought
                assert manager.executed_mode(run.run_id) is None
        for _ in runs[1:]:
            gate.release()
        await idle(manager)
        for run in runs:
            assert manager.executing_mode(run.run_id) is None
            assert manager.executed_mode(run.run_id) == run.chain_of_thought
    finally:
        await store.close()
