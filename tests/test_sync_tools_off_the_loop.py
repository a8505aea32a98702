"""Plain ``def`` tools run in a thread of their own, not on the event loop (ADR 0173).

A blocking sync tool used to hold the loop: live output, Ctrl-C, every other run of a daemon and
the renewal of the run's lease stopped while it ran. Each tool here refuses to block when it finds
itself on the loop's thread (the test could never release it: it would hang instead of failing).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from thoughtgate.engine.tools import ToolRegistry, tool
from thoughtgate.orchestration.runtime import RunRequest, Runtime
from thoughtgate.providers.base import TurnRequest
from thoughtgate.store.memory import MemoryStore
from thoughtgate.testing.fake import FakeProvider, text, tool_call
from thoughtgate.types import Chunk

WHO = contextvars.ContextVar("WHO", default="nobody")


class Gate:
    """A sync tool's body held on a ``threading.Event`` until the test releases it."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.loop_thread = threading.get_ident()
        self.entered = asyncio.Event()
        self.release = threading.Event()
        self.threads: list[threading.Thread] = []

    def hold(self, x: str) -> str:
        if threading.get_ident() == self.loop_thread:
            self.entered.set()
            raise RuntimeError("the sync tool runs on the event loop: blocking here would hang")
        self.threads.append(threading.current_thread())
        self.loop.call_soon_threadsafe(self.entered.set)
        self.release.wait()
        return f"released {x} for {WHO.get()}"


def script_for(model: str) -> Any:
    def script(request: TurnRequest, turn: int) -> Iterator[Chunk | list[Chunk]]:
        if model == "fake:tool" and turn == 0:
            yield tool_call("hold", {"x": "q"}, call_id="call_0")
        else:
            yield text(f"answer {turn}")

    return script


def runtime_with(*tools: Any) -> tuple[Runtime, MemoryStore]:
    store = MemoryStore()
    factory = lambda model: FakeProvider(script_for(model))  # noqa: E731
    return Runtime(store, provider_factory=factory, tools=ToolRegistry(tools)), store


async def test_a_blocking_sync_tool_leaves_the_loop_to_other_runs_then_completes() -> None:
    gate = Gate()
    runtime, store = runtime_with(tool(name="hold")(gate.hold))
    WHO.set("alice")  # copied into the run's task, then into the tool's thread
    held = asyncio.create_task(runtime.run(RunRequest("go", model="fake:tool")))
    await gate.entered.wait()
    other = await runtime.run(RunRequest("meanwhile", model="fake:plain"))
    assert other.status == "completed", "a second run completes while the tool blocks"
    assert not held.done()
    gate.release.set()
    run = await held
    assert run.status == "completed" and run.tasks[0].output == "answer 1"
    done = next(e for e in await store.read(run.run_id) if e.type == "tool.completed")
    assert done.payload["output"] == "released q for alice"


async def test_on_loop_keeps_a_sync_tool_on_the_loop_s_thread() -> None:
    loop_thread = threading.get_ident()
    seen: list[int] = []

    @tool(name="hold", on_loop=True)
    def hold(x: str) -> str:
        """Uses an object bound to the loop's thread."""
        seen.append(threading.get_ident())
        return "here"

    runtime, _store = runtime_with(hold)
    run = await runtime.run(RunRequest("go", model="fake:tool"))
    assert run.status == "completed" and seen == [loop_thread]


async def test_a_cancel_while_a_sync_tool_blocks_ends_the_run_and_discards_its_late_result(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gate = Gate()
    runtime, store = runtime_with(tool(name="hold")(gate.hold))
    created = await runtime.create_run(RunRequest("go", model="fake:tool"))
    held = asyncio.create_task(runtime.execute(created.run_id))
    await gate.entered.wait()
    held.cancel("stopped by the test")
    with contextlib.suppress(asyncio.CancelledError):
        await held
    assert not gate.release.is_set(), "the run ended while its tool's thread still blocked"
    run = await store.get_run(created.run_id)
    assert run.status == "interrupted" and "stopped by the test" in (run.error or "")
    ended = len(await store.read(created.run_id))
    with caplog.at_level(logging.WARNING, logger="thoughtgate.tools"):
        gate.release.set()
        await asyncio.to_thread(gate.threads[0].join)
        for _ in range(3):  # the thread's hand-off to the loop runs on the loop's next turns
            await asyncio.sleep(0)
    events = await store.read(created.run_id)
    assert len(events) == ended and events[-1].type == "run.interrupted"
    assert not any(e.type == "tool.completed" for e in events)
    assert "'hold' succeeded after its call was cancelled" in caplog.text


EXITS = """
import asyncio, threading
from thoughtgate.engine.tools import ToolRegistry, tool
from thoughtgate.orchestration.runtime import RunRequest, Runtime
from thoughtgate.store.memory import MemoryStore
from thoughtgate.testing.fake import FakeProvider, text, tool_call

entered = threading.Event()

@tool
def hold(x: str) -> str:
    '''Blocks for good.'''
    entered.set()
    threading.Event().wait()
    return "never"

def script(request, turn):
    yield tool_call("hold", {"x": "q"}, call_id="c0") if turn == 0 else text("a")

async def main():
    factory = lambda model: FakeProvider(script)
    runtime = Runtime(MemoryStore(), provider_factory=factory, tools=ToolRegistry([hold]))
    run = asyncio.create_task(runtime.run(RunRequest("go", model="fake:x")))
    await asyncio.to_thread(entered.wait)
    run.cancel("stopped")
    try:
        await run
    except asyncio.CancelledError:
        pass
    print("run ended", flush=True)

asyncio.run(main())
print("process exits", flush=True)
"""


def test_a_tool_thread_blocked_for_good_does_not_keep_the_process_from_exiting() -> None:
    """A pool's workers (the loop's default executor's included) are joined at exit: one tool
    blocked for good would keep ``thoughtgate run`` from exiting after Ctrl-C."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", EXITS], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["run ended", "process exits"]
