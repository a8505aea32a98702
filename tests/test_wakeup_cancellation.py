"""A reader waiting for a run's news, or a run waiting for an approval, stops when it is
cancelled, even when what it waits for comes in the same turn of the loop as the cancellation.
On Python 3.11 ``asyncio.wait_for`` returned normally then (its inner wait had finished): a
cancelled live reader went on reading (seen under load: a test's reader never stopped), and a
cancelled run would have gone on to run an approved tool."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from thoughtgate.engine.approvals import ApprovalBroker
from thoughtgate.store.log import RunWakeups

pytestmark = pytest.mark.unit


def _stays_cancelled(
    wait: Callable[[], Coroutine[Any, Any, Any]], deliver: Callable[[], Any]
) -> bool:
    """Whether a task in ``wait()`` ends cancelled when ``deliver()`` gives it what it waits
    for and it is cancelled in the same turn of the loop."""

    async def scenario() -> bool:
        waiting = asyncio.create_task(wait())
        await asyncio.sleep(0)  # the task is inside its wait
        deliver()
        waiting.cancel()
        try:
            await waiting
        except asyncio.CancelledError:
            return True
        return False

    return asyncio.run(scenario())


@pytest.mark.parametrize("timeout", [None, 30.0])
def test_a_wait_cancelled_in_the_turn_its_news_comes_is_cancelled(timeout: float | None) -> None:
    wakeups = RunWakeups()
    armed = wakeups.arm("run-1")
    assert _stays_cancelled(lambda: wakeups.wait("run-1", timeout, armed=armed), armed.set), (
        "the cancellation was dropped: the reader would read on"
    )


def test_a_run_cancelled_in_the_turn_its_approval_comes_is_cancelled() -> None:
    broker = ApprovalBroker()

    def approve() -> None:
        assert broker.respond("run-1", "call-1", "approve"), "no approval was waiting"

    assert _stays_cancelled(
        lambda: broker.wait("run-1", "call-1", "shell", {}, timeout=30), approve
    ), "the cancellation was dropped: the approved tool would run"
