"""The event catalogue: every event type's envelope and payload as one JSON Schema, and checks.

One discriminated ``TypeAdapter`` over all envelopes (discriminator: ``type``) serves three uses:

* :func:`catalogue_schema` publishes the catalogue as JSON Schema (2020-12): the daemon's
  ``/openapi.json`` embeds it, and ``docs/events.md`` is generated from it (:func:`render_markdown`;
  ``python -m thoughtgate.events.catalogue docs/events.md`` rewrites the file, and a test fails when
  it is stale). Every field carries its visibility class as ``x-visibility``.
* :func:`validate_event` checks a recorded event against its declaration (unknown keys refused).
* With ``THOUGHTGATE_STRICT_EVENTS=1`` in the environment (the test suite sets it), every event a
  producer appends is validated first (:func:`check_new_events`), so a writer that drifts from
  the vocabulary fails loudly instead of being withheld silently by the filter. Off by default:
  the hot path never pays for it.
"""

from __future__ import annotations

import json
import os
import sys
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Annotated, Any, Final, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, with_config
from pydantic.config import JsonDict
from typing_extensions import TypedDict, is_typeddict

from thoughtgate.events.payloads import EVENT_SPECS, EventSpec
from thoughtgate.events.schema import EVENT_VERSION, Event, NewEvent
from thoughtgate.events.views import HostMetadataView, RunView
from thoughtgate.events.visibility import VisClass, declared_fields

__all__ = [
    "READER_NOTE",
    "catalogue_schema",
    "check_new_events",
    "envelope_name",
    "main",
    "reader_schema",
    "render_markdown",
    "strict",
    "validate_event",
    "view_schema",
]

_REF = "#/$defs/{model}"


def envelope_name(event_type: str) -> str:
    """``tool.started`` -> ``ToolStartedEvent`` (the envelope's schema name)."""
    return "".join(part.capitalize() for part in event_type.replace("_", ".").split(".")) + "Event"


def _envelope(spec: EventSpec) -> type:
    fields: dict[str, Any] = {
        "seq": int,
        "run_id": str,
        "task_id": str | None,
        "type": Literal[spec.name],
        "ts": float,
        "v": int,
        "payload": spec.payload,
    }
    make: Any = TypedDict  # the functional form, with a computed name
    envelope: type = make(envelope_name(spec.name), fields)
    envelope.__doc__ = spec.doc
    extra: JsonDict = {"x-visibility": spec.visibility.value, "x-event-type": spec.name}
    return with_config(ConfigDict(extra="forbid", json_schema_extra=extra))(envelope)


@cache
def _adapter() -> TypeAdapter[Any]:
    envelopes = tuple(_envelope(spec) for spec in EVENT_SPECS.values())
    union = Annotated[Union[envelopes], Field(discriminator="type")]  # type: ignore[valid-type]  # noqa: UP007
    return TypeAdapter(union)


READER_NOTE = (
    "Each field's x-visibility names its class. A reader receives a field only when its class "
    "allows that reader, so `required` lists only public fields; a carrier arrives as "
    '{"carrier": NAME, "present": true}.'
)

_PRESENCE: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {"carrier": {"type": "string"}, "present": {"const": True}},
    "required": ["carrier", "present"],
    "additionalProperties": False,
}


def _presence_schema(prop: Mapping[str, Any]) -> dict[str, Any]:
    kinds = [prop, *prop.get("anyOf", [])]
    shapes: list[dict[str, Any]] = []
    if any(k.get("type") == "array" for k in kinds):
        shapes.append({"type": "array", "items": _PRESENCE})
    if any(k.get("type") not in ("array", "null") for k in kinds if "type" in k or "$ref" in k):
        shapes.append(_PRESENCE)
    if any(k.get("type") == "null" for k in kinds):
        shapes.append({"type": "null"})
    out: dict[str, Any] = shapes[0] if len(shapes) == 1 else {"anyOf": shapes}
    return {**out, **{k: v for k, v in prop.items() if k.startswith("x-") or k == "description"}}


def _as_read(node: Any) -> Any:
    if isinstance(node, list):
        return [_as_read(item) for item in node]
    if not isinstance(node, Mapping):
        return node
    out = {key: _as_read(value) for key, value in node.items()}
    props = out.get("properties")
    if isinstance(props, dict) and any("x-visibility" in p for p in props.values()):
        for name, prop in props.items():
            if prop.get("x-visibility") == VisClass.CARRIER.value:
                props[name] = _presence_schema(prop)
        public = {n for n, p in props.items() if p.get("x-visibility") == VisClass.PUBLIC.value}
        required = [n for n in out.get("required", []) if n in public]
        if required:
            out["required"] = required
        else:
            out.pop("required", None)
    return out


def reader_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A declared (stored) shape's schema as readers receive it: only public fields required,
    carriers as presence markers. Schemas without ``x-visibility`` are left as they are."""
    out: dict[str, Any] = _as_read(schema)
    return out


def catalogue_schema(ref_template: str = _REF) -> dict[str, Any]:
    """The JSON Schema of every event envelope as readers receive it (a ``oneOf`` discriminated
    by ``type``), its payloads and nested shapes under ``$defs``, each field with
    ``x-visibility``."""
    schema = reader_schema(_adapter().json_schema(ref_template=ref_template))
    schema.update(
        {
            "title": "thoughtgate event",
            "description": "An event of the thoughtgate event log, as HTTP reads and SSE frames "
            f"carry it. {READER_NOTE}",
            "x-event-version": EVENT_VERSION,
        }
    )
    return schema


def view_schema(shape: type, ref_template: str = _REF) -> dict[str, Any]:
    """A declared view (``RunView``, ...) as readers receive it."""
    return reader_schema(TypeAdapter(shape).json_schema(ref_template=ref_template))


def validate_event(event: Event | Mapping[str, Any]) -> None:
    """Raise ``pydantic.ValidationError`` unless the event matches its declared envelope."""
    data = event.to_dict() if isinstance(event, Event) else event
    _adapter().validate_python(data, strict=False)


_STRICT = os.environ.get("THOUGHTGATE_STRICT_EVENTS") == "1"


def strict(enabled: bool | None = None) -> bool:
    """Whether producers validate what they append (set ``enabled`` to change it)."""
    global _STRICT
    if enabled is not None:
        _STRICT = enabled
    return _STRICT


def check_new_events(events: Iterable[NewEvent]) -> None:
    """In strict mode, validate events before they are appended (a no-op otherwise)."""
    if not _STRICT:
        return
    for event in events:
        validate_event(
            {
                "seq": 1,
                "run_id": "run_check",
                "task_id": event.task_id,
                "type": event.type,
                "ts": event.ts,
                "v": EVENT_VERSION,
                "payload": dict(event.payload),
            }
        )


# --------------------------------------------------------------------------- markdown


def _type_text(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " \\| ".join(json.dumps(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " \\| ".join(_type_text(a) for a in typing.get_args(tp))
    if origin is list:
        return f"{_type_text(typing.get_args(tp)[0])}[]"
    if origin is dict:
        return f"object of {_type_text(typing.get_args(tp)[1])}"
    if is_typeddict(tp) or (isinstance(tp, type) and issubclass(tp, BaseModel)):
        return f"`{tp.__name__}`"
    names = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null"}
    return names.get(tp, "any")


def _rows(shape: type, defs: Mapping[str, Any], prefix: str = "") -> list[str]:
    props = defs.get(shape.__name__, {}).get("properties", {})
    rows = []
    for name, spec in declared_fields(shape).items():
        about = " ".join(str(props.get(name, {}).get("description", "")).split())
        need = "yes" if spec.required else "no"
        rows.append(
            f"| `{prefix}{name}` | {_type_text(spec.annotation)} | {spec.cls.value} | {need} | "
            f"{about} |"
        )
        if spec.model is not None:
            step = "[]." if spec.shape == "models" else "."
            rows += _rows(spec.model, defs, f"{prefix}{name}{step}")
    return rows


_HEADER = "| field | type | class | always written | about |\n|---|---|---|---|---|"

_INTRO = f"""# Event catalogue

<!-- Generated by `python -m thoughtgate.events.catalogue docs/events.md` from
     src/thoughtgate/events/payloads.py and views.py; do not edit by hand (a test checks it). -->

Every event is an envelope `{{seq, run_id, task_id, type, ts, v, payload}}`: `seq` counts from 1
per run with no gaps (the SSE `id:`), `v` is the vocabulary version its payload was written in
(this catalogue is version {EVENT_VERSION}; older events are upgraded as they are read). Keys are
snake_case. Each payload field declares one **visibility class**, and the one output filter shows
a field only when its class, and the class of every field above it, allows the reader:

| class | display surfaces (run views, events, SSE, CLI, MCP, web page, host metadata) | trace surface (developer+) |
|---|---|---|
| `public` | everyone | shown |
| `tool_detail` | member and above | shown |
| `reasoning` | developer and above, on `surface` runs only | `surface` and `telemetry_only` runs |
| `billing` | developer and above, every mode: billed token counts, which include the reasoning's tokens (ADR 0163) | shown |
| `trace` | never | shown |
| `operator` | admin and above | admin and above |
| `carrier` | never: `{{"carrier": NAME, "present": true}}` in its place | the same |

A field your role may not read is **absent** from your copy (never null). An event type or a
field this catalogue does not declare is withheld from every reader on display surfaces, and a
mode other than `hidden`, `surface` or `telemetry_only` shows no reasoning. An event whose own
class is not `public` (only `reasoning.delta`) is withheld whole from readers its class excludes.
"""


def render_markdown() -> str:
    """``docs/events.md``: a table per event type and view, then the JSON Schema itself."""
    schema = catalogue_schema()
    defs: dict[str, Any] = dict(schema.get("$defs", {}))
    views = {
        "RunView": RunView,
        "HostMetadataView": HostMetadataView,
    }
    for name, shape in views.items():
        published = view_schema(shape)
        defs.update(published.pop("$defs", {}))
        defs[name] = published
    parts = [_INTRO, "## Event types\n"]
    for spec in EVENT_SPECS.values():
        whole = (
            ""
            if spec.visibility is VisClass.PUBLIC
            else f" The whole event is `{spec.visibility.value}`."
        )
        parts.append(
            f"### `{spec.name}`\n\n{spec.doc}{whole} Payload: `{spec.payload.__name__}`.\n"
        )
        parts.append(_HEADER + "\n" + "\n".join(_rows(spec.payload, defs)) + "\n")
    parts.append(
        "## Run and task views\n\nWhat `GET /v1/runs/{id}`, `status --json`, MCP and the Python "
        "client return, through the same filter (the run's own mode, display surface).\n"
    )
    for name, shape in views.items():
        parts.append(f"### `{name}`\n\n{' '.join((shape.__doc__ or '').split())}\n")
        parts.append(_HEADER + "\n" + "\n".join(_rows(shape, defs)) + "\n")
    parts.append(
        "## JSON Schema\n\nThe same catalogue as JSON Schema (2020-12), as `/openapi.json` "
        "embeds it:\n\n```json\n" + json.dumps(schema, indent=1, sort_keys=True) + "\n```\n"
    )
    return "\n".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m thoughtgate.events.catalogue [PATH]``: write the markdown (stdout without)."""
    args = list(sys.argv[1:] if argv is None else argv)
    text = render_markdown()
    if args:
        Path(args[0]).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
