"""The visible-reasoning display model: ``cot.*`` payloads, their parser and the disclosure receipt.

A visible step is a small, policy-checked display record, never reasoning itself::

    {"marker": "visible_reasoning_v1", "step_id": "vr-3", "summary": "Comparing three options",
     "phase": "thinking", "ts": 1767000000.0, "tool_call_id": null, "source": "narration"}

``cot.step``, ``cot.phase`` and ``cot.tool.reasoning`` all carry that shape (a tool reasoning step
must name the ``tool_call_id`` of a card that is already in the thread). ``cot.completed`` carries
the :class:`DisclosureReceipt`: which sources produced the steps the reader saw, what was withheld
from the reader and why, and a plain note for each source the operator opted into that is not
made for display (provider summaries, a summarizer model). None of these payloads
grants access to anything: a ``tool_call_id`` only correlates with a card the reader was already
allowed to see, and no payload holds a URL, a token or tool data.

Their payload types (``VisibleStepPayload``, ``CotCompletedPayload`` in
``thoughtgate.events.payloads``) declare every field ``public``: the one output filter passes them
unchanged to every role, which is why nothing that is not public may ever enter one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Final, Literal, get_args

from thoughtgate.events.payloads import (
    CotCompletedPayload,
    DisplayPhase,
    ReceiptPayload,
    StepSource,
    VisibleStepPayload,
)
from thoughtgate.events.schema import EventType, NewEvent, now_ts

__all__ = [
    "COT_EVENT_TYPES",
    "COT_STEP_TYPES",
    "DISPLAY_PHASES",
    "MAX_STEP_ID_CHARS",
    "MAX_SUMMARY_CHARS",
    "SOURCE_LABELS",
    "SOURCE_NOTES",
    "STEP_SOURCES",
    "SUMMARIZER_SOURCES",
    "VISIBLE_MARKER",
    "DisclosureReceipt",
    "VisibleStep",
    "build_receipt",
    "cot_completed_event",
    "cot_phase_event",
    "cot_step_event",
    "cot_tool_reasoning_event",
    "describe_receipt",
    "parse_receipt",
    "parse_visible_payload",
]

VISIBLE_MARKER: Final = "visible_reasoning_v1"
"""Every ``cot.*`` payload carries it; a reader discards a ``cot.*`` payload without it."""

MAX_SUMMARY_CHARS: Final = 280
MAX_STEP_ID_CHARS: Final = 128

DISPLAY_PHASES: tuple[str, ...] = get_args(DisplayPhase)
STEP_SOURCES: tuple[str, ...] = get_args(StepSource)

SUMMARIZER_SOURCES: Final[Mapping[str, StepSource]] = {
    "phases": "phases",
    "narration": "narration",
    "provider_summaries": "provider_summary",
    "model": "model",
}
"""The ``source`` each built-in summarizer (``visible_reasoning.summarizers``) writes."""

SOURCE_LABELS: Final[Mapping[str, str]] = {
    "phases": "the run's progress",
    "narration": "notes the agent wrote for you",
    "provider_summary": "the provider's summaries of the model's reasoning",
    "model": "the operator's summarizer model",
}
"""How a reader is told where steps came from (the web page keeps the same words)."""

SOURCE_NOTES: Final[Mapping[str, str]] = {
    "provider_summaries": (
        "The operator chose to show you summaries that the model provider wrote of the model's "
        "reasoning; each passed the same policy checks."
    ),
    "model": (
        "The operator's summarizer model may write steps; it reads only what you can see (the "
        "agent's answer text and tool names), never the model's reasoning."
    ),
}
"""The plain statement a receipt carries for each summarizer the operator opted into that is
not made for display (ADR 0008). ``phases`` and ``narration`` need none."""

COT_STEP_TYPES: Final = frozenset(
    {EventType.COT_STEP, EventType.COT_PHASE, EventType.COT_TOOL_REASONING}
)
"""Event types whose payload is a :class:`VisibleStep`."""

COT_EVENT_TYPES: Final = COT_STEP_TYPES | {EventType.COT_COMPLETED}


@dataclass(frozen=True, slots=True)
class VisibleStep:
    """One display step: a short safe sentence, its phase and, optionally, the card it explains."""

    step_id: str
    summary: str
    phase: DisplayPhase
    ts: float
    _: KW_ONLY
    tool_call_id: str | None = None
    source: StepSource = "phases"
    marker: Literal["visible_reasoning_v1"] = VISIBLE_MARKER

    def to_payload(self) -> VisibleStepPayload:
        return {
            "marker": self.marker,
            "step_id": self.step_id,
            "summary": self.summary,
            "phase": self.phase,
            "ts": self.ts,
            "tool_call_id": self.tool_call_id,
            "source": self.source,
        }


def _step_event(event_type: str, step: VisibleStep, task_id: str | None) -> NewEvent:
    return NewEvent(event_type, step.to_payload(), task_id=task_id, ts=step.ts)


def cot_step_event(step: VisibleStep, *, task_id: str | None = None) -> NewEvent:
    """``cot.step``: add a step, or update the step with the same ``step_id`` in place."""
    return _step_event(EventType.COT_STEP, step, task_id)


def cot_phase_event(step: VisibleStep, *, task_id: str | None = None) -> NewEvent:
    """``cot.phase``: a compact phase change (``summary`` is its short label)."""
    return _step_event(EventType.COT_PHASE, step, task_id)


def cot_tool_reasoning_event(step: VisibleStep, *, task_id: str | None = None) -> NewEvent:
    """``cot.tool.reasoning``: a safe explanation attached to an existing tool card."""
    if not step.tool_call_id:
        raise ValueError("cot.tool.reasoning needs the tool_call_id of an existing tool card")
    return _step_event(EventType.COT_TOOL_REASONING, step, task_id)


def _text(value: Any, limit: int) -> str | None:
    if not isinstance(value, str) or not value.strip() or len(value) > limit:
        return None
    return value


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def parse_visible_payload(payload: Any, *, event_type: str | None = None) -> VisibleStep | None:
    """The step a ``cot.step|phase|tool.reasoning`` payload describes, or ``None`` to discard it.

    Discarded: anything that is not a mapping, lacks the marker, or has a missing, mistyped or
    oversized field. A ``cot.tool.reasoning`` payload must also name a ``tool_call_id``. Unknown
    extra keys are ignored, never read.
    """
    if not isinstance(payload, Mapping) or payload.get("marker") != VISIBLE_MARKER:
        return None
    step_id = _text(payload.get("step_id"), MAX_STEP_ID_CHARS)
    summary = _text(payload.get("summary"), MAX_SUMMARY_CHARS)
    phase = payload.get("phase")
    ts = _finite(payload.get("ts"))
    source = payload.get("source", "phases")
    call_id = payload.get("tool_call_id")
    if step_id is None or summary is None or ts is None:
        return None
    if phase not in DISPLAY_PHASES or source not in STEP_SOURCES:
        return None
    if call_id is not None and _text(call_id, MAX_STEP_ID_CHARS) is None:
        return None
    if event_type == EventType.COT_TOOL_REASONING and call_id is None:
        return None
    return VisibleStep(step_id, summary, phase, ts, tool_call_id=call_id, source=source)


# --------------------------------------------------------------------------- disclosure receipt


@dataclass(frozen=True, slots=True)
class DisclosureReceipt:
    """What ``cot.completed`` tells every reader about what was withheld from them.

    The same receipt goes to every reader; it states the *minimum* role that may read the full
    reasoning (``raw_reasoning_visible_to``) and where (``raw_reasoning_surface``: the run's own
    views in ``surface`` mode, the developer-only trace in ``telemetry_only`` mode), so a reader
    below that role learns that more exists without learning any of it.
    """

    mode: str
    raw_reasoning_exists: bool
    """Readable reasoning text was captured (the model's own or the provider's full summaries)."""
    opaque_reasoning_exists: bool
    """Encrypted or redacted reasoning was returned that nobody can read."""
    raw_reasoning_visible_to: Literal["developer"] | None
    raw_reasoning_surface: Literal["display", "trace"] | None
    steps_shown: int
    phases_shown: int
    steps_dropped_by_policy: int
    _: KW_ONLY
    dropped_by_reason: Mapping[str, int] = field(default_factory=dict)
    summarizers: tuple[str, ...] = ()
    summarizer_failures: int = 0
    step_sources: Mapping[str, int] = field(default_factory=dict)
    """How many of the steps and phases shown came from each source (``phases``,
    ``narration``, ``provider_summary``, ``model``); sources that produced none are left out."""
    notes: tuple[str, ...] = ()
    """One plain statement per summarizer the operator opted into that is not made for display
    (:data:`SOURCE_NOTES`), derived from ``summarizers``."""

    def to_payload(self) -> ReceiptPayload:
        return {
            "mode": self.mode,
            "raw_reasoning_exists": self.raw_reasoning_exists,
            "opaque_reasoning_exists": self.opaque_reasoning_exists,
            "raw_reasoning_visible_to": self.raw_reasoning_visible_to,
            "raw_reasoning_surface": self.raw_reasoning_surface,
            "steps_shown": self.steps_shown,
            "phases_shown": self.phases_shown,
            "steps_dropped_by_policy": self.steps_dropped_by_policy,
            "dropped_by_reason": dict(sorted(self.dropped_by_reason.items())),
            "summarizers": list(self.summarizers),
            "summarizer_failures": self.summarizer_failures,
            "step_sources": dict(sorted(self.step_sources.items())),
            "notes": list(self.notes),
        }


def build_receipt(
    mode: str,
    *,
    raw_reasoning_exists: bool,
    opaque_reasoning_exists: bool = False,
    steps_shown: int,
    phases_shown: int = 0,
    dropped_by_reason: Mapping[str, int] | None = None,
    summarizers: tuple[str, ...] = (),
    summarizer_failures: int = 0,
    step_sources: Mapping[str, int] | None = None,
) -> DisclosureReceipt:
    """A receipt for a run in ``mode`` (who may read the full reasoning follows from the mode;
    the notes follow from the summarizers)."""
    dropped = {k: v for k, v in (dropped_by_reason or {}).items() if v}
    sources = {k: v for k, v in (step_sources or {}).items() if v}
    notes = tuple(SOURCE_NOTES[name] for name in summarizers if name in SOURCE_NOTES)
    surface: Literal["display", "trace"] | None = None
    if raw_reasoning_exists:
        surface = "trace" if mode == "telemetry_only" else "display"
    return DisclosureReceipt(
        mode=mode,
        raw_reasoning_exists=raw_reasoning_exists,
        opaque_reasoning_exists=opaque_reasoning_exists,
        raw_reasoning_visible_to="developer" if raw_reasoning_exists else None,
        raw_reasoning_surface=surface,
        steps_shown=steps_shown,
        phases_shown=phases_shown,
        steps_dropped_by_policy=sum(dropped.values()),
        dropped_by_reason=dropped,
        summarizers=summarizers,
        summarizer_failures=summarizer_failures,
        step_sources=sources,
        notes=notes,
    )


def describe_receipt(receipt: DisclosureReceipt, *, raw_visible: bool = False) -> list[str]:
    """The receipt as sentences for a person (the CLI; the web page says the same).

    ``raw_visible``: the reader's own view holds the raw reasoning (a developer on a surface run).
    """
    lines = []
    if receipt.step_sources:
        shown = sorted(receipt.step_sources.items())  # the payload's order, as the page shows it
        parts = [f"{SOURCE_LABELS.get(k, k)} ({v})" for k, v in shown]
        lines.append(f"Steps shown came from {', '.join(parts)}, checked by policy.")
    else:
        lines.append("No steps were shown.")
    lines.extend(receipt.notes)
    if receipt.raw_reasoning_exists:
        if raw_visible:
            lines.append("The model's reasoning is shown next to each turn (developer view).")
        elif receipt.raw_reasoning_surface == "trace":
            lines.append("The model's reasoning exists; only developers can read it, in the trace.")
        else:
            lines.append("The model's reasoning exists; only developers and above can read it.")
    elif receipt.opaque_reasoning_exists:
        lines.append("The provider returned encrypted reasoning that nobody can read.")
    if receipt.steps_dropped_by_policy:
        why = ", ".join(f"{k.replace('_', ' ')} ×{v}" for k, v in receipt.dropped_by_reason.items())
        lines.append(f"{receipt.steps_dropped_by_policy} step(s) were withheld by policy ({why}).")
    return lines


def cot_completed_event(
    receipt: DisclosureReceipt, *, task_id: str | None = None, ts: float | None = None
) -> NewEvent:
    """``cot.completed``: the marker, a timestamp and the receipt."""
    stamp = now_ts() if ts is None else ts
    payload: CotCompletedPayload = {
        "marker": VISIBLE_MARKER,
        "ts": stamp,
        "receipt": receipt.to_payload(),
    }
    return NewEvent(EventType.COT_COMPLETED, payload, task_id=task_id, ts=stamp)


_LATER_RECEIPT_KEYS: Final = frozenset({"step_sources", "notes"})


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def parse_receipt(payload: Any) -> DisclosureReceipt | None:
    """The receipt of a ``cot.completed`` payload, or ``None`` when unmarked or malformed."""
    if not isinstance(payload, Mapping) or payload.get("marker") != VISIBLE_MARKER:
        return None
    body = payload.get("receipt")
    if not isinstance(body, Mapping):
        return None
    counts = [_count(body.get(k)) for k in ("steps_shown", "phases_shown", "summarizer_failures")]
    reasons = body.get("dropped_by_reason")
    summarizers = body.get("summarizers")
    sources = body.get("step_sources", {})
    flags = [body.get(k) for k in ("raw_reasoning_exists", "opaque_reasoning_exists")]
    if any(c is None for c in counts) or not all(isinstance(f, bool) for f in flags):
        return None
    if not isinstance(body.get("mode"), str) or not isinstance(reasons, Mapping):
        return None
    if not isinstance(summarizers, list) or not all(isinstance(s, str) for s in summarizers):
        return None
    if not isinstance(sources, Mapping):
        return None
    parsed_reasons = {str(k): _count(v) for k, v in reasons.items()}
    parsed_sources = {str(k): _count(v) for k, v in sources.items()}
    if any(v is None for v in [*parsed_reasons.values(), *parsed_sources.values()]):
        return None
    receipt = build_receipt(
        body["mode"],
        raw_reasoning_exists=bool(flags[0]),
        opaque_reasoning_exists=bool(flags[1]),
        steps_shown=counts[0] or 0,
        phases_shown=counts[1] or 0,
        dropped_by_reason={k: v or 0 for k, v in parsed_reasons.items()},
        summarizers=tuple(summarizers),
        summarizer_failures=counts[2] or 0,
        step_sources={k: v or 0 for k, v in parsed_sources.items()},
    )
    written = receipt.to_payload()
    # Receipts recorded before step_sources and notes existed lack those two keys; the rest must
    # match what we write.
    checked = {k: v for k, v in written.items() if k in body or k not in _LATER_RECEIPT_KEYS}
    if checked != {key: body.get(key) for key in checked}:
        return None  # inconsistent totals or visibility fields: not a receipt we wrote
    return receipt
