"""Helpers for the durable-run tests: a side-effect counting tool, a fake script whose turns follow
the conversation (so a resumed process picks up where the killed one was), waiting helpers.

A ``thoughtgate serve`` / ``thoughtgate run`` subprocess gets the tools and the fake scripts
(``fake:durable``, ``fake:waiting``, registered by ``support.fakes``) with ``--tools
support.served:DURABLE_TOOLS``.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from thoughtgate.engine.tools import tool
from thoughtgate.providers.base import TurnRequest
from thoughtgate.store.durable import DurableRunStore, RunSpecRecord
from thoughtgate.testing.fake import ScriptFn, reasoning, text, tool_call
from thoughtgate.types import ContinuityBlock, ContinuityChunk

SIDE_EFFECTS = "TG_TEST_SIDE_EFFECTS"
"""Env var naming the file each ``side_effect`` call appends one line to."""
HOLD = "TG_TEST_HOLD_FILE"
"""Env var naming a file: while it exists, the second model turn of ``fake:durable`` waits."""


@tool
def side_effect(label: str) -> str:
    """Do something that must happen exactly once (appends a line to a file)."""
    path = os.environ.get(SIDE_EFFECTS)
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(f"{label} {os.getpid()}\n")
    return f"did {label}"


@tool(requires_approval=True)
def guarded(label: str) -> str:
    """A side effect that needs a person's approval first."""
    return side_effect.fn(label)


TOOLS = [side_effect, guarded]
NO_TOOLS: list[Any] = []
"""``--tools support.served:NO_TOOLS``: the fake scripts, and no tools at all."""


def _assistant_turns(request: TurnRequest) -> int:
    return sum(1 for m in request.messages if m.role == "assistant")


def _durable(request: TurnRequest, turn: int) -> AsyncIterator[Any]:
    """Turn 0: think (with a signed carrier) and call ``side_effect``; turn 1: wait while the
    hold file exists, then answer. The turn comes from the conversation, not from the provider
    object, so a resumed process continues the script."""
    turn = _assistant_turns(request)
    prompt = request.messages[0].text if request.messages else ""
    wants = "guarded" if "guarded" in prompt else "side_effect"

    async def gen() -> AsyncIterator[Any]:
        if turn == 0:
            yield reasoning("SECRET-REASONING first I act")
            yield ContinuityChunk(
                ContinuityBlock(
                    "anthropic.thinking",
                    {"type": "thinking", "thinking": "x", "signature": "SIG-CARRIER"},
                    provider="fake",
                    model="durable",
                )
            )
            yield tool_call(wants, {"label": "once"}, call_id="call_once")
            return
        hold = os.environ.get(HOLD)
        # another process (the test) removes the file: a poll is the only signal there is
        while hold and os.path.exists(hold):  # noqa: ASYNC110, ASYNC240
            await asyncio.sleep(0.05)
        yield reasoning("SECRET-REASONING now I answer")
        yield text("all done")

    return gen()


def _waiting(request: TurnRequest, turn: int) -> AsyncIterator[Any]:
    """Waits while the hold file exists, then answers: a run that stays open on demand."""

    async def gen() -> AsyncIterator[Any]:
        hold = os.environ.get(HOLD)
        while hold and os.path.exists(hold):  # noqa: ASYNC110, ASYNC240
            await asyncio.sleep(0.05)
        yield text("released")

    return gen()


SCRIPTS: dict[str, ScriptFn] = {"durable": _durable, "waiting": _waiting}
"""``fake:durable`` and ``fake:waiting``, for ``support.fakes``."""


def one_lookup(request: TurnRequest, _: int) -> AsyncIterator[Any]:
    """A fake script: calls the tool ``lookup`` once (offered or not), then answers."""
    asked = any(m.role == "tool" for m in request.messages)

    async def gen() -> AsyncIterator[Any]:
        if not asked:
            yield tool_call("lookup", {"query": "q"}, call_id="call_1")
        else:
            yield text("the answer")

    return gen()


def side_effects(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


def wait_for(predicate: Any, *, timeout: float, what: str, every: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout} s for {what}")
        time.sleep(every)


async def until(check: Callable[[], Awaitable[bool]], timeout_s: float = 20.0) -> None:
    """Wait, in this process's loop, until ``check`` says so (fails the test after ``timeout_s``)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def queued_run(store: DurableRunStore, **run: Any) -> str:
    """A durable run admitted for queue ``q`` (ownerless, queued now) and put on no queue: what a
    sweep finds when what queues it failed (ADR 0062). ``run``: the run record's fields."""
    from support.store_conformance import make_run

    record = make_run(tasks=1, **run)
    spec = RunSpecRecord(
        record.run_id,
        {"tasks": [], "tools": []},
        durable=True,
        resume="queue",
        queue="q",
        queued_at=time.time(),
    )
    await store.admit_run(record, spec)
    return record.run_id
