"""The visible-reasoning pipeline: the object the runtime and tool loop call at lifecycle points.

Each hook takes what the loop already has (a finished :class:`~thoughtgate.types.Turn`, a tool's
call id and name) and returns the ``cot.*`` events to append *right after* the event that
triggered it, already policy-checked. The caller appends them as they are; a dropped step simply
is not in the list, and a failing summarizer never raises here, so a missing step can never block
a tool card or the final message.

Call order for one run (``P`` is the pipeline, ``append`` the store)::

    P = VisibleReasoningPipeline.for_run(config, mode, hidden_texts=[system_prompt])
    if P is None: ...                      # not eligible: hidden mode or visible_reasoning off
    append(await P.task_started(task_id))  # after task.started
    append(await P.answer_started())       # optional, at a turn's first text delta
    append(await P.turn_finished(turn))    # after the turn's agent.response
    append(await P.tool_started(call_id, name, arguments_json=...))  # after the card's first
                                           # event (tool.approval_required or tool.started)
    append(await P.tool_finished(call_id, name, "completed", result_text=...))  # after tool.*
    append(await P.narrated(summary))      # a visible_step call that explains no card
    append(await P.narrated(summary, tool_call_id=call_id))  # ... or one that explains a card
                                           # (after the card's first event)
    append(await P.task_completed())       # after the task's answer, before task.completed
    append([P.completed()])                # cot.completed, before the run's terminal event
                                           # (message.completed / run.failed / ...)

The agent loop's ``LoopObserver`` hooks (``turn_finished(turn, *, task_id, narrations)``,
``tool_started(call, *, task_id)``, ``tool_finished(call, status, *, task_id)``) are served by
:class:`VisibleReasoningObserver`, and :func:`observer_factory` builds the runtime's
``observer_factory(run, disclosure)`` from the project config. The observer's ``narrates`` tells
the loop whether to offer the model the ``visible_step`` tool (``events/narration.py``).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from thoughtgate.config import Config, VisibleReasoningConfig
from thoughtgate.errors import ConfigError
from thoughtgate.events.narration import Narration, is_narration
from thoughtgate.events.policy import PolicyContext, StepPolicy
from thoughtgate.events.schema import NewEvent, now_ts
from thoughtgate.events.summarizers import (
    AnswerStarted,
    ModelSummarizer,
    Moment,
    Narrated,
    NarrationSummarizer,
    PhasesSummarizer,
    ProviderSummariesSummarizer,
    StepDraft,
    Summarizer,
    TaskCompleted,
    TaskStarted,
    ToolFinished,
    ToolOutcome,
    ToolStarted,
    TurnFinished,
    shorten,
)
from thoughtgate.events.visible import (
    DisclosureReceipt,
    VisibleStep,
    build_receipt,
    cot_completed_event,
    cot_phase_event,
    cot_step_event,
    cot_tool_reasoning_event,
)
from thoughtgate.providers.base import Provider, create_provider
from thoughtgate.types import ContinuityBlock, ToolCallPart, ToolResultPart, Turn

__all__ = [
    "ELIGIBLE_MODES",
    "VisibleReasoningObserver",
    "VisibleReasoningPipeline",
    "build_summarizers",
    "check_summarizer_model",
    "effective_summarizers",
    "is_eligible",
    "observer_factory",
]

log = logging.getLogger(__name__)

ELIGIBLE_MODES = frozenset({"surface", "telemetry_only"})
"""Modes that capture reasoning; only their runs get ``cot.*`` events."""

_REASONING_SUMMARIZERS = frozenset({"provider_summaries"})
"""Summarizers whose text is reasoning (the provider's summaries of it)."""


def is_eligible(enabled: bool, mode: str) -> bool:
    """``visible_reasoning.enabled`` and a mode that captures reasoning."""
    return enabled and mode in ELIGIBLE_MODES


def effective_summarizers(config: VisibleReasoningConfig, mode: str) -> tuple[str, ...]:
    """The configured summarizers this run may use.

    In ``telemetry_only`` mode reasoning may reach no display surface at all, so
    ``provider_summaries`` (whose text is reasoning) is left out even when the operator named it;
    ``phases``, ``narration`` and ``model`` read no reasoning and stay.
    """
    names = tuple(dict.fromkeys(config.summarizers))
    if mode == "telemetry_only":
        return tuple(n for n in names if n not in _REASONING_SUMMARIZERS)
    return names


def _no_summarizer_model() -> ConfigError:
    return ConfigError(
        "visible_reasoning.summarizer_model",
        None,
        "PROVIDER:MODEL when visible_reasoning.summarizers includes model",
    )


def check_summarizer_model(config: VisibleReasoningConfig) -> None:
    """Refuse, as a config error, a ``model`` summarizer without ``summarizer_model`` where the
    summarizers are built from the config alone (``thoughtgate run``, ``serve``): every surface
    run would otherwise be created and then fail. A library caller that passes its own
    ``summarizer_provider`` needs no model, which is why the config model does not refuse it."""
    if config.enabled and "model" in config.summarizers and not config.summarizer_model:
        raise _no_summarizer_model()


def build_summarizers(
    names: Iterable[str],
    *,
    summarizer_model: str | None = None,
    summarizer_provider: Provider | None = None,
) -> list[Summarizer]:
    """Summarizers by name; ``model`` uses ``summarizer_provider`` or ``summarizer_model``."""
    built: list[Summarizer] = []
    for name in names:
        if name == "provider_summaries":
            built.append(ProviderSummariesSummarizer())
        elif name == "phases":
            built.append(PhasesSummarizer())
        elif name == "narration":
            built.append(NarrationSummarizer())
        elif name == "model":
            provider = summarizer_provider
            if provider is None:
                if not summarizer_model:
                    raise _no_summarizer_model()
                provider = create_provider(summarizer_model)
            built.append(ModelSummarizer(provider))
        else:
            raise ConfigError(
                "visible_reasoning.summarizers",
                name,
                "phases, narration, provider_summaries, model",
            )
    return built


def _string_leaves(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _string_leaves(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _string_leaves(item)


class VisibleReasoningPipeline:
    """Turns lifecycle moments into policy-checked ``cot.*`` events and counts what it drops."""

    def __init__(
        self,
        mode: str,
        summarizers: Sequence[Summarizer],
        *,
        policy: StepPolicy | None = None,
        task_id: str | None = None,
        clock: Callable[[], float] = now_ts,
        id_prefix: str = "vr",
    ) -> None:
        if mode not in ELIGIBLE_MODES:
            raise ValueError(f"visible reasoning needs surface or telemetry_only, not {mode!r}")
        self.mode = mode
        self.summarizers = tuple(summarizers)
        self.policy = policy or StepPolicy()
        self.task_id = task_id
        self._clock = clock
        self._id_prefix = id_prefix
        self._next_id = 0
        self._dropped: Counter[str] = Counter()
        self._sources: Counter[str] = Counter()
        self._failures = 0
        self._steps_shown = 0
        self._phases_shown = 0
        self._raw_exists = False
        self._opaque_exists = False
        self._cards: set[str] = set()
        self._last_phase: tuple[str, str, str | None] | None = None
        self._last_turn: Turn | None = None

    @classmethod
    def for_run(
        cls,
        config: Config | VisibleReasoningConfig,
        mode: str,
        *,
        hidden_texts: Sequence[str] = (),
        summarizer_provider: Provider | None = None,
        clock: Callable[[], float] = now_ts,
    ) -> VisibleReasoningPipeline | None:
        """The pipeline for a run, or ``None`` when the run is not eligible.

        ``hidden_texts`` are what the reader never sees and no step may quote: the system
        prompt, developer instructions, tool descriptions.
        """
        vr = config.visible_reasoning if isinstance(config, Config) else config
        if not is_eligible(vr.enabled, mode):
            return None
        summarizers = build_summarizers(
            effective_summarizers(vr, mode),
            summarizer_model=vr.summarizer_model,
            summarizer_provider=summarizer_provider,
        )
        policy = StepPolicy(PolicyContext(hidden_texts=tuple(hidden_texts)))
        return cls(mode, summarizers, policy=policy, clock=clock)

    @property
    def narrates(self) -> bool:
        """Whether the model is offered ``visible_step`` (``narration`` is a summarizer here)."""
        return any(s.name == "narration" for s in self.summarizers)

    @property
    def shows_provider_summaries(self) -> bool:
        return any(s.name == "provider_summaries" for s in self.summarizers)

    # -- lifecycle hooks -----------------------------------------------------------------

    async def task_started(self, task_id: str | None = None) -> list[NewEvent]:
        """After ``task.started``; later events carry ``task_id``."""
        self.task_id = task_id
        return await self._moment(TaskStarted(task_id))

    async def answer_started(self) -> list[NewEvent]:
        """Optional: at the first answer text of a turn, so "writing" precedes the text."""
        return await self._moment(AnswerStarted())

    async def turn_finished(self, turn: Turn) -> list[NewEvent]:
        """After a model turn is recorded. Its raw reasoning, opaque markers and tool arguments
        join the policy's context *before* any step of this turn is checked."""
        self._learn_turn(turn)
        self._last_turn = turn
        return await self._moment(TurnFinished(turn))

    async def tool_started(
        self, call_id: str, tool_name: str, *, arguments_json: str | None = None
    ) -> list[NewEvent]:
        """After the card's first event (``tool.approval_required`` or ``tool.started``)."""
        self._cards.add(call_id)
        if arguments_json:
            self.policy.add_tool_text(arguments_json)
        return await self._moment(ToolStarted(call_id, tool_name, turn=self._last_turn))

    async def tool_finished(
        self,
        call_id: str,
        tool_name: str,
        outcome: ToolOutcome,
        *,
        result_text: str | None = None,
    ) -> list[NewEvent]:
        """After the card's final event (completed, failed, degraded, rejected or skipped)."""
        if result_text:
            self.policy.add_tool_text(result_text)
        return await self._moment(ToolFinished(call_id, tool_name, outcome))

    async def narrated(self, summary: str, *, tool_call_id: str | None = None) -> list[NewEvent]:
        """A ``visible_step`` call: a ``cot.step``, or ``cot.tool.reasoning`` on the card
        ``tool_call_id`` (call this after that card's first event)."""
        return await self._moment(Narrated(summary, tool_call_id=tool_call_id))

    async def task_completed(self) -> list[NewEvent]:
        return await self._moment(TaskCompleted())

    def completed(self) -> NewEvent:
        """``cot.completed`` with the disclosure receipt; append before the run's terminal event."""
        return cot_completed_event(self.receipt, task_id=self.task_id, ts=self._clock())

    @property
    def receipt(self) -> DisclosureReceipt:
        return build_receipt(
            self.mode,
            raw_reasoning_exists=self._raw_exists,
            opaque_reasoning_exists=self._opaque_exists,
            steps_shown=self._steps_shown,
            phases_shown=self._phases_shown,
            dropped_by_reason=self._dropped,
            summarizers=tuple(s.name for s in self.summarizers),
            summarizer_failures=self._failures,
            step_sources=self._sources,
        )

    # -- internals -----------------------------------------------------------------------

    def _learn_turn(self, turn: Turn) -> None:
        """Everything the provider returned in its reasoning channel is reasoning no step may
        repeat, and its opaque strings and continuity data are provider data no step may quote.
        When the operator chose to show provider summaries, each summary is registered as such:
        still reasoning for every other step, but the step cut from it may quote it, even where
        its words are continuity data too (ADR 0083). While narrating, ``visible_step`` arguments are
        not tool data: they are the steps themselves."""
        for part in turn.reasoning_parts:
            if part.text:
                self._raw_exists = True
                if part.reasoning_kind == "summary" and self.shows_provider_summaries:
                    self.policy.add_shown_summary(part.text)
                else:
                    self.policy.add_raw_reasoning(part.text)
            if part.redacted or part.reasoning_kind == "encrypted":
                self._opaque_exists = True
            if part.signature:
                self.policy.add_provider_marker(part.signature)
        for block in turn.continuity:
            self._learn_continuity(block)
        for call in turn.tool_calls:
            if not (self.narrates and is_narration(call)):
                self.policy.add_tool_text(call.arguments_json)

    def _learn_continuity(self, block: ContinuityBlock) -> None:
        if block.carrier.endswith(("redacted_thinking", "reasoning_item")):
            self._opaque_exists = True
        for leaf in _string_leaves(block.data):
            self.policy.add_provider_marker(leaf)

    async def _moment(self, moment: Moment) -> list[NewEvent]:
        drafts: list[tuple[StepDraft, str | None]] = []
        for summarizer in self.summarizers:
            try:
                made = await summarizer.summarize(moment)
            except Exception as exc:  # a summarizer, whatever fails in it, must never break the run
                self._failures += 1
                log.warning("summarizer %s failed: %s", summarizer.name, type(exc).__name__)
                continue
            drafts += [(d, self._quoting(summarizer, d)) for d in made]
        phases_last = isinstance(moment, TurnFinished)
        drafts.sort(key=lambda pair: (pair[0].kind == "phase") == phases_last)
        events = []
        for draft, quoting in drafts:
            event = self._admit(draft, quoting=quoting)
            if event is not None:
                events.append(event)
        return events

    def _quoting(self, summarizer: Summarizer, draft: StepDraft) -> str | None:
        """The summary a draft may quote (ADR 0083): only a ``provider_summary`` step of the
        built-in summarizer, on a run whose operator named it. Anyone else's ``quotes`` is
        ignored, so their drafts are checked as if they quoted nothing."""
        trusted = type(summarizer) is ProviderSummariesSummarizer and self.shows_provider_summaries
        return draft.quotes if trusted and draft.source == "provider_summary" else None

    def _admit(self, draft: StepDraft, *, quoting: str | None = None) -> NewEvent | None:
        text = draft.summary.strip()
        if not text:
            return None
        if draft.kind == "tool_reasoning" and draft.tool_call_id not in self._cards:
            return None  # only ever attached to a card that is already in the thread
        if draft.kind == "phase" and self._last_phase == (draft.phase, text, draft.tool_call_id):
            return None
        short = shorten(text)
        for candidate in dict.fromkeys((text, short)):
            verdict = self.policy.check(candidate, quoting=quoting)
            if not verdict.allowed:
                self._dropped[verdict.reason or "unknown"] += 1
                return None
        self._next_id += 1
        step = VisibleStep(
            f"{self._id_prefix}-{self._next_id}",
            short,
            draft.phase,
            self._clock(),
            tool_call_id=draft.tool_call_id,
            source=draft.source,
        )
        self._sources[draft.source] += 1
        if draft.kind == "phase":
            self._last_phase = (draft.phase, text, draft.tool_call_id)
            self._phases_shown += 1
            return cot_phase_event(step, task_id=self.task_id)
        self._steps_shown += 1
        if draft.kind == "tool_reasoning":
            return cot_tool_reasoning_event(step, task_id=self.task_id)
        return cot_step_event(step, task_id=self.task_id)


# --------------------------------------------------------------------------- agent-loop adapter

_LOOP_OUTCOMES: dict[str, ToolOutcome] = {
    "completed": "completed",
    "degraded": "degraded",
    "failed": "failed",
    "rejected": "rejected",
    "skipped": "skipped",
}


class VisibleReasoningObserver:
    """The pipeline behind the agent loop's ``LoopObserver`` hooks, one per task.

    The loop records ``message.completed`` (or ``message.partially_completed``) right after the
    observer's ``turn_finished`` for a turn that calls no tool or was cut, so that is where the
    task's last phase and ``cot.completed`` go: before the terminal event, as readers stop there.
    """

    def __init__(self, pipeline: VisibleReasoningPipeline) -> None:
        self.pipeline = pipeline
        self._task: str | None = None
        self._started = False
        self._completed = False
        self._explaining: dict[str, list[str]] = {}
        """Narrations waiting for the card they explain (emitted after its first event)."""

    @property
    def narrates(self) -> bool:
        """Tells the loop to offer ``visible_step``."""
        return self.pipeline.narrates

    async def _begin(self, task_id: str) -> list[NewEvent]:
        if self._started and self._task == task_id:
            return []
        self._started, self._task = True, task_id
        return await self.pipeline.task_started(task_id)

    async def turn_finished(
        self, turn: Turn, *, task_id: str, narrations: Sequence[Narration] = ()
    ) -> list[NewEvent]:
        """``narrations``: the turn's ``visible_step`` calls; those that explain no card become
        steps right here (after the turn's phases), the others wait for their card."""
        events = await self._begin(task_id)
        events += await self.pipeline.turn_finished(turn)
        for narration in narrations:
            if narration.summary is None:
                continue
            if narration.explains is None:
                events += await self.pipeline.narrated(narration.summary)
            else:
                self._explaining.setdefault(narration.explains, []).append(narration.summary)
        if not turn.tool_calls or not turn.complete:
            events += await self._complete()
        return events

    async def _complete(self) -> list[NewEvent]:
        if self._completed:
            return []
        self._completed = True
        events = await self.pipeline.task_completed()
        events.append(self.pipeline.completed())
        return events

    async def task_finished(self, *, task_id: str) -> list[NewEvent]:
        """The loop ended without a final turn (the turn limit): still close with a receipt."""
        events = await self._begin(task_id)
        return events + await self._complete()

    async def tool_started(self, call: ToolCallPart, *, task_id: str) -> list[NewEvent]:
        events = await self._begin(task_id)
        events += await self.pipeline.tool_started(
            call.call_id, call.name, arguments_json=call.arguments_json
        )
        for summary in self._explaining.pop(call.call_id, ()):
            events += await self.pipeline.narrated(summary, tool_call_id=call.call_id)
        return events

    async def tool_finished(
        self,
        call: ToolCallPart,
        status: str,
        *,
        task_id: str,
        result: ToolResultPart | str | None = None,
    ) -> list[NewEvent]:
        """``result`` (optional) lets the policy refuse later steps that quote the tool's output;
        the loop should pass it when it can."""
        outcome = _LOOP_OUTCOMES.get(status, "failed")
        text = result.content if isinstance(result, ToolResultPart) else result
        return await self.pipeline.tool_finished(call.call_id, call.name, outcome, result_text=text)


class _HasMode(Protocol):
    @property
    def mode(self) -> str: ...


def observer_factory(
    config: Config,
    *,
    summarizer_provider: Provider | None = None,
    hidden_texts: Callable[[Any], Sequence[str]] | None = None,
) -> Callable[[Any, _HasMode], VisibleReasoningObserver | None]:
    """The runtime's ``observer_factory(run, disclosure)``: a fresh observer per task of an
    eligible run (``disclosure.mode`` decides). ``hidden_texts(run)`` returns what no step may
    quote (system prompt, instructions)."""

    def make(run: Any, disclosure: _HasMode) -> VisibleReasoningObserver | None:
        pipeline = VisibleReasoningPipeline.for_run(
            config,
            disclosure.mode,
            hidden_texts=hidden_texts(run) if hidden_texts else (),
            summarizer_provider=summarizer_provider,
        )
        return VisibleReasoningObserver(pipeline) if pipeline is not None else None

    return make
