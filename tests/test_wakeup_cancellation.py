"""A reader waiting for a run's news, or a run waiting for an approval, stops when it is
cancelled, even when what it waits for comes in the same turn of the loop as the cancellation.
On Python 3.11 ``asyncio.wait_for`` returned normally then (its inner wait had finished): a
cancelled live reader went on reading (seen under load: a test's reader never stopped), and a
cancelled run would have gone on to run an approved tool."""

from __future__ import annotations

import asyncio

import pytest

from thoughtgate.store.log import RunWakeups

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("timeout", [None, 30.0])
def test_a_wait_cancelled_in_the_turn_its_news_comes_is_cancelled(timeout: float | None) -> None:
    async def scenario() -> bool:
        wakeups = RunWakeups()
        armed = wakeups.arm("run-1")
        waiting = asyncio.create_task(wakeups.wait("run-1", timeout, armed=armed))
        await asyncio.sleep(0)  # the task is inside its wait
        armed.set()  # the news ...
        waiting.cancel()  # ... and the reader's cancellation, in one turn
        try:
            await waiting
        except asyncio.CancelledError:
            return True
        return False

    assert asyncio.run(scenario()), "the cancellation was dropped: the reader would read on"


def test_a_run_cancelled_in_the_turn_its_approval_comes_is_cancelled() -> None:
    """Had the answer won, a cancelled run would have gone on to run the approved tool."""
    from thoughtgate.engine.approvals import ApprovalBroker

    async def scenario() -> bool:
        broker = ApprovalBroker()
        waiting = asyncio.create_task(broker.wait("run-1", "call-1", "shell", {}, timeout=30))
        await asyncio.sleep(0)
        assert broker.respond("run-1", "call-1", "approve")
        waiting.cancel()
        try:
            await waiting
        except asyncio.CancelledError:
            return True
        return False

    assert asyncio.run(scenario()), "the cancellation was dropped: the approved tool would run"
