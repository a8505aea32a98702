"""Where visible steps come from: the summarizer interface and its four built-ins.

Steps are never cut out of raw model output. A summarizer sees a lifecycle *moment* of the run
and proposes :class:`StepDraft` s; the pipeline (``events/pipeline.py``) then checks each draft
against the policy, gives it an id and a timestamp, and turns it into a ``cot.*`` event.

Made for display (``phases`` is the default, ``narration`` the recommended opt-in):

``phases``              structural steps from the run's own lifecycle (planning, calling a tool by
                        its *name*, writing the answer); no model text at all.
``narration``           what the model wrote for the reader through the ``visible_step`` tool
                        (``events/narration.py``); never its reasoning channel.

Opt-in only, each named in every receipt with a plain note (ADR 0008):

``provider_summaries``  reasoning parts of kind ``summary`` that a provider returned (OpenAI
                        reasoning summaries, OpenRouter ``reasoning.summary``, Anthropic summarized
                        thinking): reasoning, which end users see only because the operator said
                        so. Parts of kind ``raw`` or ``encrypted`` are never read.
``model``               an operator-configured summarizer model writes one new, concise sentence
                        from what the reader can already see (the turn's answer text and tool
                        names), never from reasoning; asked with reasoning switched off, its output
                        passes the same policy, including the verbatim-raw-reasoning check.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Final, Literal, Protocol, TypeAlias, runtime_checkable

from thoughtgate.events.narration import without_narration
from thoughtgate.events.payloads import DisplayPhase, StepSource
from thoughtgate.events.policy import without_emphasis
from thoughtgate.events.visible import MAX_SUMMARY_CHARS
from thoughtgate.providers.base import Provider, ReasoningRequest, TurnRequest
from thoughtgate.types import Message, Turn

__all__ = [
    "CONDENSED_CHARS",
    "AnswerStarted",
    "DraftKind",
    "ModelSummarizer",
    "Moment",
    "Narrated",
    "NarrationSummarizer",
    "PhasesSummarizer",
    "ProviderSummariesSummarizer",
    "StepDraft",
    "Summarizer",
    "TaskCompleted",
    "TaskStarted",
    "ToolFinished",
    "ToolOutcome",
    "ToolStarted",
    "TurnFinished",
    "condense",
    "safe_tool_name",
    "shorten",
]

CONDENSED_CHARS: Final = 200
"""Steps are cut to this many characters (at a word boundary) after the policy passed them."""

ToolOutcome: TypeAlias = Literal["completed", "failed", "degraded", "rejected", "skipped"]
DraftKind: TypeAlias = Literal["step", "phase", "tool_reasoning"]


# --------------------------------------------------------------------------- lifecycle moments


@dataclass(frozen=True, slots=True)
class TaskStarted:
    task_id: str | None = None


@dataclass(frozen=True, slots=True)
class AnswerStarted:
    """The first answer text of a turn arrived (optional; see ``VisibleReasoningPipeline``)."""


@dataclass(frozen=True, slots=True)
class TurnFinished:
    turn: Turn


@dataclass(frozen=True, slots=True)
class ToolStarted:
    """A tool card exists (``tool.started`` or ``tool.approval_required`` was appended)."""

    call_id: str
    tool_name: str
    _: KW_ONLY
    turn: Turn | None = None
    """The turn that asked for the call, when known."""


@dataclass(frozen=True, slots=True)
class ToolFinished:
    call_id: str
    tool_name: str
    outcome: ToolOutcome


@dataclass(frozen=True, slots=True)
class TaskCompleted:
    """The task's answer is written; no more steps follow."""


@dataclass(frozen=True, slots=True)
class Narrated:
    """The model called ``visible_step``; ``tool_call_id`` names the card it explains (already in
    the thread) or is ``None`` for a step of its own."""

    summary: str
    _: KW_ONLY
    tool_call_id: str | None = None


Moment: TypeAlias = (
    TaskStarted
    | AnswerStarted
    | TurnFinished
    | ToolStarted
    | ToolFinished
    | TaskCompleted
    | Narrated
)


@dataclass(frozen=True, slots=True)
class StepDraft:
    """A proposed step before policy: ``tool_reasoning`` drafts must name their card."""

    kind: DraftKind
    summary: str
    phase: DisplayPhase
    source: StepSource
    _: KW_ONLY
    tool_call_id: str | None = None
    quotes: str | None = None
    """The provider summary this draft was cut from. Only the built-in ``provider_summaries``
    summarizer's drafts are checked with it (ADR 0083); the pipeline ignores it from others."""


@runtime_checkable
class Summarizer(Protocol):
    """Proposes steps for a moment; must never read raw reasoning as step text."""

    name: str

    async def summarize(self, moment: Moment) -> Sequence[StepDraft]: ...


# --------------------------------------------------------------------------- helpers

_SPACE = re.compile(r"\s+")
_TITLE = re.compile(r"^\s*\*\*(?P<title>[^*\n]{3,120})\*\*(?![\w`*])")
"""A bold title ends where a word ends: ``**Comparing com**paring`` is emphasis inside a word,
not a title, and taking ``Comparing com`` from it would show a cut word that is no excerpt of
the summary (the policy then finds the summary's own words outside any quote of it)."""
_SENTENCE_END = re.compile(r"(?<=[.!?])\s")
_TOOL_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.\-]{0,63}$")
_CONDENSE_MAX_INPUT: Final = 4000


def condense(text: str) -> str:
    """The display candidate of a longer text: a bold title if the text starts with one (the
    OpenAI summary style), else its first sentence; emphasis marks and backticks removed and
    whitespace collapsed. Nothing is cut here: the policy checks the whole candidate, and only
    then does :func:`shorten` cut it for display (so a cut can never hide part of a secret)."""
    head = text[:_CONDENSE_MAX_INPUT]
    title = _TITLE.match(head)
    chosen = title.group("title") if title else _SENTENCE_END.split(head.strip(), maxsplit=1)[0]
    return _SPACE.sub(" ", without_emphasis(chosen)).strip()


def shorten(line: str, limit: int = CONDENSED_CHARS) -> str:
    """``line`` cut at a word boundary to at most ``limit`` characters, with an ellipsis."""
    limit = min(limit, MAX_SUMMARY_CHARS)
    if len(line) <= limit:
        return line
    cut = line[: limit - 1].rsplit(" ", 1)[0].rstrip(",;:")
    return cut + "…"


def safe_tool_name(name: str) -> str:
    """The tool's name when it looks like an identifier, else a neutral word."""
    return name if _TOOL_NAME.match(name) else "a tool"


# --------------------------------------------------------------------------- built-ins


class ProviderSummariesSummarizer:
    """Steps from provider-written summaries only (``reasoning_kind == "summary"``)."""

    name = "provider_summaries"

    async def summarize(self, moment: Moment) -> Sequence[StepDraft]:
        if not isinstance(moment, TurnFinished):
            return []
        drafts = []
        for part in moment.turn.reasoning_parts:
            if part.reasoning_kind != "summary" or part.redacted or not part.text.strip():
                continue
            line = condense(part.text)
            if line:
                drafts.append(
                    StepDraft("step", line, "thinking", "provider_summary", quotes=part.text)
                )
        return drafts


class NarrationSummarizer:
    """Steps the model wrote for the reader through ``visible_step``, whitespace collapsed.

    The whole sentence is the draft (not only its first sentence: it was written to be shown);
    the pipeline checks it whole and then cuts it for display.
    """

    name = "narration"

    async def summarize(self, moment: Moment) -> Sequence[StepDraft]:
        if not isinstance(moment, Narrated):
            return []
        line = _SPACE.sub(" ", moment.summary).strip()
        if not line:
            return []
        if moment.tool_call_id is not None:
            return [
                StepDraft(
                    "tool_reasoning", line, "acting", "narration", tool_call_id=moment.tool_call_id
                )
            ]
        return [StepDraft("step", line, "thinking", "narration")]


class PhasesSummarizer:
    """Structural steps from the lifecycle; the only run data they use is a tool's name."""

    name = "phases"

    async def summarize(self, moment: Moment) -> Sequence[StepDraft]:
        match moment:
            case TaskStarted():
                return [StepDraft("phase", "Planning", "planning", "phases")]
            case AnswerStarted():
                return [StepDraft("phase", "Writing the answer", "writing", "phases")]
            case TurnFinished(turn=turn) if turn.text.strip() and not turn.tool_calls:
                return [StepDraft("phase", "Writing the answer", "writing", "phases")]
            case ToolStarted(call_id=call_id, tool_name=name):
                label = f"Calling {safe_tool_name(name)}"
                return [StepDraft("phase", label, "acting", "phases", tool_call_id=call_id)]
            case ToolFinished(tool_name=name, outcome=outcome):
                return [StepDraft("phase", _after_tool(name, outcome), "thinking", "phases")]
            case TaskCompleted():
                return [StepDraft("phase", "Done", "done", "phases")]
        return []


def _after_tool(name: str, outcome: ToolOutcome) -> str:
    tool = safe_tool_name(name)
    if outcome == "completed":
        return f"Reviewing the result of {tool}"
    if outcome in ("rejected", "skipped"):
        return f"Continuing without {tool}"
    return f"Handling a problem with {tool}"


_SUMMARIZER_SYSTEM: Final = (
    "You write progress notes for a person watching an AI agent work. Reply with ONE new "
    "sentence of at most 20 words, in plain language, saying what the agent is doing. "
    "Use your own words: do not quote the agent. Never include credentials, URLs, file paths, "
    "host names, code, JSON, tool arguments or tool results. Reply with the sentence only."
)


class ModelSummarizer:
    """An operator-configured model writes one new sentence per answering turn, and one per tool
    call saying what the tool is for; reasoning is switched off for these requests.

    It reads only what the reader can already see (ADR 0008): the turn's answer text (most recent
    ``max_input_chars``) and the names of the tools called -- never the model's reasoning of any
    kind, never tool arguments or results. Whatever it answers is only a draft: the pipeline drops
    it when it repeats raw reasoning verbatim or breaks any other rule.
    """

    name = "model"

    def __init__(
        self,
        provider: Provider,
        *,
        max_input_chars: int = 6000,
        timeout_s: float = 30.0,
        max_tokens: int = 96,
    ) -> None:
        self.provider = provider
        self.max_input_chars = max_input_chars
        self.timeout_s = timeout_s
        self.max_tokens = max_tokens

    async def summarize(self, moment: Moment) -> Sequence[StepDraft]:
        match moment:
            case TurnFinished(turn=turn) if not turn.tool_calls and turn.text.strip():
                line = await self._ask(turn, "Describe what the agent is telling the user.")
                return [StepDraft("step", line, "thinking", "model")] if line else []
            case ToolStarted(call_id=call_id, tool_name=name, turn=turn) if turn is not None:
                tool = safe_tool_name(name)
                line = await self._ask(turn, f"Say what the agent is using {tool} for.")
                if not line:
                    return []
                return [StepDraft("tool_reasoning", line, "acting", "model", tool_call_id=call_id)]
        return []

    def _material(self, turn: Turn, task: str) -> str:
        """What the reader could already see of this turn; ``turn.reasoning_parts`` are never read."""
        said = turn.text[-self.max_input_chars :] or "(nothing yet)"
        names = [safe_tool_name(c.name) for c in without_narration(turn.tool_calls)]
        tools = ", ".join(names) or "none"
        return f"{task}\n\nThe agent said:\n{said}\n\nTools requested: {tools}"

    async def _ask(self, turn: Turn, task: str) -> str:
        request = TurnRequest(
            [Message.user(self._material(turn, task))],
            system=_SUMMARIZER_SYSTEM,
            reasoning=ReasoningRequest(enabled=False),
            max_tokens=self.max_tokens,
            temperature=0.0,
        )
        async with asyncio.timeout(self.timeout_s):  # not wait_for: keeps a cancellation (3.11)
            answer = await self.provider.request(request)
        return condense(answer.text)
