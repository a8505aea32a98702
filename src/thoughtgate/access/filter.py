"""The ONE output filter: every read path (CLI, HTTP, SSE, MCP, web page, host metadata) calls it.

Nothing else decides what a reader may see. The rules (ARCHITECTURE.md, "Who sees what, where"):

* Raw reasoning — ``reasoning.delta`` events, ``payload.reasoning`` (and its parts and sizes),
  ``task.reasoning`` — only for ``developer`` and above, and only on a ``surface``-mode run.
  In ``telemetry_only`` mode no display read shows reasoning, not even to an owner.
* Trace metadata (``worker.completed`` ``payload.trace``) only on the ``trace`` surface, which is
  refused below ``developer``.
* Continuity carriers (signatures, encrypted items, redacted-thinking bytes) never leave, for any
  role: they are replaced by ``{"carrier": ..., "present": true}``.
* Tool arguments and results for ``member`` and above; a ``viewer`` sees a card's label and status.

Filtering never reorders: for any input sequence the output is a subsequence in the same order.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal, TypeAlias

from thoughtgate.access.roles import Role, parse_role
from thoughtgate.errors import AccessDeniedError
from thoughtgate.events.schema import Event, EventType
from thoughtgate.store.records import RunRecord, TaskRecord

__all__ = [
    "Surface",
    "can_read_reasoning",
    "filter_event",
    "filter_events",
    "filter_payload",
    "filter_run",
    "filter_task",
    "require_role",
]

Surface: TypeAlias = Literal["display", "trace"]

REASONING_KEYS = frozenset(
    {"reasoning", "reasoning_parts", "reasoning_chars", "reasoning_bytes", "reasoning_kind"}
)
"""Payload keys that hold raw reasoning or describe it."""

CARRIER_KEYS = frozenset({"signature", "encrypted_content", "encrypted", "redacted_data"})
"""Keys that hold continuity bytes wherever they appear; always removed."""

TOOL_DETAIL_KEYS = frozenset(
    {
        "input",
        "args",
        "arguments",
        "arguments_json",
        "output",
        "data",
        "result",
        "content",
        "error_detail",
        "detail",
        "tool_calls",
    }
)
"""Tool arguments and results; removed for viewers."""

TRACE_KEYS = frozenset({"trace"})


def require_role(role: Role | str, minimum: Role, what: str) -> Role:
    """Return the parsed role or raise :class:`AccessDeniedError` that names no data."""
    parsed = parse_role(role)
    if parsed < minimum:
        raise AccessDeniedError(f"{what} requires role {minimum.label} or above")
    return parsed


def can_read_reasoning(role: Role | str, mode: str | None) -> bool:
    """Raw reasoning on display surfaces: developer+ on a ``surface`` run (mode ``None`` = unknown,
    treated as surface so the role check alone still applies)."""
    return parse_role(role) >= Role.DEVELOPER and mode in (None, "surface")


def _scrub(value: Any, *, drop: frozenset[str]) -> Any:
    """Recursively remove ``drop`` keys and carrier keys; replace continuity lists."""
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if key in drop or key in CARRIER_KEYS:
                continue
            if key == "continuity":
                out[key] = _carrier_presence(item)
                continue
            out[key] = _scrub(item, drop=drop)
        return out
    if isinstance(value, list | tuple):
        return [_scrub(v, drop=drop) for v in value]
    return value


def _carrier_presence(item: Any) -> list[dict[str, Any]]:
    blocks = item if isinstance(item, list | tuple) else [item]
    out = []
    for block in blocks:
        carrier = block.get("carrier", "unknown") if isinstance(block, Mapping) else "unknown"
        out.append({"carrier": carrier, "present": True})
    return out


def _drop_keys(role: Role, mode: str | None, surface: Surface) -> frozenset[str]:
    drop: set[str] = set()
    if surface == "display":
        drop |= TRACE_KEYS
        if not can_read_reasoning(role, mode):
            drop |= REASONING_KEYS
    if role < Role.MEMBER:
        drop |= TOOL_DETAIL_KEYS
    return frozenset(drop)


def filter_payload(
    payload: Mapping[str, Any],
    role: Role | str,
    *,
    mode: str | None = None,
    surface: Surface = "display",
) -> dict[str, Any]:
    """A payload as this reader may see it (a fresh dict; the input is not modified)."""
    parsed = parse_role(role)
    result: dict[str, Any] = _scrub(payload, drop=_drop_keys(parsed, mode, surface))
    return result


def filter_event(
    event: Event,
    role: Role | str,
    *,
    mode: str | None = None,
    surface: Surface = "display",
) -> Event | None:
    """The event as this reader may see it, or ``None`` when the whole event is withheld."""
    parsed = parse_role(role)
    if surface == "trace":
        require_role(parsed, Role.DEVELOPER, "the trace")
    elif event.type == EventType.REASONING_DELTA and not can_read_reasoning(parsed, mode):
        return None
    return Event(
        event.seq,
        event.run_id,
        event.type,
        filter_payload(event.payload, parsed, mode=mode, surface=surface),
        task_id=event.task_id,
        ts=event.ts,
    )


def filter_events(
    events: Iterable[Event],
    role: Role | str,
    *,
    mode: str | None = None,
    surface: Surface = "display",
) -> list[Event]:
    parsed = parse_role(role)
    out = []
    for event in events:
        kept = filter_event(event, parsed, mode=mode, surface=surface)
        if kept is not None:
            out.append(kept)
    return out


def filter_task(task: TaskRecord, role: Role | str, *, mode: str | None) -> dict[str, Any]:
    """A task view; ``reasoning`` is ``None`` unless the mode is ``surface`` and role developer+."""
    parsed = parse_role(role)
    return {
        "task_id": task.task_id,
        "index": task.index,
        "prompt": task.prompt,
        "status": task.status,
        "output": task.output,
        "reasoning": task.reasoning if can_read_reasoning(parsed, mode) else None,
        "usage": dict(task.usage),
        "error": task.error,
        "model": task.model,
        "backend": task.backend,
    }


def filter_run(run: RunRecord, role: Role | str) -> dict[str, Any]:
    """A run view with its tasks, through the same rules as events."""
    parsed = parse_role(role)
    mode = run.chain_of_thought
    return {
        "run_id": run.run_id,
        "status": run.status,
        "prompt": run.prompt,
        "model": run.model,
        "chain_of_thought": mode,
        "worker_backend": run.worker_backend,
        "created_at": run.created_at,
        "updated_at": run.updated_at,
        "usage": dict(run.usage),
        "error": run.error,
        "metadata": filter_payload(run.metadata, parsed, mode=mode),
        "tasks": [filter_task(t, parsed, mode=mode) for t in run.tasks],
    }
