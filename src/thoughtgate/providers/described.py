"""What a provider's answer looked like, for an error message, without anything it said.

An adapter's error message becomes a run's and a task's ``error``, which every reader sees (the
``public`` class: ``docs/events.md``). A malformed or mistyped event can be a reasoning delta, a
signature, a redacted-thinking blob or a tool call's arguments, so a message that quoted the
event (even its first 200 characters) handed a viewer what the one output filter keeps from them.
These helpers say which JSON type a value was, and name an object's keys only when they look
like field names; the content itself is never part of a message (fail closed: there is no "safe"
content an adapter could tell from the rest).

Nor is its size (ADR 0169). A stream event or an answer's body holds the reasoning, so its
length, a string's length, a list's item count or where in it a parser stopped tells a viewer
how much the model reasoned -- what the declarations class ``reasoning`` (``reasoning_chars``).
:func:`shape_of` says only the type; :func:`measure_of` and :func:`size_of` measure, for the
error's ``detail`` (the developer-only ``error_detail``, shown where reasoning is).
"""

from __future__ import annotations

import re
from typing import Any, Final

__all__ = ["is_field_name", "measure_of", "shape_of", "size_of", "without_quoted_bytes"]

_FIELD_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,39}")
_KEYS_NAMED: Final = 8
_QUOTED_BYTES: Final = re.compile(
    r"""(?<![\w])b(?:'(?:[^'\\]|\\.)*(?:'|$)|"(?:[^"\\]|\\.)*(?:"|$))""", re.DOTALL
)
"""A ``bytes`` repr in an error's text, to its closing quote or, cut short, to the end."""


def is_field_name(value: object) -> bool:
    """Whether ``value`` looks like a field name (``delta``, ``content_block``): what
    :func:`shape_of` names of an object's keys; anything else is only counted."""
    return isinstance(value, str) and _FIELD_NAME.fullmatch(value) is not None


def size_of(text: str | bytes) -> str:
    """``"85 characters"`` (or bytes): how long a text was, not what it said. For an error's
    ``detail`` only: the size of what a provider sent is the size of its reasoning too."""
    unit = "bytes" if isinstance(text, bytes | bytearray) else "characters"
    return f"{len(text)} {unit}"


def shape_of(value: Any) -> str:
    """A JSON value's type, for the public ``error``: ``an object with keys type, index, delta``,
    ``a string``, ``a list``; a key is named only when it looks like a field name (the rest are
    counted: keys are the format's, not the model's). Never a length: :func:`measure_of`."""
    if isinstance(value, dict):
        names = [k for k in value if is_field_name(k)]
        named = names[:_KEYS_NAMED]
        others = len(value) - len(named)
        if not value:
            return "an empty object"
        parts = ", ".join(named)
        if others:
            more = f"{others} other key{'' if others == 1 else 's'}"
            parts = f"{parts} and {more}" if parts else more
        return f"an object with keys {parts}"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if value is None:
        return "null"
    return f"a {type(value).__name__}"


def measure_of(value: Any) -> str:
    """:func:`shape_of` with the length of a string or a list (``a string of 85 characters``,
    ``a list of 3 items``): for an error's ``detail`` only (the module's docstring)."""
    if isinstance(value, list | tuple):
        return f"a list of {len(value)} item{'' if len(value) == 1 else 's'}"
    if isinstance(value, str):
        return f"a string of {size_of(value)}"
    return shape_of(value)


def without_quoted_bytes(text: str) -> str:
    """An HTTP library's error text with every ``bytes`` it quotes withheld.

    h11 (and the body reader that mirrors it) say what they could not parse by quoting it:
    ``illegal chunk header: b'...'``. When a body's framing is off, that "header" is a line of
    the body itself -- a stream event, reasoning and all -- so the quote is replaced by its
    kind; the rest of the text (what went wrong) is kept."""
    return _QUOTED_BYTES.sub("<bytes withheld>", text)
