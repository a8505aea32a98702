"""Checkpointed steps: the units a durable engine records, and what a resumed run finds done.

The agent loop and the runtime do their work in *steps* -- a model turn, recording a turn, a tool
call, asking for an approval, starting or ending a task -- each through :class:`Steps`. A step
with a result (a model turn, a tool call, an approval's answer) is checkpointed; a step that only
records events (a turn's recording, a task's start and end, asking for an approval) is an
*effect*: the events it looks up in the log are its checkpoint, so it costs the engine nothing.
Nor is the result that ends the run's last task in a first execution (``Steps.run``'s ``ends``,
``Steps.last_task``): the run's ending commit records it, and no checkpoint follows it (ADR 0029).
Without a durable engine (:class:`DirectSteps`) a step simply runs. Under one (``orchestration.durable``,
ADR 0013) each step's JSON result is checkpointed when it returns; when the process dies and the
run resumes elsewhere, the run's code runs again from the top and every checkpointed step
returns its recorded result instead of running again, so the loop rebuilds its exact state --
conversation, continuity carriers, usage -- from those results.

Only the one step that was under way when the process died runs again. It may have written some
of its events already; :class:`ResumeLog` is the run's event log as it was before the resume, and
each step consults it so that nothing is done twice:

* a model turn with events but no recorded turn was cut: it is recorded as cut and asked again
  (under the next turn number, so the log never mixes two attempts' text);
* a tool call with a recorded end keeps that result; one that started but never ended is not run
  again (it may have had its effect) -- the model is told it was interrupted;
* events a step writes go in one atomic append, so a step is found either whole or absent.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from thoughtgate.events.schema import Event, EventType

__all__ = ["DirectSteps", "ResumeLog", "StepCodec", "Steps"]

T = TypeVar("T")

_TOOL_ENDS = frozenset({EventType.TOOL_COMPLETED, EventType.TOOL_FAILED, EventType.TOOL_DEGRADED})
_APPROVAL_ENDS = frozenset({EventType.TOOL_APPROVAL_RESPONSE, EventType.TOOL_APPROVAL_TIMEOUT})
_TURN_EVENTS = frozenset(
    {EventType.MESSAGE_DELTA, EventType.REASONING_DELTA, EventType.AGENT_RESPONSE}
)


@dataclass(frozen=True, slots=True)
class StepCodec:
    """How a step's result becomes JSON for the checkpoint and back."""

    encode: Callable[[Any], Any]
    decode: Callable[[Any], Any]


NO_RESULT = StepCodec(lambda _: None, lambda _: None)


class Steps(Protocol):
    """Runs the steps of one run's execution (``orchestration.durable`` checkpoints them)."""

    @property
    def resumed(self) -> ResumeLog | None:
        """The log as it was before this execution, when it resumes a run; else ``None``."""
        ...

    async def run(
        self,
        name: str,
        fn: Callable[[], Awaitable[T]],
        codec: StepCodec,
        *,
        ends: Callable[[T], bool] | None = None,
    ) -> T:
        """Run ``fn`` as the next step, or return its recorded result when it already ran.

        ``ends(result)``: whether the result ends its task (no step of the task follows it). In
        the run's last task (:meth:`last_task`) such a result ends the run's execution, whose
        ending commit records it in the log; a durable engine then need not checkpoint it.
        """
        ...

    def last_task(self) -> Steps:
        """These steps, for the run's last task: after a result that ends it (``run``'s
        ``ends``), no checkpointed step follows in this execution."""
        ...

    def checkpoints(self, *, ending: bool) -> bool:
        """Whether :meth:`run` checkpoints a result (``ending``: one that ends its task)."""
        ...

    async def effect(self, name: str, fn: Callable[[], Awaitable[None]]) -> None:
        """Run ``fn``, which records events and returns nothing, without a checkpoint.

        Its own record is the event log: ``fn`` looks its events up in :attr:`resumed` and
        writes nothing that is already there, all in one atomic append. A checkpoint would say
        no more than that log does, and costs a write (and a read) in the engine's database, so
        a resumed run simply calls ``fn`` again. Use :meth:`run` for anything with a result.
        """
        ...


class DirectSteps:
    """No engine: every step runs, nothing is recorded, nothing resumes."""

    resumed: ResumeLog | None = None

    async def run(
        self,
        name: str,
        fn: Callable[[], Awaitable[T]],
        codec: StepCodec,
        *,
        ends: Callable[[T], bool] | None = None,
    ) -> T:
        return await fn()

    def last_task(self) -> DirectSteps:
        return self

    def checkpoints(self, *, ending: bool) -> bool:
        return False

    async def effect(self, name: str, fn: Callable[[], Awaitable[None]]) -> None:
        await fn()


@dataclass
class ResumeLog:
    """What a run's log held when it resumed, indexed by what steps look up."""

    events: Sequence[Event]
    last_seq: int = 0
    clock_offset: float = 0.0
    """The stamps' clock (the store's: PostgreSQL's server, ADR 0074) less this process's, when
    the log was read: what a time read from a stamp is moved by to compare with this process's
    clock."""
    _turn_events: dict[str, dict[int, list[Event]]] = field(default_factory=dict)
    _tool_started: set[tuple[str | None, str]] = field(default_factory=set)
    _tool_end: dict[tuple[str | None, str], Event] = field(default_factory=dict)
    _asked: dict[tuple[str | None, str], float] = field(default_factory=dict)
    _answered: set[tuple[str | None, str]] = field(default_factory=set)
    _task_events: dict[str, set[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._index(self.events)

    def _index(self, events: Iterable[Event]) -> None:
        for e in events:
            self.last_seq = max(self.last_seq, e.seq)
            call = e.payload.get("call_id")
            key = (e.task_id, str(call)) if call is not None else None
            if e.task_id is not None:
                self._task_events.setdefault(e.task_id, set()).add(e.type)
            if e.type in _TURN_EVENTS and e.task_id is not None:
                turn = e.payload.get("turn")
                if isinstance(turn, int):
                    self._turn_events.setdefault(e.task_id, {}).setdefault(turn, []).append(e)
            elif key is None:
                continue
            elif e.type == EventType.TOOL_STARTED:
                self._tool_started.add(key)
            elif e.type in _TOOL_ENDS:
                self._tool_end[key] = e
            elif e.type == EventType.TOOL_APPROVAL_REQUIRED:
                self._asked.setdefault(key, e.ts)
            elif e.type in _APPROVAL_ENDS:
                self._answered.add(key)

    # -- model turns ---------------------------------------------------------------------
    def last_turn(self, task_id: str, at_least: int) -> int | None:
        """The highest turn number at or after ``at_least`` with any recorded event."""
        seen = [t for t in self._turn_events.get(task_id, {}) if t >= at_least]
        return max(seen) if seen else None

    def turn_recorded(self, task_id: str, turn: int) -> bool:
        """Whether the turn's ``agent.response`` is in the log."""
        return any(
            e.type == EventType.AGENT_RESPONSE
            for e in self._turn_events.get(task_id, {}).get(turn, ())
        )

    def turn_text(self, task_id: str, turn: int) -> str:
        """The answer text that streamed for a turn before it was cut."""
        return "".join(
            str(e.payload.get("text", ""))
            for e in self._turn_events.get(task_id, {}).get(turn, ())
            if e.type == EventType.MESSAGE_DELTA
        )

    # -- tools and approvals -------------------------------------------------------------
    def tool_end(self, task_id: str, call_id: str) -> Event | None:
        return self._tool_end.get((task_id, call_id))

    def tool_started(self, task_id: str, call_id: str) -> bool:
        return (task_id, call_id) in self._tool_started

    def approval_asked(self, task_id: str, call_id: str) -> bool:
        return (task_id, call_id) in self._asked

    def approval_asked_at(self, task_id: str, call_id: str) -> float | None:
        """When the log recorded the request for this call's approval (its event's ``ts``), on
        this process's clock."""
        asked = self._asked.get((task_id, call_id))
        return None if asked is None else asked - self.clock_offset

    def approval_settled(self, task_id: str, call_id: str) -> bool:
        return (task_id, call_id) in self._answered

    # -- tasks ---------------------------------------------------------------------------
    def task_has(self, task_id: str, event_type: str) -> bool:
        return event_type in self._task_events.get(task_id, set())
