"""The visibility matrix, as a property over payloads generated from the published schema.

This test does not trust the declaration it checks. It holds its own hand-written table of
(event type or view, field path) -> class (the rules of "who sees what, where"), and
its own rules for who may read each class. It then

1. compares the table with the vocabulary's declaration (a field whose class changes, appears or
   disappears fails here first);
2. generates events from the JSON Schema the daemon publishes (``catalogue_schema``): every event
   type, every field (optional ones too), a unique canary in every free string at any depth, plus
   fields and event types no declaration names, and checks ``filter_event`` — and the SSE frame
   built from it — against an oracle built from the table, for every role × mode (``hidden``,
   ``surface``, ``telemetry_only`` and an unknown one) × surface (display, trace);
3. does the same for run views through ``filter_run``.

So a wrong class in the declaration, or a filter that shows or withholds too much, fails here.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping
from typing import Annotated, Any, Final

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter
from typing_extensions import TypedDict

from thoughtgate.access.filter import filter_event, filter_events, filter_run
from thoughtgate.access.roles import ROLE_NAMES, Role, parse_role
from thoughtgate.errors import AccessDeniedError
from thoughtgate.events.catalogue import catalogue_schema
from thoughtgate.events.payloads import EVENT_SPECS
from thoughtgate.events.schema import Event
from thoughtgate.events.views import HostMetadataView, RunView
from thoughtgate.events.visibility import Vis, declared_fields
from thoughtgate.server.sse import encode_event

P, T, R, TR, OP, C = "public", "tool_detail", "reasoning", "trace", "operator", "carrier"
B = "billing"

_TOOL_CARD = {"call_id": P, "tool_key": P, "turn": P, "label": P}
_USAGE = {  # every billed count may include the reasoning's tokens (ADR 0163)
    "input_tokens": B,
    "output_tokens": B,
    "reasoning_tokens": R,
    "cache_read_tokens": B,
    "cache_write_tokens": B,
    "total_tokens": B,
}
_STEP = {
    "marker": P,
    "step_id": P,
    "summary": P,
    "phase": P,
    "ts": P,
    "tool_call_id": P,
    "source": P,
}
_TRACE = {
    "trace": TR,
    "trace.reasoning": R,
    "trace.reasoning_chars": R,
    "trace.reasoning_bytes": R,
    "trace.continuity": P,
    "trace.continuity[].carrier": P,
    "trace.continuity[].provider": P,
    "trace.continuity[].model": P,
}
_RUN_ENDED = {
    "status": P,
    "usage": P,
    **{f"usage.{k}": v for k, v in _USAGE.items()},
    "error": P,
    "error_type": P,
    "error_detail": R,  # a provider's or a library's own words (ADR 0071)
}


def _nest(prefix: str, fields: Mapping[str, str]) -> dict[str, str]:
    return {f"{prefix}{k}": v for k, v in fields.items()}


TABLE: Final[dict[str, dict[str, str]]] = {
    "run.started": {"prompt": P, "model": P, "tasks": P},
    "capability.resolved": {
        "chain_of_thought": P,
        "worker_backend": P,
        "reasoning_requested": P,
        "sources": P,
        "sources.chain_of_thought": P,
        "sources.worker_backend": P,
        "model": P,
    },
    "task.started": {
        "index": P,
        "prompt": P,
        "backend": P,
        "model": P,
        "system": TR,
        "tools": TR,
        "tools[].type": P,
        "tools[].name": P,
        "tools[].description": P,
        "tools[].parameters": P,
        "history": TR,
    },
    "task.completed": {
        "status": P,
        "output": P,
        "error": P,
        "error_detail": R,
        "usage": P,
        **_nest("usage.", _USAGE),
    },
    "message.delta": {"text": P, "turn": P},
    "message.completed": {"text": P, "finish_reason": P},
    "message.partially_completed": {
        "text": P,
        "reason": P,
        "error": P,
        "status": P,
        "error_type": P,
        "error_detail": R,
    },
    "reasoning.delta": {"": R, "text": R, "reasoning_kind": R, "index": R, "turn": P},
    "agent.response": {
        "turn": P,
        "answer": P,
        "complete": P,
        "finish_reason": P,
        "raw_finish_reason": P,
        "provider": P,
        "model": P,
        "usage": P,
        **_nest("usage.", _USAGE),
        "tool_calls": P,
        "tool_calls[].call_id": P,
        "tool_calls[].name": P,
        "tool_calls[].input": T,
        "error": P,
        "error_type": P,
        "error_detail": R,
        "call": P,
        "call.stream": P,
        "call.max_tokens": P,
        "call.started_at": P,
        "call.first_chunk_at": P,
        "call.ended_at": P,
        "call.temperature": P,
        "call.response_id": OP,
        "call.response_model": P,
        "call.server": P,
        "call.server_address": OP,
        "call.server_port": OP,
        **_TRACE,
        "reasoning": R,
        "reasoning_chars": R,
        "reasoning_bytes": R,
        "reasoning_parts": R,
        "reasoning_parts[].kind": P,
        "reasoning_parts[].text": R,
        "reasoning_parts[].reasoning_kind": R,
        "reasoning_parts[].provider": P,
        "reasoning_parts[].model": P,
        "reasoning_parts[].signature": C,
        "reasoning_parts[].redacted": R,
        "reasoning_parts[].index": R,
        "continuity": C,
        "continuity[].kind": P,
        "continuity[].carrier": P,
        "continuity[].data": C,
        "continuity[].provider": P,
        "continuity[].model": P,
    },
    "worker.completed": {
        "mode": P,
        "backend": P,
        "model": P,
        "status": P,
        "usage": P,
        **_nest("usage.", _USAGE),
        "turns": P,
        "duration_s": P,
        "finish_reason": P,
        **_TRACE,
    },
    "continuity.dropped": {
        "carrier": P,
        "from_provider": P,
        "from_model": P,
        "reason": P,
        "turn": P,
    },
    "cot.step": _STEP,
    "cot.phase": _STEP,
    "cot.tool.reasoning": _STEP,
    "cot.completed": {
        "marker": P,
        "ts": P,
        "receipt": P,
        **_nest(
            "receipt.",
            {
                "mode": P,
                "raw_reasoning_exists": P,
                "opaque_reasoning_exists": P,
                "raw_reasoning_visible_to": P,
                "raw_reasoning_surface": P,
                "steps_shown": P,
                "phases_shown": P,
                "steps_dropped_by_policy": P,
                "dropped_by_reason": P,
                "summarizers": P,
                "summarizer_failures": P,
                "step_sources": P,  # where the steps a reader saw came from
                "notes": P,  # the plain statement of each opted-in source
            },
        ),
    },
    "tool.approval_required": {**_TOOL_CARD, "input": T},
    "tool.approval_response": {**_TOOL_CARD, "decision": P, "by": OP},
    "tool.approval_timeout": {**_TOOL_CARD, "timeout_s": P},
    "tool.started": {**_TOOL_CARD, "input": T},
    "tool.progress": {**_TOOL_CARD, "message": T},
    "tool.completed": {**_TOOL_CARD, "output": T},
    "tool.failed": {**_TOOL_CARD, "error": T, "error_kind": P},
    "tool.degraded": {**_TOOL_CARD, "output": T, "error": T, "error_kind": P},
    "run.settlement.completed": _RUN_ENDED,
    "run.failed": _RUN_ENDED,
    "run.error": _RUN_ENDED,
    "run.interrupted": {
        "status": P,
        "reason": P,
        "error_detail": R,  # the closing failure's own words (ADR 0073)
        "usage": P,
        **_nest("usage.", _USAGE),
    },
    # where and why a run continues are public; which process took it over is operator detail
    "run.resumed": {
        "reason": P,
        "attempt": P,
        "after_seq": P,
        "executor": OP,
        "previous_executor": OP,
    },
}
"""(event type, field path) -> class; ``""`` is the event as a whole (public when absent)."""

_TASK = {
    "task_id": P,
    "index": P,
    "prompt": P,
    "status": P,
    "output": P,
    "reasoning": R,
    "usage": P,
    **_nest("usage.", _USAGE),
    "error": P,
    "model": P,
    "backend": P,
}
VIEW_TABLE: Final[dict[str, dict[str, str]]] = {
    "RunView": {
        "run_id": P,
        "status": P,
        "prompt": P,
        "model": P,
        "chain_of_thought": P,
        "worker_backend": P,
        "created_at": P,
        "updated_at": P,
        "usage": P,
        **_nest("usage.", _USAGE),
        "error": P,
        "metadata": P,
        "metadata.daemon": OP,
        "metadata.daemon.host": OP,
        "metadata.daemon.pid": OP,
        "metadata.daemon.instance": OP,
        "metadata.continues": P,
        "metadata.suspended": P,  # null once resumed
        **_nest("metadata.suspended.", {"reason": P, "since": P, "resume": P}),
        "metadata.previous_executor": OP,
        "tasks": P,
        **_nest("tasks[].", _TASK),
        "started_by": OP,
        "record_out_of_date": P,
    },
}
VIEW_TABLE["HostMetadataView"] = {
    **VIEW_TABLE["RunView"],
    "version": P,
    "role": P,
    "reasoning_visible": P,
}

MODES = ("hidden", "surface", "telemetry_only", "SURFACE ")
SURFACES = ("display", "trace")
UNKNOWN_KEYS = ("thinking", "reasoning_summary", "x_future", "note")
UNKNOWN_TYPES = ("model.thinking", "tool.thought", "reasoning.summary")


def may_read(cls: str, role: Role, mode: str, surface: str) -> bool:
    """Who may read each class (docs/events.md), written here independently of the filter."""
    known = mode in ("hidden", "surface", "telemetry_only")
    return {
        P: True,
        T: role >= Role.MEMBER,
        R: role >= Role.DEVELOPER
        and (mode == "surface" or (surface == "trace" and mode == "telemetry_only")),
        TR: surface == "trace" and role >= Role.DEVELOPER and known,
        OP: role >= Role.ADMIN,
        B: role >= Role.DEVELOPER,
        C: False,
    }[cls]


# --------------------------------------------------------------------------- 1. the table


def _declared(shape: type, prefix: str = "") -> dict[str, str]:
    out = {}
    for name, field in declared_fields(shape).items():
        out[prefix + name] = field.cls.value
        if field.model is not None:
            step = "[]." if field.shape == "models" else "."
            out.update(_declared(field.model, f"{prefix}{name}{step}"))
    return out


def test_every_declared_field_has_the_class_this_table_expects() -> None:
    declared = {}
    for name, spec in EVENT_SPECS.items():
        fields = _declared(spec.payload)
        if spec.visibility.value != P:
            fields[""] = spec.visibility.value
        declared[name] = fields
    assert declared == TABLE
    views = {"RunView": _declared(RunView), "HostMetadataView": _declared(HostMetadataView)}
    assert views == VIEW_TABLE


def test_the_published_schema_carries_the_same_classes() -> None:
    defs = catalogue_schema()["$defs"]
    for name, spec in EVENT_SPECS.items():
        props = defs[spec.payload.__name__]["properties"]
        top = {k: v for k, v in TABLE[name].items() if k and "." not in k and "[]" not in k}
        assert {k: p["x-visibility"] for k, p in props.items()} == top, name


class Unclassified(TypedDict):
    text: str


class Twice(TypedDict):
    text: Annotated[str, Vis.PUBLIC, Vis.REASONING]


def test_a_field_without_exactly_one_class_is_refused() -> None:
    for shape in (Unclassified, Twice):
        with pytest.raises(TypeError, match="exactly one"):
            declared_fields(shape)


# --------------------------------------------------------------------------- 2. generation


class _Planter:
    """Draws values from a JSON Schema, a unique canary in every free string."""

    def __init__(self, draw: st.DrawFn, defs: Mapping[str, Any]) -> None:
        self.draw = draw
        self.defs = defs
        self.count = itertools.count()

    def canary(self) -> str:
        return f"CANARY{next(self.count):04d}Z"

    def anything(self, depth: int = 0, *, keys: tuple[str, ...] = ("q", "signature")) -> Any:
        """Opaque JSON, canaries at any depth. Tool arguments may use any key (``signature``
        included: a tool's argument is tool data, not a carrier); undeclared content is
        generated without carrier-like keys (the trace removes those, tested below)."""
        kind = self.draw(st.integers(0, 3 if depth < 2 else 1))
        if kind == 0:
            return self.canary()
        if kind == 1:
            return self.draw(st.integers(-5, 5) | st.booleans() | st.none())
        if kind == 2:
            return [
                self.anything(depth + 1, keys=keys) for _ in range(self.draw(st.integers(0, 2)))
            ]
        names = self.draw(st.lists(st.sampled_from([*keys, "nested"]), max_size=2, unique=True))
        return {k: self.anything(depth + 1, keys=keys) for k in names}

    def value(self, schema: Mapping[str, Any]) -> Any:
        if "$ref" in schema:
            return self.value(self.defs[schema["$ref"].rsplit("/", 1)[1]])
        if "const" in schema:
            return schema["const"]
        if "enum" in schema:
            return self.draw(st.sampled_from(schema["enum"]))
        if "anyOf" in schema:
            return self.value(self.draw(st.sampled_from(schema["anyOf"])))
        kind = schema.get("type")
        if kind == "string":
            return self.canary()
        if kind == "integer":
            return self.draw(st.integers(0, 10**6))
        if kind == "number":
            return self.draw(st.floats(0, 1e6, allow_nan=False))
        if kind == "boolean":
            return self.draw(st.booleans())
        if kind == "null":
            return None
        if kind == "array":
            return [self.value(schema["items"]) for _ in range(self.draw(st.integers(0, 2)))]
        if kind == "object" and "properties" in schema:
            return self.object(schema)
        if kind == "object" and isinstance(schema.get("additionalProperties"), Mapping):
            inner = schema["additionalProperties"]
            return {self.canary(): self.value(inner) for _ in range(self.draw(st.integers(0, 2)))}
        return self.anything()

    def object(self, schema: Mapping[str, Any]) -> dict[str, Any]:
        out = {}
        required = set(schema.get("required", ()))
        for name, prop in schema["properties"].items():
            if name in required or self.draw(st.booleans()):
                out[name] = self.value(prop)
        if self.draw(st.integers(0, 3)) == 0:  # a field no declaration names, at any level
            key = self.draw(st.sampled_from([k for k in UNKNOWN_KEYS if k not in out]))
            out[key] = self.anything(keys=("q", "text"))
        return out


SCHEMA: Final = catalogue_schema()


@st.composite
def events(draw: st.DrawFn) -> Event:
    schema = SCHEMA
    planter = _Planter(draw, schema["$defs"])
    event_type = draw(st.sampled_from([*EVENT_SPECS, *UNKNOWN_TYPES]))
    if event_type in EVENT_SPECS:
        payload = planter.object(schema["$defs"][EVENT_SPECS[event_type].payload.__name__])
    else:
        payload = {"text": planter.canary(), "nested": planter.anything(keys=("q", "text"))}
    return Event(7, "run_p", event_type, payload, task_id="task_p", ts=1.5)


# --------------------------------------------------------------------------- 3. the oracle

_DROP = object()


def _presence(name: str, value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, list):
        return [_presence(name, item) for item in value]
    label = value.get("carrier") if isinstance(value, Mapping) else None
    return {"carrier": label if isinstance(label, str) else name, "present": True}


def expected(
    table: Mapping[str, str], prefix: str, value: Any, role: Role, mode: str, surface: str
) -> Any:
    """What the table says this reader gets of ``value`` (a declared object at ``prefix``)."""
    known = mode in ("hidden", "surface", "telemetry_only")
    out = {}
    for key, item in value.items():
        path = prefix + key
        cls = table.get(path)
        if cls is None:  # undeclared: only the trace shows it (no carrier-like keys generated)
            if surface == "trace" and known:
                out[key] = item
            continue
        if cls == C:
            out[key] = _presence(key, item)
            continue
        if not may_read(cls, role, mode, surface):
            continue
        if item is None:
            out[key] = None
        elif any(p.startswith(path + ".") for p in table):
            out[key] = expected(table, path + ".", item, role, mode, surface)
        elif any(p.startswith(path + "[].") for p in table):
            out[key] = [expected(table, path + "[].", i, role, mode, surface) for i in item]
        else:
            out[key] = item
    return out


def _canaries(value: Any) -> set[str]:
    text = json.dumps(value)
    return {part[:10] for part in text.split('"') if part.startswith("CANARY")}


@settings(max_examples=400, deadline=None)
@given(
    events(),
    st.sampled_from(ROLE_NAMES),
    st.sampled_from(MODES),
    st.sampled_from(SURFACES),
)
def test_every_field_reaches_exactly_the_readers_its_class_allows(
    event: Event, role_name: str, mode: str, surface: str
) -> None:
    role = parse_role(role_name)
    if surface == "trace" and role < Role.DEVELOPER:
        with pytest.raises(AccessDeniedError):
            filter_event(event, role, mode=mode, surface="trace")
        return
    shown = filter_event(event, role, mode=mode, surface=surface)  # type: ignore[arg-type]
    table = TABLE.get(event.type)
    known = mode in ("hidden", "surface", "telemetry_only")
    if table is None:
        # an event type no declaration names: withheld on display, kept on the trace
        assert (shown is not None) == (surface == "trace" and known)
        if shown is not None:
            assert shown.payload == event.payload
        return
    if not may_read(table.get("", P), role, mode, surface):
        assert shown is None
        return
    assert shown is not None
    want = expected(table, "", event.payload, role, mode, surface)
    assert dict(shown.payload) == want
    assert (shown.seq, shown.type, shown.task_id, shown.ts) == (7, event.type, "task_p", 1.5)
    # the SSE frame carries exactly that, and no canary it should not
    frame = encode_event(shown)
    assert json.loads(frame["data"]) == shown.to_dict() and frame["id"] == "7"
    leaked = _canaries(frame["data"]) - _canaries(want)
    assert not leaked


@settings(max_examples=150, deadline=None)
@given(st.lists(events(), max_size=12), st.sampled_from(ROLE_NAMES), st.sampled_from(MODES))
def test_a_stream_keeps_its_order_and_drops_whole_events_only_when_it_must(
    batch: list[Event], role: str, mode: str
) -> None:
    stream = [
        Event(i, e.run_id, e.type, e.payload, task_id=e.task_id) for i, e in enumerate(batch, 1)
    ]
    shown = filter_events(stream, role, mode=mode)
    assert [e.seq for e in shown] == sorted(e.seq for e in shown)
    kept = {e.seq for e in shown}
    for event in stream:
        if event.seq not in kept:
            assert event.type not in TABLE or TABLE[event.type].get("", P) != P


# --------------------------------------------------------------------------- 4. run views


class _Run:
    def __init__(self, view: dict[str, Any], mode: str) -> None:
        self.view = view
        self.chain_of_thought = mode

    def to_view(self) -> Any:
        return self.view


RUN_VIEW_SCHEMA: Final = TypeAdapter(RunView).json_schema()


@st.composite
def run_views(draw: st.DrawFn) -> dict[str, Any]:
    schema = RUN_VIEW_SCHEMA
    planter = _Planter(draw, schema["$defs"])
    view = planter.object(schema)
    if draw(st.booleans()):  # the daemon's own metadata, as the manager records it
        view["metadata"] = {
            "daemon": {"host": planter.canary(), "pid": 4242, "instance": planter.canary()}
        }
    return view


@settings(max_examples=200, deadline=None)
@given(run_views(), st.sampled_from(ROLE_NAMES), st.sampled_from(MODES))
def test_run_views_follow_the_same_table(view: dict[str, Any], role_name: str, mode: str) -> None:
    role = parse_role(role_name)
    shown = filter_run(_Run(view, mode), role).to_json()
    assert shown == expected(VIEW_TABLE["RunView"], "", view, role, mode, "display")
    if role < Role.ADMIN:
        assert "daemon" not in shown.get("metadata", {})


# --------------------------------------------------------------------------- 5. fixed cases


@pytest.mark.parametrize("role", ["developer", "admin", "owner"])
@pytest.mark.parametrize("mode", MODES[:3])
def test_undeclared_content_on_the_trace_never_carries_carrier_bytes(role: str, mode: str) -> None:
    secret = "CARRIER-BYTES-0x1"
    payload = {
        "mode": mode,
        "x_future": {"signature": secret, "inner": [{"encrypted_content": secret}]},
        "continuity_v2": [{"carrier": "anthropic.thinking", "redacted_data": secret}],
    }
    for event_type in ("worker.completed", "model.thinking"):
        shown = filter_event(Event(1, "r", event_type, payload), role, mode=mode, surface="trace")
        assert shown is not None
        assert secret not in json.dumps(shown.to_dict())
        assert shown.payload["x_future"]["signature"] == {"carrier": "signature", "present": True}


@settings(max_examples=150, deadline=None)
@given(
    st.lists(events(), min_size=1, max_size=6),
    st.lists(
        st.tuples(st.sampled_from(ROLE_NAMES), st.sampled_from(MODES), st.booleans()),
        min_size=2,
        max_size=6,
    ),
    st.randoms(use_true_random=False),
)
def test_readers_of_different_roles_on_one_run_each_get_only_their_own_frame(
    stream: list[Event], readers: list[tuple[str, str, bool]], rng: Any
) -> None:
    """Several live readers of one run share one frame cache (ADR 0143: each resolves its filter
    once; a reader alone frames without the cache): however they interleave, each frame is
    exactly the one built from ``filter_event`` for that reader's own role and mode, never one
    cached for another reader (red team, ADR 0135)."""
    from thoughtgate.access.filter import event_filter
    from thoughtgate.server.fanout import RunFeeds
    from thoughtgate.server.sse import event_frame
    from thoughtgate.store.memory import MemoryStore

    feeds = RunFeeds(MemoryStore())
    resolved = [
        (parse_role(name), mode, alone, event_filter(parse_role(name), mode=mode))
        for name, mode, alone in readers
    ]
    stream = [
        Event(seq, "run_p", e.type, e.payload, task_id=e.task_id, ts=e.ts)
        for seq, e in enumerate(stream, start=1)
    ]
    for event in stream:
        order = list(range(len(resolved)))
        rng.shuffle(order)
        for i in order:
            role, mode, alone, show = resolved[i]
            got = feeds.frame(event, role, mode, event_frame, cache=not alone, show=show)
            shown = filter_event(event, role, mode=mode)
            assert got == (None if shown is None else event_frame(shown)), (role, mode)


# --------------------------------------------------------------------------- 6. reasoning's size

_TURN_SIZES = st.lists(
    st.tuples(st.integers(0, 5_000), st.integers(0, 5_000)), min_size=1, max_size=3
)


def _sized_script(sizes: list[int]) -> Any:
    """A tool loop as a provider bills it: turn ``n`` reasons ``sizes[n]`` characters (one token
    each), bills them as output beside the answer's 5, and bills every earlier turn's reasoning
    again as input (signed thinking or encrypted reasoning sent back; ADR 0163)."""
    from thoughtgate.testing.fake import reasoning, text, tool_call
    from thoughtgate.types import FinishChunk, UsageChunk

    def script(request: Any, turn: int) -> Any:
        n = sum(m.role == "tool" for m in request.messages)
        last = n == len(sizes) - 1
        yield reasoning("r" * sizes[n] or "r")
        if last:
            yield text("The answer is 42.")
        else:
            yield from tool_call("lookup", {"query": str(n)}, call_id=f"call_{n}")
        carried = sum(sizes[:n])
        yield UsageChunk(
            input_tokens=100 + carried,
            output_tokens=5 + sizes[n],
            reasoning_tokens=sizes[n],
            cache_read_tokens=carried,
            cache_write_tokens=sizes[n],
        )
        yield FinishChunk("stop" if last else "tool_calls")

    return script


def _same_shape(value: Any, ids: Mapping[str, str]) -> Any:
    """A reader's copy with what differs between any two runs made equal: times, and the run's
    and tasks' ids."""
    if isinstance(value, float):
        return "time"
    if isinstance(value, str):
        return ids.get(value, value)
    if isinstance(value, list | tuple):
        return [_same_shape(v, ids) for v in value]
    if isinstance(value, Mapping):
        return {k: _same_shape(v, ids) for k, v in value.items()}
    return value


@settings(max_examples=25, deadline=None)
@given(_TURN_SIZES, st.sampled_from(("hidden", "surface", "telemetry_only")))
async def test_what_a_viewer_or_member_reads_of_a_run_does_not_vary_with_its_reasoning(
    turns: list[tuple[int, int]], mode: str
) -> None:
    """Two runs that differ only in how much their model reasoned -- its text, its reasoning
    tokens, the output and input tokens that bill it -- give a viewer and a member the same
    events and the same run view, usage included (ADR 0163: every billed count is a
    developer's). A developer's copies differ: the counts are still there for them."""
    from thoughtgate.config import Config
    from thoughtgate.engine.tools import ToolRegistry, tool
    from thoughtgate.orchestration.runtime import RunRequest, Runtime
    from thoughtgate.store.memory import MemoryStore
    from thoughtgate.testing.fake import FakeProvider

    @tool
    def lookup(query: str) -> str:
        """A tool the model calls."""
        return f"found {query}"

    async def record(sizes: list[int]) -> tuple[list[Event], Any]:
        store = MemoryStore()
        config = Config.model_validate({"durability": {"enabled": False}})
        script = _sized_script(sizes)
        runtime = Runtime(
            store,
            config,
            provider_factory=lambda model: FakeProvider(script, model=model),
            tools=ToolRegistry([lookup]),
        )
        run = await runtime.run(RunRequest("go", model="fake:x"), chain_of_thought=mode)
        return await store.read(run.run_id), await store.get_run(run.run_id)

    def seen(recorded: tuple[list[Event], Any], role: str) -> Any:
        events, run = recorded
        ids = {run.run_id: "run", **{t.task_id: f"task{t.index}" for t in run.tasks}}
        shown = [
            (e.type, e.task_id, dict(e.payload)) for e in filter_events(events, role, mode=mode)
        ]
        return _same_shape([shown, filter_run(run, role).to_json()], ids)

    one = await record([a for a, _ in turns])
    other = await record([b for _, b in turns])
    for role in ("viewer", "member"):
        assert seen(one, role) == seen(other, role), role
    if [a for a, _ in turns] != [b for _, b in turns]:
        assert seen(one, "developer") != seen(other, "developer")
