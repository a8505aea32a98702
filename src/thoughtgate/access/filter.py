"""The ONE output filter: every read path (CLI, HTTP, SSE, MCP, web page, host metadata) calls it.

Nothing else decides what a reader may see, and the filter itself guesses nothing from key names:
it walks the declared vocabulary (``thoughtgate.events.payloads``, ``thoughtgate.events.views``)
as an allowlist. A field is shown when its visibility class — and the class of every field above
it — allows this reader (``thoughtgate.events.visibility``):

==============  ===========================================  ==================================
class           display surfaces                             the trace surface (developer+)
==============  ===========================================  ==================================
public          everyone                                     shown
tool_detail     member and above                             shown
reasoning       developer and above, ``surface`` runs only   ``surface`` and ``telemetry_only``
billing         developer and above, every mode              shown
trace           never                                        shown
operator        admin and above                              admin and above
carrier         ``{"carrier": name, "present": true}``       the same: never the bytes
==============  ===========================================  ==================================

It fails closed: an event type or a field that no declaration names is withheld from every role on
display surfaces (it stays in the log, and on the trace surface, with carrier-looking keys
removed, so nothing is lost); a mode other than ``hidden``, ``surface`` or ``telemetry_only`` is
treated as one that shows no reasoning anywhere, and the trace shows only declared fields for it.
``mode`` is a required argument: a reader's view depends on the run's mode, so no caller may
forget it.

Speed: for each (event type, role, mode, surface) the declaration is compiled once into a
projection plan (cached), then applied to the stored dict without validation. A payload the reader
may see whole comes back as the same object, and the event too: the hot ``message.delta`` costs a
dict lookup and a key-set comparison. Filtering never reorders: for any input sequence the output is
a subsequence in the same order. Values are never copied deeply; treat the result as read-only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache, partial
from typing import Any, Final, Literal, Protocol, TypeAlias

from thoughtgate.access.roles import Role, parse_role
from thoughtgate.disclosure import CHAIN_OF_THOUGHT_MODES
from thoughtgate.errors import AccessDeniedError
from thoughtgate.events.payloads import EVENT_SPECS
from thoughtgate.events.schema import Event
from thoughtgate.events.views import RunView, TaskView
from thoughtgate.events.visibility import VisClass, declared_fields

__all__ = [
    "APART_CLASSES",
    "RunSource",
    "Surface",
    "can_read_reasoning",
    "carrier_presence",
    "event_filter",
    "filter_event",
    "filter_events",
    "filter_payload",
    "filter_run",
    "reads_apart",
    "reads_task_apart",
    "require_role",
    "shows",
    "stored_apart",
    "stored_presence",
    "task_fields_apart",
]

Surface: TypeAlias = Literal["display", "trace"]
_SURFACES: Final = ("display", "trace")

_PROVIDER_CARRIER_KEYS: Final = frozenset(
    {"signature", "encrypted_content", "encrypted", "redacted_data", "data", "continuity"}
)
"""Keys removed from *undeclared* content shown on the trace surface (defense in depth: declared
fields never need it, their classes say what a carrier is)."""


class RunSource(Protocol):
    """What :func:`filter_run` reads (``thoughtgate.store.records.RunRecord``)."""

    @property
    def chain_of_thought(self) -> str: ...

    def to_view(self) -> Mapping[str, Any]:
        """Every field of the run, unfiltered."""
        ...


def require_role(role: Role | str, minimum: Role, what: str) -> Role:
    """Return the parsed role or raise :class:`AccessDeniedError` that names no data."""
    parsed = parse_role(role)
    if parsed < minimum:
        raise AccessDeniedError(f"{what} requires role {minimum.label} or above")
    return parsed


def can_read_reasoning(role: Role | str, mode: str) -> bool:
    """Raw reasoning on display surfaces: developer and above, on a ``surface`` run only."""
    return shows(VisClass.REASONING, parse_role(role), mode)


def _known(mode: str | None) -> str | None:
    return mode if mode in CHAIN_OF_THOUGHT_MODES else None


def shows(cls: VisClass, role: Role, mode: str | None, surface: Surface = "display") -> bool:
    """Whether a field of class ``cls`` reaches this reader (carriers never do)."""
    known = _known(mode)
    if cls is VisClass.PUBLIC:
        return True
    if cls is VisClass.TOOL_DETAIL:
        return role >= Role.MEMBER
    if cls is VisClass.REASONING:
        if role < Role.DEVELOPER:
            return False
        return known == "surface" or (surface == "trace" and known == "telemetry_only")
    if cls is VisClass.BILLING:
        return role >= Role.DEVELOPER
    if cls is VisClass.TRACE:
        return surface == "trace" and role >= Role.DEVELOPER and known is not None
    if cls is VisClass.OPERATOR:
        return role >= Role.ADMIN
    return False


# --------------------------------------------------------------------------- plans

_MODEL: Final = 0
_MODELS: Final = 1
_DROP: Final = object()


@dataclass(slots=True)
class _Node:
    """How to project one declared mapping for one reader."""

    keep: frozenset[str] = frozenset()
    """Shown whole (scalars and opaque JSON)."""
    walk: dict[str, tuple[int, _Node]] = field(default_factory=dict)
    """Nested declared shapes to project in turn."""
    carriers: frozenset[str] = frozenset()
    declared: frozenset[str] = frozenset()
    unknown_shown: bool = False
    """Undeclared keys: shown (scrubbed) on the trace surface, else withheld."""
    whole: bool = False
    """Nothing to project: a value whose keys are all in ``keep`` is returned as it is."""


@cache
def _compile(shape: type, role: Role, mode: str | None, surface: Surface) -> _Node:
    keep: set[str] = set()
    carriers: set[str] = set()
    walk: dict[str, tuple[int, _Node]] = {}
    fields = declared_fields(shape)
    for name, spec in fields.items():
        if spec.cls is VisClass.CARRIER:
            carriers.add(name)
        elif not shows(spec.cls, role, mode, surface):
            continue
        elif spec.model is not None:
            kind = _MODEL if spec.shape == "model" else _MODELS
            walk[name] = (kind, _compile(spec.model, role, mode, surface))
        else:
            keep.add(name)
    node = _Node(
        keep=frozenset(keep),
        walk=walk,
        carriers=frozenset(carriers),
        declared=frozenset(fields),
        unknown_shown=surface == "trace" and _known(mode) is not None,
    )
    node.whole = not walk and not carriers
    return node


_UNDECLARED_TRACE: Final = _Node(unknown_shown=True)


@dataclass(frozen=True, slots=True)
class _EventPlan:
    shown: bool
    node: _Node


_HIDDEN: Final = _EventPlan(False, _Node())


@cache
def _plans(role: Role, mode: str | None, surface: Surface) -> dict[str, _EventPlan]:
    plans = {}
    for spec in EVENT_SPECS.values():
        shown = shows(spec.visibility, role, mode, surface)
        plans[spec.name] = _EventPlan(shown, _compile(spec.payload, role, mode, surface))
    return plans


@cache
def _undeclared(role: Role, mode: str | None, surface: Surface) -> _EventPlan:
    """An event type no declaration names: withheld, except on the trace for a known mode."""
    if surface == "trace" and _known(mode) is not None:
        return _EventPlan(True, _UNDECLARED_TRACE)
    return _HIDDEN


def carrier_presence(name: str, value: Any) -> Any:
    """What every reader is shown of carrier ``name`` holding ``value``: that each existed, and
    of which kind. Idempotent (the presence of a presence is itself), so a store may keep this
    in an event's row in place of the bytes (ADR 0160, amendment 2)."""
    if value is None:
        return None
    if isinstance(value, list | tuple):
        return [carrier_presence(name, item) for item in value]
    label = value.get("carrier") if isinstance(value, Mapping) else None
    return {"carrier": label if isinstance(label, str) else name, "present": True}


def _scrub(value: Any) -> Any:
    """Undeclared content on the trace surface, without anything that looks like a carrier."""
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if key in _PROVIDER_CARRIER_KEYS:
                out[key] = carrier_presence(key, item)
            else:
                out[key] = _scrub(item)
        return out
    if isinstance(value, list | tuple):
        return [_scrub(item) for item in value]
    return value


def _project(node: _Node, value: Any) -> Any:
    if type(value) is not dict and not isinstance(value, Mapping):  # (a dict: no ABC check)
        return _DROP  # not the declared shape: withheld
    if node.whole and node.keep.issuperset(value):  # (its keys, without a view of them)
        return value
    out: dict[str, Any] = {}
    keep = node.keep
    for key, item in value.items():
        if key in keep:
            out[key] = item
        elif key in node.walk:
            kind, sub = node.walk[key]
            if kind == _MODEL:
                projected = None if item is None else _project(sub, item)
                if projected is not _DROP:
                    out[key] = projected
            elif isinstance(item, list):
                out[key] = [p for p in (_project(sub, i) for i in item) if p is not _DROP]
        elif key in node.carriers:
            out[key] = carrier_presence(key, item)
        elif node.unknown_shown and key not in node.declared:
            out[key] = _scrub(item)
    return out


def _reader(role: Role | str, surface: Surface) -> Role:
    if surface not in _SURFACES:
        raise ValueError(f"unknown surface {surface!r}; allowed: display, trace")
    reader = parse_role(role)
    if surface == "trace":
        require_role(reader, Role.DEVELOPER, "the trace")
    return reader


def _apply(plans: dict[str, _EventPlan], undeclared: _EventPlan, event: Event) -> Event | None:
    plan = plans.get(event.type, undeclared)
    if not plan.shown:
        return None
    payload = _project(plan.node, event.payload)
    if payload is event.payload:
        return event
    return Event(
        event.seq,
        event.run_id,
        event.type,
        {} if payload is _DROP else payload,
        task_id=event.task_id,
        ts=event.ts,
        v=event.v,
    )


# --------------------------------------------------------------------------- stored apart

APART_CLASSES: Final = frozenset({VisClass.REASONING, VisClass.TRACE})
"""The classes whose top-level fields a SQL store keeps apart from the rest of an event's payload
(ADR 0160): the reasoning and what carries it on the trace surface (a ``telemetry_only`` turn's
``trace``), so a read for a reader who may see neither never loads their bytes."""


@cache
def _apart_of(event_type: str) -> frozenset[str] | None:
    spec = EVENT_SPECS.get(event_type)
    if spec is None:
        return frozenset()  # an undeclared type: stored whole in the row (and withheld)
    if spec.visibility in APART_CLASSES:
        return None  # the whole payload
    return frozenset(
        name for name, f in declared_fields(spec.payload).items() if f.cls in APART_CLASSES
    )


@cache
def stored_presence(event_type: str) -> frozenset[str]:
    """The top-level payload fields of ``event_type`` of class ``carrier`` (continuity carriers:
    a signed thinking block, an encrypted reasoning item), which no reader is ever shown but as
    :func:`carrier_presence`: a store keeps their bytes apart and leaves that presence in the
    row (ADR 0160, amendment 2), so a read that leaves the part apart unread still shows every
    reader what the whole read shows; what needs the bytes (a whole read) gets them."""
    spec = EVENT_SPECS.get(event_type)
    if spec is None or spec.visibility in APART_CLASSES:
        return frozenset()  # (undeclared: stored whole; a class kept apart whole: all of it)
    return frozenset(
        name for name, f in declared_fields(spec.payload).items() if f.cls is VisClass.CARRIER
    )


def stored_apart(event_type: str) -> frozenset[str] | None:
    """The top-level payload fields of ``event_type`` a store keeps apart, by their declared
    class (:data:`APART_CLASSES`); ``None``: all of them (an event of such a class as a whole,
    ``reasoning.delta``); empty: none."""
    return _apart_of(event_type)


@cache
def _reads_apart(role: Role, mode: str | None, surface: Surface) -> bool:
    plans = _plans(role, mode, surface)
    for name, plan in plans.items():
        if not plan.shown:
            continue
        apart = _apart_of(name)
        node = plan.node
        if apart is None or not apart.isdisjoint(node.keep | node.walk.keys() | node.carriers):
            return True
    return False


def reads_apart(role: Role | str, *, mode: str | None, surface: Surface = "display") -> bool:
    """Whether this reader may be shown anything a store keeps apart (:func:`stored_apart`):
    the filter's own plans say so, event type by event type, so a read for a reader for whom
    this is ``False`` may leave those fields unread (ADR 0160) and the filter, applied after it
    anyway, would have withheld every one of them. ``mode=None``: for a run of any mode (a
    read made before the run's mode is known: ``False`` only if it is ``False`` for every
    mode, a mode no run may have included)."""
    reader = _reader(role, surface)
    if mode is None:
        modes: tuple[str | None, ...] = (*CHAIN_OF_THOUGHT_MODES, None)
        return any(_reads_apart(reader, m, surface) for m in modes)
    return _reads_apart(reader, _known(mode), surface)


@cache
def task_fields_apart() -> frozenset[str]:
    """The fields of a run view's task (:class:`TaskView`) of the classes kept apart: the task
    columns a run read for a reader who may see none of them leaves unread (ADR 0160)."""
    return frozenset(
        name for name, f in declared_fields(TaskView).items() if f.cls in APART_CLASSES
    )


@cache
def _reads_task_apart(role: Role, mode: str | None) -> bool:
    tasks = _compile(RunView, role, mode, "display").walk.get("tasks")
    return tasks is not None and not task_fields_apart().isdisjoint(tasks[1].keep)


def reads_task_apart(role: Role | str, *, mode: str | None) -> bool:
    """Whether :func:`filter_run` may show this reader any of :func:`task_fields_apart`, by its
    own plan for the run view; ``mode=None``: for a run of any mode (a run's mode is known only
    once the run is read)."""
    reader = parse_role(role)
    modes = (*CHAIN_OF_THOUGHT_MODES, None) if mode is None else (_known(mode),)
    return any(_reads_task_apart(reader, m) for m in modes)


# --------------------------------------------------------------------------- the API


def event_filter(
    role: Role | str, *, mode: str, surface: Surface = "display"
) -> Callable[[Event], Event | None]:
    """:func:`filter_event` for one reader, its role, mode and surface resolved once: for a
    caller that filters many events for the same reader (a live stream, ADR 0143)."""
    reader = _reader(role, surface)
    known = _known(mode)
    return partial(_apply, _plans(reader, known, surface), _undeclared(reader, known, surface))


def filter_event(
    event: Event, role: Role | str, *, mode: str, surface: Surface = "display"
) -> Event | None:
    """The event as this reader may see it, or ``None`` when the whole event is withheld."""
    return event_filter(role, mode=mode, surface=surface)(event)


def filter_events(
    events: Iterable[Event], role: Role | str, *, mode: str, surface: Surface = "display"
) -> list[Event]:
    show = event_filter(role, mode=mode, surface=surface)
    out = []
    for event in events:
        kept = show(event)
        if kept is not None:
            out.append(kept)
    return out


def filter_payload(
    event_type: str,
    payload: Mapping[str, Any],
    role: Role | str,
    *,
    mode: str,
    surface: Surface = "display",
) -> dict[str, Any] | None:
    """An event's payload as this reader may see it (a fresh dict), or ``None`` when the event is
    withheld."""
    shown = filter_event(Event(0, "", event_type, payload), role, mode=mode, surface=surface)
    return None if shown is None else dict(shown.payload)


def filter_run(run: RunSource, role: Role | str) -> RunView:
    """The run as this reader sees it, with its tasks, through the same declarations as the
    events (display surface, the run's own mode): the one :class:`RunView` every surface returns.
    A withheld field is left unset on the model (absent from ``to_json()``)."""
    reader = parse_role(role)
    node = _compile(RunView, reader, _known(run.chain_of_thought), "display")
    view = _project(node, run.to_view())
    return RunView.model_validate({} if view is _DROP else view)
