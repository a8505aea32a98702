"""Approvals of durable runs: answered from any process, waiting out their timeout durably.

A durable run waits for an approval with the engine's durable ``receive`` (its deadline is
recorded when the wait begins, so a run resumed after a crash waits only for what is left of the
timeout; a run whose process stopped after the log recorded the request but before the wait began
is given what is left of it counted from the request's event, ``engine.loop``), and an answer is
a durable message to the run's workflow, which any process can send:
the daemon replica that got the HTTP request, another one, the web page, the MCP server. An answer
sent while the run is between processes waits for it.

A process's own decider (the terminal prompt of ``thoughtgate run``, ``--approve-all``) answers by
sending the same message, from outside the workflow's context so the workflow's recorded steps
stay the same on replay.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from thoughtgate.engine.approvals import ApprovalBroker, ApprovalOutcome, Decider, Decision
from thoughtgate.events.schema import EventType, is_run_terminal
from thoughtgate.store.base import EventStore
from thoughtgate.store.records import OPEN_RUN_STATUSES

if TYPE_CHECKING:
    from thoughtgate.orchestration.durable import DurableEngine

__all__ = ["DurableApprovals", "approval_settled", "approval_topic"]


def approval_topic(call_id: str) -> str:
    return f"approval:{call_id}"


class DurableApprovals(ApprovalBroker):
    """An :class:`~thoughtgate.engine.approvals.ApprovalBroker` on the engine's messages."""

    def __init__(
        self, engine: DurableEngine, store: EventStore, *, decider: Decider | None = None
    ) -> None:
        super().__init__(decider=decider)
        self.engine = engine
        self.store = store
        self._waiting: set[tuple[str, str]] = set()

    def pending(self, run_id: str) -> list[str]:
        return [cid for (rid, cid) in self._waiting if rid == run_id]

    def respond(self, run_id: str, call_id: str, decision: Decision, *, by: str = "") -> bool:
        """Answer a call waiting in this process (for callers that cannot await; the message is
        sent in the background). Prefer :meth:`answer`."""
        if (run_id, call_id) not in self._waiting:
            return False
        message = {"decision": decision, "by": by}
        asyncio.get_running_loop().create_task(
            self.engine.send(run_id, approval_topic(call_id), message),
            context=contextvars.Context(),
        )
        return True

    async def answer(self, run_id: str, call_id: str, decision: Decision, *, by: str = "") -> bool:
        """Answer an approval the run's log shows pending, wherever the run executes."""
        run = await self.store.get_run(run_id)
        if run.status not in OPEN_RUN_STATUSES or not await _pending_in_log(
            self.store, run_id, call_id
        ):
            return False
        await self.engine.send(run_id, approval_topic(call_id), {"decision": decision, "by": by})
        return True

    async def wait(
        self,
        run_id: str,
        call_id: str,
        tool_name: str,
        arguments: Mapping[str, Any],
        *,
        timeout: float,
    ) -> ApprovalOutcome:
        asker: asyncio.Task[None] | None = None
        if self.decider is not None:
            decider = self.decider

            async def ask() -> None:
                decision = await decider(call_id, tool_name, arguments)
                if decision is not None:
                    message = {"decision": decision, "by": "local"}
                    await self.engine.send(run_id, approval_topic(call_id), message)

            # A fresh context: the answer is sent from outside the workflow, never as one of
            # its recorded steps (whose order must not depend on when a person answers).
            asker = asyncio.get_running_loop().create_task(ask(), context=contextvars.Context())
        self._waiting.add((run_id, call_id))
        try:
            message = await self.engine.receive(approval_topic(call_id), timeout)
        finally:
            self._waiting.discard((run_id, call_id))
            if asker is not None and not asker.done():
                asker.cancel()
        if message is None:
            return ApprovalOutcome("timeout")
        decision = message.get("decision")
        if decision not in ("approve", "reject"):
            return ApprovalOutcome("reject", str(message.get("by", "")))
        return ApprovalOutcome(decision, str(message.get("by", "")))


async def approval_settled(store: EventStore, run_id: str, call_id: str) -> bool:
    """Whether the run's log records an answer (or the timeout) for this call's approval."""
    settled = {EventType.TOOL_APPROVAL_RESPONSE, EventType.TOOL_APPROVAL_TIMEOUT}
    for event in await store.read(run_id):
        if event.type in settled and event.payload.get("call_id") == call_id:
            return True
        if is_run_terminal(event.type):
            break
    return False


async def _pending_in_log(store: EventStore, run_id: str, call_id: str) -> bool:
    """Whether the run's log asks for this call's approval and has not settled it."""
    asked = False
    for event in await store.read(run_id):
        if event.payload.get("call_id") == call_id:
            if event.type == EventType.TOOL_APPROVAL_REQUIRED:
                asked = True
            elif event.type in (EventType.TOOL_APPROVAL_RESPONSE, EventType.TOOL_APPROVAL_TIMEOUT):
                return False
        if is_run_terminal(event.type):
            return False
    return asked
