"""One payload type per event type: the wire shape of the event log, each field with its class.

Payloads are ``TypedDict`` s, not classes with behaviour: an event's payload *is* the plain dict the
store keeps and the wire carries, so writing one costs a dict and reading one costs nothing.
``mypy --strict`` checks every writer's keys and value types against these declarations;
:mod:`thoughtgate.events.catalogue` wraps them in one discriminated ``TypeAdapter`` that validates
recorded events (in tests) and publishes the catalogue as JSON Schema. Every field names exactly
one visibility class (:mod:`thoughtgate.events.visibility`), and the one output filter reads
nothing else to decide what a reader may see.

Rules every payload keeps:

* snake_case keys, no aliases: one name per fact;
* unknown keys are refused (``extra="forbid"``) when validated, and withheld from every reader on
  display surfaces by the filter;
* a field that may be withheld from some readers is simply absent in their copy (never null).

The vocabulary's version is ``thoughtgate.events.schema.EVENT_VERSION``; every stored event
records the version it was written in (the envelope's ``v``), and :func:`upgrade_payload` turns
an older payload into the current shape when it is read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, NotRequired, TypeAlias

from pydantic import ConfigDict, with_config
from typing_extensions import TypedDict

from thoughtgate.disclosure import ChainOfThought
from thoughtgate.events.schema import EventType
from thoughtgate.events.visibility import Vis, VisClass
from thoughtgate.types import ContinuityBlock, Usage

__all__ = [
    "EVENT_SPECS",
    "AgentResponsePayload",
    "CapabilityResolvedPayload",
    "ContinuityBlockPayload",
    "ContinuityDroppedPayload",
    "CotCompletedPayload",
    "DisplayPhase",
    "EventSpec",
    "MessageCompletedPayload",
    "MessageDeltaPayload",
    "MessagePartiallyCompletedPayload",
    "ModelCallPayload",
    "ReasoningDeltaPayload",
    "ReasoningPartPayload",
    "ReceiptPayload",
    "ResolutionSources",
    "RunEndedPayload",
    "RunInterruptedPayload",
    "RunResumedPayload",
    "RunStartedPayload",
    "RunStatus",
    "SettingSource",
    "StepSource",
    "TaskCompletedPayload",
    "TaskStartedPayload",
    "TaskStatus",
    "TokenUsage",
    "ToolApprovalRequiredPayload",
    "ToolApprovalResponsePayload",
    "ToolApprovalTimeoutPayload",
    "ToolCallSummary",
    "ToolCardFields",
    "ToolCompletedPayload",
    "ToolDefinitionPayload",
    "ToolDegradedPayload",
    "ToolErrorKind",
    "ToolFailedPayload",
    "ToolProgressPayload",
    "ToolStartedPayload",
    "TraceCarrier",
    "TraceMetadata",
    "VisibleStepPayload",
    "WorkerCompletedPayload",
    "token_usage",
    "trace_metadata",
    "upgrade_payload",
]

_STRICT = ConfigDict(extra="forbid", use_attribute_docstrings=True)

RunStatus: TypeAlias = Literal[
    "pending", "running", "completed", "partial", "failed", "error", "interrupted"
]
TaskStatus: TypeAlias = Literal[
    "pending", "running", "completed", "partial", "failed", "interrupted"
]
DisplayPhase: TypeAlias = Literal["planning", "thinking", "acting", "writing", "done"]
"""The coarse phase a display shows (``acting`` = a tool is being used)."""
StepSource: TypeAlias = Literal["phases", "narration", "provider_summary", "model"]
"""Which summarizer produced a visible step (never raw model output): the run's ``phases``, the
model's ``narration`` through ``visible_step``, or -- only when the operator named them -- a
``provider_summary`` or the operator's summarizer ``model``."""
ToolErrorKind: TypeAlias = Literal[
    "invalid_arguments", "tool_error", "unknown_tool", "fallback_failed", "interrupted"
]
"""Why a tool call failed, in a form every reader may see (the error text is tool detail).
``interrupted``: the process executing the run stopped while the tool ran; a resumed run never
runs it again, since it may have had its effect (ADR 0013)."""
SettingSource: TypeAlias = Literal["explicit", "run", "config", "default"]


# --------------------------------------------------------------------------- nested shapes


@with_config(_STRICT)
class TokenUsage(TypedDict, total=False):
    """Token counts as providers bill them (``output_tokens`` includes reasoning tokens).

    Every billed count is ``billing`` (developer and above, ADR 0163): output less the answer's
    tokens is the reasoning's size, and a tool loop's later turns are billed again, as input, for
    the signed thinking or encrypted reasoning sent back, cache reads and writes included. Below
    developer ``usage`` is ``{}``: no count that could tell how much the model reasoned."""

    input_tokens: Annotated[int, Vis.BILLING]
    output_tokens: Annotated[int, Vis.BILLING]
    reasoning_tokens: Annotated[int, Vis.REASONING]
    """Derived from the reasoning: shown only where reasoning itself is."""
    cache_read_tokens: Annotated[int, Vis.BILLING]
    cache_write_tokens: Annotated[int, Vis.BILLING]
    total_tokens: Annotated[int, Vis.BILLING]


def token_usage(usage: Usage) -> TokenUsage:
    """The payload form of a :class:`~thoughtgate.types.Usage`."""
    return {
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "reasoning_tokens": usage.reasoning_tokens,
        "cache_read_tokens": usage.cache_read_tokens,
        "cache_write_tokens": usage.cache_write_tokens,
        "total_tokens": usage.total_tokens,
    }


@with_config(_STRICT)
class ToolCallSummary(TypedDict):
    """One tool call a model turn asked for."""

    call_id: Annotated[str, Vis.PUBLIC]
    """The provider's id for the call, at most 128 letters, digits and ``_.:/@+=-``; any other
    is recorded as ``call_tg_`` and a digest of it (ADR 0168)."""
    name: Annotated[str, Vis.PUBLIC]
    """The tool the model named, in the same form; any other name is recorded as
    ``invalid_tool_name`` (no tool's: the call fails as an unknown tool's, ADR 0168)."""
    input: Annotated[dict[str, Any], Vis.TOOL_DETAIL]
    """The model's arguments."""


@with_config(_STRICT)
class ReasoningPartPayload(TypedDict):
    """One reasoning part of a turn, as the provider returned it."""

    kind: Annotated[Literal["reasoning"], Vis.PUBLIC]
    text: Annotated[str, Vis.REASONING]
    reasoning_kind: Annotated[Literal["raw", "summary", "encrypted"], Vis.REASONING]
    provider: Annotated[str, Vis.PUBLIC]
    model: Annotated[str, Vis.PUBLIC]
    signature: Annotated[str | None, Vis.CARRIER]
    """Anthropic's (or an OpenRouter detail's) signature: a continuity carrier."""
    redacted: Annotated[bool, Vis.REASONING]
    index: Annotated[int, Vis.REASONING]


@with_config(_STRICT)
class ContinuityBlockPayload(TypedDict):
    """An opaque block the provider demands back inside the same tool loop. As a carrier it reaches
    readers only as ``{"carrier": <carrier>, "present": true}``."""

    kind: Annotated[Literal["continuity"], Vis.PUBLIC]
    carrier: Annotated[str, Vis.PUBLIC]
    """Its shape: ``anthropic.thinking``, ``openai.reasoning_item``, ..."""
    data: Annotated[dict[str, Any], Vis.CARRIER]
    provider: Annotated[str, Vis.PUBLIC]
    model: Annotated[str, Vis.PUBLIC]


@with_config(_STRICT)
class TraceCarrier(TypedDict):
    """That a carrier existed (no bytes of it)."""

    carrier: Annotated[str, Vis.PUBLIC]
    provider: Annotated[str, Vis.PUBLIC]
    model: Annotated[str, Vis.PUBLIC]


@with_config(_STRICT)
class TraceMetadata(TypedDict):
    """A task's reasoning on the trace surface (``worker.completed``)."""

    reasoning: Annotated[str, Vis.REASONING]
    reasoning_chars: Annotated[int, Vis.REASONING]
    reasoning_bytes: Annotated[int, Vis.REASONING]
    continuity: Annotated[list[TraceCarrier], Vis.PUBLIC]


def trace_metadata(reasoning: str, continuity: Iterable[ContinuityBlock]) -> TraceMetadata:
    """The trace form of some reasoning: its text and sizes, and which carriers existed (never
    their bytes)."""
    return {
        "reasoning": reasoning,
        "reasoning_chars": len(reasoning),
        "reasoning_bytes": len(reasoning.encode("utf-8", "surrogatepass")),
        "continuity": [
            {"carrier": b.carrier, "provider": b.provider, "model": b.model} for b in continuity
        ],
    }


@with_config(_STRICT)
class ResolutionSources(TypedDict):
    """Which layer decided each setting (explicit > run > config > default)."""

    chain_of_thought: Annotated[SettingSource, Vis.PUBLIC]
    worker_backend: Annotated[SettingSource, Vis.PUBLIC]


@with_config(_STRICT)
class ReceiptPayload(TypedDict):
    """The disclosure receipt: what was withheld from readers and why (the same for everyone)."""

    mode: Annotated[str, Vis.PUBLIC]
    raw_reasoning_exists: Annotated[bool, Vis.PUBLIC]
    opaque_reasoning_exists: Annotated[bool, Vis.PUBLIC]
    raw_reasoning_visible_to: Annotated[Literal["developer"] | None, Vis.PUBLIC]
    raw_reasoning_surface: Annotated[Literal["display", "trace"] | None, Vis.PUBLIC]
    steps_shown: Annotated[int, Vis.PUBLIC]
    phases_shown: Annotated[int, Vis.PUBLIC]
    steps_dropped_by_policy: Annotated[int, Vis.PUBLIC]
    dropped_by_reason: Annotated[dict[str, int], Vis.PUBLIC]
    summarizers: Annotated[list[str], Vis.PUBLIC]
    summarizer_failures: Annotated[int, Vis.PUBLIC]
    step_sources: NotRequired[Annotated[dict[str, int], Vis.PUBLIC]]
    """Steps and phases shown, per source that produced any (absent in receipts recorded before
    it existed)."""
    notes: NotRequired[Annotated[list[str], Vis.PUBLIC]]
    """A plain statement for each summarizer the operator named that is not made for display
    (``provider_summaries``, ``model``); derived from ``summarizers``."""


@with_config(_STRICT)
class ToolDefinitionPayload(TypedDict):
    """A tool as it was offered to the model (name, description, JSON schema of its arguments)."""

    type: Annotated[Literal["function"], Vis.PUBLIC]
    name: Annotated[str, Vis.PUBLIC]
    description: Annotated[str, Vis.PUBLIC]
    parameters: Annotated[dict[str, Any], Vis.PUBLIC]


@with_config(_STRICT)
class ModelCallPayload(TypedDict):
    """How one model turn was requested and answered, seen from thoughtgate's side of the wire
    (what OpenTelemetry's ``gen_ai.request.*``, ``gen_ai.response.*`` and ``server.*`` report)."""

    stream: Annotated[bool, Vis.PUBLIC]
    """Whether the turn was streamed (the agent loop always streams)."""
    max_tokens: Annotated[int, Vis.PUBLIC]
    started_at: Annotated[float, Vis.PUBLIC]
    """When the request was sent (seconds since the epoch)."""
    first_chunk_at: NotRequired[Annotated[float, Vis.PUBLIC]]
    """When the first chunk of any kind arrived (text, reasoning, a tool call, usage): the time to
    first token is ``first_chunk_at - started_at``."""
    ended_at: NotRequired[Annotated[float, Vis.PUBLIC]]
    """When the turn's stream ended, finished or cut: its duration is ``ended_at - started_at``
    (absent in turns recorded before it existed)."""
    temperature: NotRequired[Annotated[float, Vis.PUBLIC]]
    response_id: NotRequired[Annotated[str, Vis.OPERATOR]]
    """The provider's id for the response (``msg_…``, ``chatcmpl-…``, ``resp_…``): it names the
    response in the provider's own logs and storage."""
    response_model: NotRequired[Annotated[str, Vis.PUBLIC]]
    """The model the provider says answered (often a dated snapshot of the one asked for); absent
    when the provider named none of at most 128 letters, digits and ``_.:/@+=-`` (ADR 0168)."""
    server: NotRequired[Annotated[str, Vis.PUBLIC]]
    """The server the endpoint rules recognise (``anthropic``, ``deepseek``, ``ollama``, …;
    ``generic`` when unknown)."""
    server_address: NotRequired[Annotated[str, Vis.OPERATOR]]
    server_port: NotRequired[Annotated[int, Vis.OPERATOR]]


# --------------------------------------------------------------------------- run and task


@with_config(_STRICT)
class RunStartedPayload(TypedDict):
    prompt: Annotated[str, Vis.PUBLIC]
    model: Annotated[str | None, Vis.PUBLIC]
    tasks: Annotated[int, Vis.PUBLIC]
    """How many tasks the run holds."""


@with_config(_STRICT)
class CapabilityResolvedPayload(TypedDict):
    chain_of_thought: Annotated[ChainOfThought, Vis.PUBLIC]
    worker_backend: Annotated[Literal["inline", "provider"], Vis.PUBLIC]
    reasoning_requested: Annotated[bool, Vis.PUBLIC]
    sources: Annotated[ResolutionSources, Vis.PUBLIC]
    model: Annotated[str | None, Vis.PUBLIC]


@with_config(_STRICT)
class RunEndedPayload(TypedDict):
    """``run.settlement.completed``, ``run.failed`` and ``run.error``."""

    status: Annotated[RunStatus, Vis.PUBLIC]
    usage: Annotated[TokenUsage, Vis.PUBLIC]
    """What the run was billed: the usage its providers reported for every model turn that
    returned, in every task, failed ones too -- the sum of its ``agent.response`` events'
    (ADR 0131)."""
    error: NotRequired[Annotated[str, Vis.PUBLIC]]
    """thoughtgate's description of the failure (provider, store, runtime), in its own words
    only; tool failures never end a run, so no tool data reaches it."""
    error_type: NotRequired[Annotated[str, Vis.PUBLIC]]
    """The kind of failure, with ``error``: a provider's error code (``overloaded_error``, ...),
    else the error's class (``ProviderStreamError``, ``StoreUnavailableError``, ...), or
    ``max_turns`` for a task stopped at the turn limit (as in ``agent.response``)."""
    error_detail: NotRequired[Annotated[str, Vis.REASONING]]
    """The failure's own words, which thoughtgate did not write: a provider's error text (its
    HTTP error body, OpenRouter's ``metadata.raw``, an in-stream error event), a library's or an
    inline worker's exception. They may quote the request, earlier turns' reasoning included, so
    they are recorded and shown where reasoning is (ADR 0071): never on a ``hidden`` run; absent
    in events recorded before."""


@with_config(_STRICT)
class RunInterruptedPayload(TypedDict):
    status: Annotated[Literal["interrupted"], Vis.PUBLIC]
    reason: Annotated[str, Vis.PUBLIC]
    """Why it ended early: Ctrl-C, a cancelled call, a shutdown, or its process is gone."""
    usage: NotRequired[Annotated[TokenUsage, Vis.PUBLIC]]
    """What it was billed before it was interrupted: every model turn that returned, in tasks
    that finished and in the one cut (ADR 0131); closed by another process (a sweep, a
    shutdown), the sum of its ``agent.response`` events'. Absent in events recorded before
    ADR 0131 by a process that did not execute the run."""
    error_detail: NotRequired[Annotated[str, Vis.REASONING]]
    """The words of the failure that closed it, which thoughtgate did not write (a library's
    exception when a run could not resume, be queued again or be started: its class and first
    line); ``reason`` names only its class. Recorded and shown where reasoning is (ADRs 0071,
    0073): never on a ``hidden`` run; absent in events recorded before."""


@with_config(_STRICT)
class RunResumedPayload(TypedDict):
    """A run whose process stopped continues in another (or a restarted) process (ADR 0013)."""

    reason: Annotated[str, Vis.PUBLIC]
    """Why it had stopped: its process crashed, was killed, shut down or restarted."""
    attempt: Annotated[int, Vis.PUBLIC]
    """Which execution of the run this is (2 = its first resume)."""
    after_seq: Annotated[int, Vis.PUBLIC]
    """Where it continues: after the last event recorded before it stopped. Completed steps are
    not done again (a finished tool call keeps its recorded result); a model turn cut by the stop
    is recorded as cut and asked again."""
    executor: Annotated[str, Vis.OPERATOR]
    """The process that continues it (host digest, process id, start nonce)."""
    previous_executor: NotRequired[Annotated[str, Vis.OPERATOR]]
    """The process that had it before, when one was recorded."""


@with_config(_STRICT)
class TaskStartedPayload(TypedDict):
    index: Annotated[int, Vis.PUBLIC]
    prompt: Annotated[str, Vis.PUBLIC]
    backend: Annotated[str | None, Vis.PUBLIC]
    model: Annotated[str | None, Vis.PUBLIC]
    system: NotRequired[Annotated[str, Vis.TRACE]]
    """The system prompt the model was given: the trace surface only (no visible step may quote
    it either)."""
    tools: NotRequired[Annotated[list[ToolDefinitionPayload], Vis.TRACE]]
    """The tools the model was offered, ``visible_step`` included when narrating."""
    history: NotRequired[Annotated[list[dict[str, Any]], Vis.TRACE]]
    """Earlier conversation the task was given before its prompt (no reasoning ever), as
    ``{"role", "parts": [{"type": "text" | "tool_call" | "tool_call_response", ...}]}``."""


@with_config(_STRICT)
class TaskCompletedPayload(TypedDict):
    status: Annotated[TaskStatus, Vis.PUBLIC]
    output: Annotated[str | None, Vis.PUBLIC]
    """The task's answer: public, as in the run view."""
    error: Annotated[str | None, Vis.PUBLIC]
    """thoughtgate's description of the failure, in its own words only."""
    error_detail: NotRequired[Annotated[str, Vis.REASONING]]
    """The failure's own words, which thoughtgate did not write: a provider's error text (its
    HTTP error body, OpenRouter's ``metadata.raw``, an in-stream error event), a library's or an
    inline worker's exception. They may quote the request, earlier turns' reasoning included, so
    they are recorded and shown where reasoning is (ADR 0071): never on a ``hidden`` run; absent
    in events recorded before."""
    usage: NotRequired[Annotated[TokenUsage, Vis.PUBLIC]]
    """What the task's model turns were billed, on a task that ended without
    ``worker.completed`` (it failed or was cut; ADR 0131): so a run's usage is the sum of its
    tasks' however they ended. Absent when ``worker.completed`` says it, and in events recorded
    before."""


@with_config(_STRICT)
class WorkerCompletedPayload(TypedDict):
    """How a task's worker ended; ``trace`` holds its reasoning for the trace surface."""

    mode: Annotated[ChainOfThought, Vis.PUBLIC]
    backend: Annotated[str, Vis.PUBLIC]
    model: Annotated[str | None, Vis.PUBLIC]
    status: Annotated[Literal["completed", "partial", "failed"], Vis.PUBLIC]
    usage: Annotated[TokenUsage, Vis.PUBLIC]
    turns: Annotated[int, Vis.PUBLIC]
    duration_s: Annotated[float, Vis.PUBLIC]
    finish_reason: Annotated[str | None, Vis.PUBLIC]
    trace: NotRequired[Annotated[TraceMetadata, Vis.TRACE]]


# --------------------------------------------------------------------------- answer and reasoning


@with_config(_STRICT)
class MessageDeltaPayload(TypedDict):
    text: Annotated[str, Vis.PUBLIC]
    turn: Annotated[int, Vis.PUBLIC]


@with_config(_STRICT)
class MessageCompletedPayload(TypedDict):
    text: Annotated[str, Vis.PUBLIC]
    """The whole answer; it replaces the deltas."""
    finish_reason: NotRequired[Annotated[str | None, Vis.PUBLIC]]


@with_config(_STRICT)
class MessagePartiallyCompletedPayload(TypedDict):
    text: Annotated[str, Vis.PUBLIC]
    """What arrived of the answer before it was cut."""
    reason: Annotated[Literal["provider_error", "max_turns", "worker_error"], Vis.PUBLIC]
    error: Annotated[str, Vis.PUBLIC]
    """thoughtgate's description of the failure, in its own words only."""
    status: NotRequired[Annotated[int | None, Vis.PUBLIC]]
    """The provider's HTTP status, when it answered with one."""
    error_type: NotRequired[Annotated[str | None, Vis.PUBLIC]]
    """The provider's error type (``overloaded_error``, ...), when it is an identifier."""
    error_detail: NotRequired[Annotated[str, Vis.REASONING]]
    """The failure's own words, which thoughtgate did not write: a provider's error text (its
    HTTP error body, OpenRouter's ``metadata.raw``, an in-stream error event), a library's or an
    inline worker's exception. They may quote the request, earlier turns' reasoning included, so
    they are recorded and shown where reasoning is (ADR 0071): never on a ``hidden`` run; absent
    in events recorded before."""


@with_config(_STRICT)
class ReasoningDeltaPayload(TypedDict):
    text: Annotated[str, Vis.REASONING]
    reasoning_kind: Annotated[Literal["raw", "summary", "encrypted"], Vis.REASONING]
    index: Annotated[int, Vis.REASONING]
    turn: Annotated[int, Vis.PUBLIC]


@with_config(_STRICT)
class AgentResponsePayload(TypedDict):
    """One model turn as recorded; reasoning fields only on ``surface`` runs."""

    turn: Annotated[int, Vis.PUBLIC]
    answer: Annotated[str, Vis.PUBLIC]
    complete: Annotated[bool, Vis.PUBLIC]
    finish_reason: Annotated[str | None, Vis.PUBLIC]
    raw_finish_reason: Annotated[str | None, Vis.PUBLIC]
    """The provider's own stop reason when it is at most 128 letters, digits and ``_.:/@+=-``
    (``end_turn``, ``tool_calls``), else ``""`` (ADR 0168)."""
    provider: Annotated[str, Vis.PUBLIC]
    model: Annotated[str, Vis.PUBLIC]
    usage: Annotated[TokenUsage, Vis.PUBLIC]
    """What the provider reported for the turn; a run's usage is the sum over its
    ``agent.response`` events (ADR 0131). Zero on a turn a stopped process left unfinished
    (``error`` ``cut: the process executing the run stopped ...``): not known, since the turn
    never returned to be counted."""
    tool_calls: Annotated[list[ToolCallSummary], Vis.PUBLIC]
    error: NotRequired[Annotated[str, Vis.PUBLIC]]
    """What cut this turn, in thoughtgate's words: the provider's error; or ``cut: ...`` for a
    turn a stopped process left unfinished, and for the stand-in of a turn that answered and was
    billed but whose own record a cancel or a failure cut off (its answer and usage only: no
    calls, no reasoning; ADR 0131, amended)."""
    error_type: NotRequired[Annotated[str, Vis.PUBLIC]]
    """The provider's error code (``overloaded_error``, ...), else the error's class;
    ``interrupted`` for a turn a stopped process left unfinished, ``unrecorded`` for a stand-in
    (its call returned: telemetry does not mark it failed)."""
    error_detail: NotRequired[Annotated[str, Vis.REASONING]]
    """The failure's own words, which thoughtgate did not write: a provider's error text (its
    HTTP error body, OpenRouter's ``metadata.raw``, an in-stream error event), a library's or an
    inline worker's exception. They may quote the request, earlier turns' reasoning included, so
    they are recorded and shown where reasoning is (ADR 0071): never on a ``hidden`` run; absent
    in events recorded before."""
    call: NotRequired[Annotated[ModelCallPayload, Vis.PUBLIC]]
    """How the turn was requested and when it answered (absent in events recorded before)."""
    trace: NotRequired[Annotated[TraceMetadata, Vis.TRACE]]
    """``telemetry_only`` runs: this turn's reasoning, for the trace surface and telemetry."""
    reasoning: NotRequired[Annotated[str, Vis.REASONING]]
    reasoning_chars: NotRequired[Annotated[int, Vis.REASONING]]
    reasoning_bytes: NotRequired[Annotated[int, Vis.REASONING]]
    reasoning_parts: NotRequired[Annotated[list[ReasoningPartPayload], Vis.REASONING]]
    continuity: NotRequired[Annotated[list[ContinuityBlockPayload], Vis.CARRIER]]


@with_config(_STRICT)
class ContinuityDroppedPayload(TypedDict):
    """A carrier from another provider or model was not sent back (and why)."""

    carrier: Annotated[str, Vis.PUBLIC]
    from_provider: Annotated[str, Vis.PUBLIC]
    from_model: Annotated[str, Vis.PUBLIC]
    reason: Annotated[str, Vis.PUBLIC]
    turn: Annotated[int, Vis.PUBLIC]


# --------------------------------------------------------------------------- visible reasoning


@with_config(_STRICT)
class VisibleStepPayload(TypedDict):
    """``cot.step``, ``cot.phase`` and ``cot.tool.reasoning``: a short, policy-checked display
    step, never reasoning itself."""

    marker: Annotated[Literal["visible_reasoning_v1"], Vis.PUBLIC]
    step_id: Annotated[str, Vis.PUBLIC]
    summary: Annotated[str, Vis.PUBLIC]
    phase: Annotated[DisplayPhase, Vis.PUBLIC]
    ts: Annotated[float, Vis.PUBLIC]
    tool_call_id: Annotated[str | None, Vis.PUBLIC]
    source: Annotated[StepSource, Vis.PUBLIC]


@with_config(_STRICT)
class CotCompletedPayload(TypedDict):
    marker: Annotated[Literal["visible_reasoning_v1"], Vis.PUBLIC]
    ts: Annotated[float, Vis.PUBLIC]
    receipt: Annotated[ReceiptPayload, Vis.PUBLIC]


# --------------------------------------------------------------------------- tools


@with_config(_STRICT)
class ToolCardFields(TypedDict):
    """The fields every ``tool.*`` event carries."""

    call_id: Annotated[str, Vis.PUBLIC]
    """The model's id for the call, as ``agent.response`` records it (bounded, ADR 0168); every
    event of one tool card carries it."""
    tool_key: Annotated[str, Vis.PUBLIC]
    """The tool's name (``invalid_tool_name`` for a name no tool could have, ADR 0168)."""
    turn: Annotated[int, Vis.PUBLIC]
    label: Annotated[str, Vis.PUBLIC]
    """What a card shows every reader."""


@with_config(_STRICT)
class ToolApprovalRequiredPayload(ToolCardFields):
    input: Annotated[dict[str, Any], Vis.TOOL_DETAIL]


@with_config(_STRICT)
class ToolApprovalResponsePayload(ToolCardFields):
    decision: Annotated[Literal["approve", "reject"], Vis.PUBLIC]
    by: Annotated[str, Vis.OPERATOR]
    """Who answered: a key name, or ``local`` for the terminal."""


@with_config(_STRICT)
class ToolApprovalTimeoutPayload(ToolCardFields):
    timeout_s: Annotated[float, Vis.PUBLIC]


@with_config(_STRICT)
class ToolStartedPayload(ToolCardFields):
    input: Annotated[dict[str, Any], Vis.TOOL_DETAIL]


@with_config(_STRICT)
class ToolProgressPayload(ToolCardFields):
    message: Annotated[str, Vis.TOOL_DETAIL]
    """Written by the tool: it can quote its input."""


@with_config(_STRICT)
class ToolCompletedPayload(ToolCardFields):
    output: Annotated[str, Vis.TOOL_DETAIL]


@with_config(_STRICT)
class ToolFailedPayload(ToolCardFields):
    error: Annotated[str, Vis.TOOL_DETAIL]
    """``<Type>: <message>``; validation errors quote the model's arguments."""
    error_kind: Annotated[ToolErrorKind, Vis.PUBLIC]


@with_config(_STRICT)
class ToolDegradedPayload(ToolCardFields):
    output: Annotated[str, Vis.TOOL_DETAIL]
    """The fallback's result."""
    error: Annotated[str, Vis.TOOL_DETAIL]
    error_kind: Annotated[ToolErrorKind, Vis.PUBLIC]


# --------------------------------------------------------------------------- the catalogue


@dataclass(frozen=True, slots=True)
class EventSpec:
    """An event type, its payload type and the class of the event as a whole."""

    name: str
    payload: type
    doc: str
    visibility: VisClass = VisClass.PUBLIC


_SPECS = (
    EventSpec(EventType.RUN_STARTED, RunStartedPayload, "A run was created."),
    EventSpec(
        EventType.CAPABILITY_RESOLVED,
        CapabilityResolvedPayload,
        "The run's disclosure mode and worker backend, and which layer chose each.",
    ),
    EventSpec(EventType.TASK_STARTED, TaskStartedPayload, "A task began."),
    EventSpec(EventType.TASK_COMPLETED, TaskCompletedPayload, "A task ended, with its answer."),
    EventSpec(EventType.MESSAGE_DELTA, MessageDeltaPayload, "A piece of the answer text."),
    EventSpec(
        EventType.MESSAGE_COMPLETED, MessageCompletedPayload, "The answer is complete (terminal)."
    ),
    EventSpec(
        EventType.MESSAGE_PARTIALLY_COMPLETED,
        MessagePartiallyCompletedPayload,
        "The answer was cut: provider error, turn limit or worker error (terminal).",
    ),
    EventSpec(
        EventType.REASONING_DELTA,
        ReasoningDeltaPayload,
        "A piece of raw reasoning, live (surface runs only).",
        VisClass.REASONING,
    ),
    EventSpec(EventType.AGENT_RESPONSE, AgentResponsePayload, "One model turn, recorded whole."),
    EventSpec(
        EventType.WORKER_COMPLETED,
        WorkerCompletedPayload,
        "How a task's worker ended; its trace metadata is for the trace surface.",
    ),
    EventSpec(
        EventType.CONTINUITY_DROPPED,
        ContinuityDroppedPayload,
        "A carrier of another provider or model was not sent back.",
    ),
    EventSpec(EventType.COT_STEP, VisibleStepPayload, "A visible step (added or updated)."),
    EventSpec(EventType.COT_PHASE, VisibleStepPayload, "A phase change."),
    EventSpec(
        EventType.COT_TOOL_REASONING,
        VisibleStepPayload,
        "A safe explanation attached to a tool card already in the thread.",
    ),
    EventSpec(EventType.COT_COMPLETED, CotCompletedPayload, "The disclosure receipt."),
    EventSpec(
        EventType.TOOL_APPROVAL_REQUIRED,
        ToolApprovalRequiredPayload,
        "A tool call waits for a person.",
    ),
    EventSpec(
        EventType.TOOL_APPROVAL_RESPONSE,
        ToolApprovalResponsePayload,
        "A person answered an approval.",
    ),
    EventSpec(
        EventType.TOOL_APPROVAL_TIMEOUT,
        ToolApprovalTimeoutPayload,
        "Nobody answered in time; the tool was not run.",
    ),
    EventSpec(EventType.TOOL_STARTED, ToolStartedPayload, "A tool began executing."),
    EventSpec(EventType.TOOL_PROGRESS, ToolProgressPayload, "A tool reported progress."),
    EventSpec(EventType.TOOL_COMPLETED, ToolCompletedPayload, "A tool returned its result."),
    EventSpec(
        EventType.TOOL_FAILED,
        ToolFailedPayload,
        "A tool call failed (not terminal: the model is told).",
    ),
    EventSpec(
        EventType.TOOL_DEGRADED, ToolDegradedPayload, "A tool failed; its fallback answered."
    ),
    EventSpec(
        EventType.RUN_SETTLEMENT_COMPLETED,
        RunEndedPayload,
        "The run ended: completed or partial (terminal).",
    ),
    EventSpec(EventType.RUN_FAILED, RunEndedPayload, "The run failed (terminal)."),
    EventSpec(
        EventType.RUN_ERROR, RunEndedPayload, "The run ended with an internal error (terminal)."
    ),
    EventSpec(
        EventType.RUN_INTERRUPTED,
        RunInterruptedPayload,
        "The run ended before it could finish: cancelled, or its process gone and it could not "
        "resume (terminal).",
    ),
    EventSpec(
        EventType.RUN_RESUMED,
        RunResumedPayload,
        "The run continues after its process stopped, from its last completed step.",
    ),
)

EVENT_SPECS: Mapping[str, EventSpec] = {spec.name: spec for spec in _SPECS}
"""Every event type of the vocabulary (an event of any other type is unknown to every reader)."""


# --------------------------------------------------------------------------- older versions

_V0_TOOL_KEYS = {"callId": "call_id", "toolKey": "tool_key"}


def _v0_error_kind(error: object) -> ToolErrorKind:
    text = error if isinstance(error, str) else ""
    if text.startswith("unknown tool"):
        return "unknown_tool"
    if text.startswith("ToolArgumentsError"):
        return "invalid_arguments"
    return "fallback_failed" if "; fallback failed:" in text else "tool_error"


def upgrade_payload(event_type: str, version: int, payload: Mapping[str, Any]) -> Mapping[str, Any]:
    """A payload written in an older vocabulary version, in the current shape.

    Version 0 (before the vocabulary was typed) spelled the tool card keys in camelCase
    (``callId``, ``toolKey``, also in ``agent.response`` ``tool_calls``) and had no
    ``error_kind``. Anything already current comes back unchanged (the same object).
    """
    if version >= 1:
        return payload
    if event_type.startswith("tool."):
        out = {_V0_TOOL_KEYS.get(k, k): v for k, v in payload.items()}
        if event_type in (EventType.TOOL_FAILED, EventType.TOOL_DEGRADED):
            out.setdefault("error_kind", _v0_error_kind(out.get("error")))
        return out
    if event_type == EventType.AGENT_RESPONSE and isinstance(payload.get("tool_calls"), list):
        calls = [
            {_V0_TOOL_KEYS.get(k, k): v for k, v in c.items()} if isinstance(c, Mapping) else c
            for c in payload["tool_calls"]
        ]
        return {**payload, "tool_calls": calls}
    return payload
