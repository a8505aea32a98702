"""Tool approvals: a call that needs one waits for approve / reject, or times out.

The broker is shared by whoever can answer: the CLI (interactive prompt or ``--approve-all``) and
the daemon's ``POST /v1/runs/{id}/approvals/{call_id}``. A rejected or expired call is not an error:
the model gets a result that says so and the loop goes on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

__all__ = ["ApprovalBroker", "ApprovalOutcome", "Decider", "Decision"]

Decision: TypeAlias = Literal["approve", "reject"]
Decider: TypeAlias = Callable[[str, str, Mapping[str, Any]], Awaitable[Decision | None]]
"""``(call_id, tool_name, arguments) -> decision`` (``None``: leave it to others / the timeout)."""


@dataclass(frozen=True, slots=True)
class ApprovalOutcome:
    decision: Decision | Literal["timeout"]
    by: str = ""


class ApprovalBroker:
    """Pending approvals keyed by ``(run_id, call_id)``."""

    def __init__(self, *, decider: Decider | None = None) -> None:
        self._pending: dict[tuple[str, str], asyncio.Future[ApprovalOutcome]] = {}
        self.decider = decider

    def pending(self, run_id: str) -> list[str]:
        return [cid for (rid, cid) in self._pending if rid == run_id]

    def respond(self, run_id: str, call_id: str, decision: Decision, *, by: str = "") -> bool:
        """Answer a pending call; ``False`` when nothing is waiting for that call."""
        future = self._pending.get((run_id, call_id))
        if future is None or future.done():
            return False
        future.set_result(ApprovalOutcome(decision, by))
        return True

    async def answer(self, run_id: str, call_id: str, decision: Decision, *, by: str = "") -> bool:
        """Answer a pending call (a durable broker also answers calls waiting in other
        processes); ``False`` when nothing is waiting for that call."""
        return self.respond(run_id, call_id, decision, by=by)

    async def wait(
        self,
        run_id: str,
        call_id: str,
        tool_name: str,
        arguments: Mapping[str, Any],
        *,
        timeout: float,
    ) -> ApprovalOutcome:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[ApprovalOutcome] = loop.create_future()
        self._pending[(run_id, call_id)] = future
        decider_task: asyncio.Task[None] | None = None
        if self.decider is not None:
            decider = self.decider

            async def ask() -> None:
                decision = await decider(call_id, tool_name, arguments)
                if decision is not None and not future.done():
                    future.set_result(ApprovalOutcome(decision, "local"))

            decider_task = asyncio.create_task(ask())
        try:
            # asyncio.timeout, not wait_for: on 3.11 wait_for returns the answer when it comes
            # in the same turn as the run is cancelled, and the cancelled run would run the tool
            async with asyncio.timeout(timeout):
                return await asyncio.shield(future)
        except TimeoutError:
            return ApprovalOutcome("timeout")
        finally:
            self._pending.pop((run_id, call_id), None)
            if decider_task is not None and not decider_task.done():
                decider_task.cancel()
