"""The seven visibility classes, declared once per field of every event payload and view.

A field's type carries its class as ``Annotated`` metadata, so the declaration sits next to the
field and nowhere else::

    class ToolStarted(TypedDict):
        call_id: Annotated[str, Vis.PUBLIC]
        input: Annotated[dict[str, Any], Vis.TOOL_DETAIL]

The one output filter (``thoughtgate.access.filter``) reads these declarations as an allowlist;
the event catalogue publishes them as ``x-visibility`` in the JSON Schema. Who may read each class
(the table is also in ``docs/events.md``):

==============  =================================================================================
``public``      every reader
``tool_detail`` member and above: tool arguments, results, and any error or progress text that
                can quote them (a viewer gets a safe public form, e.g. ``error_kind``)
``reasoning``   developer and above, on display surfaces only of ``surface`` runs (and on the
                trace surface): reasoning text, parts, kinds, sizes, reasoning token counts and
                anything else derived from reasoning
``billing``     developer and above, on every surface and in every mode: billed token counts,
                which include the reasoning's tokens (output) or may (input: signed thinking
                and encrypted reasoning sent back in a tool loop), so they tell its size
                (ADR 0163)
``trace``       the trace surface only (developer and above); never a display surface
``operator``    admin and above: key names, approver identities, process ids, hosts
``carrier``     nobody: continuity carriers (signatures, encrypted items) never leave the
                process; a reader learns only that one existed (``{"carrier", "present": true}``)
==============  =================================================================================

Classes nest: a field is shown only when its own class and the class of every field above it
allow it (``usage`` is public, ``usage.output_tokens`` is billing, ``usage.reasoning_tokens`` is
reasoning).
"""

from __future__ import annotations

import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from functools import cache
from typing import TYPE_CHECKING, Any, Final, Literal, TypeAlias

from pydantic import BaseModel
from typing_extensions import is_typeddict

if TYPE_CHECKING:
    from pydantic import GetJsonSchemaHandler
    from pydantic.json_schema import JsonSchemaValue
    from pydantic_core import CoreSchema

__all__ = [
    "DeclaredField",
    "FieldShape",
    "Vis",
    "VisClass",
    "Visibility",
    "declared_fields",
    "visibility_of",
]


class VisClass(StrEnum):
    """The name of a visibility class (the value of ``x-visibility`` in the JSON Schema)."""

    PUBLIC = "public"
    TOOL_DETAIL = "tool_detail"
    REASONING = "reasoning"
    BILLING = "billing"
    TRACE = "trace"
    OPERATOR = "operator"
    CARRIER = "carrier"


@dataclass(frozen=True, slots=True)
class Visibility:
    """``Annotated`` metadata naming a field's class; it also writes ``x-visibility`` into the
    field's JSON Schema."""

    cls: VisClass

    def __get_pydantic_json_schema__(
        self, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        schema = handler(core_schema)
        schema["x-visibility"] = self.cls.value
        return schema


class Vis:
    """The markers to write in ``Annotated[...]``: ``Annotated[str, Vis.TOOL_DETAIL]``."""

    PUBLIC: Final = Visibility(VisClass.PUBLIC)
    TOOL_DETAIL: Final = Visibility(VisClass.TOOL_DETAIL)
    REASONING: Final = Visibility(VisClass.REASONING)
    BILLING: Final = Visibility(VisClass.BILLING)
    TRACE: Final = Visibility(VisClass.TRACE)
    OPERATOR: Final = Visibility(VisClass.OPERATOR)
    CARRIER: Final = Visibility(VisClass.CARRIER)


def visibility_of(metadata: Iterable[Any]) -> list[VisClass]:
    """Every class named in a field's ``Annotated`` metadata (a declaration has exactly one)."""
    return [m.cls for m in metadata if isinstance(m, Visibility)]


FieldShape: TypeAlias = Literal["scalar", "json", "model", "models"]
"""``scalar``: str, int, float, bool, null or a literal; ``json``: any other JSON value, shown
whole or not at all (tool arguments, a list of names); ``model``: a declared nested shape;
``models``: a list of one. A declared shape that may be null (``Shape | None``) is a ``model``
too."""

_SCALARS = (str, int, float, bool, type(None))
_WRAPPERS = frozenset({typing.NotRequired, typing.Required})


@dataclass(frozen=True, slots=True)
class DeclaredField:
    """One field of a declared shape, as the filter and the catalogue read it."""

    name: str
    cls: VisClass
    shape: FieldShape
    required: bool
    annotation: Any
    """The field's type without its visibility metadata."""
    model: type | None = None
    """The nested declared shape (a ``TypedDict`` or a pydantic model) of a ``model`` or
    ``models`` field."""


def _is_scalar(tp: Any) -> bool:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return True
    if origin in (typing.Union, types.UnionType):
        return all(_is_scalar(arg) for arg in typing.get_args(tp))
    return tp in _SCALARS


def _declares(tp: Any) -> bool:
    return is_typeddict(tp) or (isinstance(tp, type) and issubclass(tp, BaseModel))


def _shape(tp: Any) -> tuple[FieldShape, type | None]:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        # ``Shape | None``: projected like ``Shape`` (a null stays null)
        declared = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(declared) == 1 and _declares(declared[0]):
            return "model", declared[0]
    if _declares(tp):
        return "model", tp
    if typing.get_origin(tp) is list:
        (item,) = typing.get_args(tp)
        if _declares(item):
            return "models", item
    return ("scalar" if _is_scalar(tp) else "json"), None


def _declared(shape: type, name: str, classes: list[VisClass]) -> VisClass:
    if len(classes) != 1:
        raise TypeError(
            f"{shape.__name__}.{name} declares {len(classes)} visibility classes; "
            "every field needs exactly one"
        )
    return classes[0]


def _model_fields(shape: type[BaseModel]) -> dict[str, DeclaredField]:
    """A pydantic view's fields (pydantic keeps ``Annotated`` metadata in ``metadata``)."""
    fields: dict[str, DeclaredField] = {}
    for name, info in shape.model_fields.items():
        cls = _declared(shape, name, visibility_of(info.metadata))
        kind, model = _shape(info.annotation)
        fields[name] = DeclaredField(name, cls, kind, info.is_required(), info.annotation, model)
    return fields


@cache
def declared_fields(shape: type) -> dict[str, DeclaredField]:
    """The fields of a declared ``TypedDict`` or pydantic model, each with its one visibility
    class.

    Raises ``TypeError`` when a field declares no class or more than one: a field nobody
    classified cannot be shown safely, so the declaration itself is refused.
    """
    if issubclass(shape, BaseModel):
        return _model_fields(shape)
    hints = typing.get_type_hints(shape, include_extras=True)
    fields: dict[str, DeclaredField] = {}
    for name, hint in hints.items():
        tp = hint
        # ``__required_keys__`` is wrong under postponed annotations: read the wrappers instead.
        required = bool(getattr(shape, "__total__", True))
        while typing.get_origin(tp) in _WRAPPERS:
            required = typing.get_origin(tp) is typing.Required
            (tp,) = typing.get_args(tp)
        cls = _declared(shape, name, visibility_of(getattr(tp, "__metadata__", ())))
        bare = typing.get_args(tp)[0]
        kind, model = _shape(bare)
        fields[name] = DeclaredField(name, cls, kind, required, bare, model)
    return fields
