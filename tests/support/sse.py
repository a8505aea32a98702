"""The tests' one reader of raw Server-Sent Events bytes, written apart from the adapters' decoder.

Tests read transcripts and captured bodies with it to say what a stream *holds*, so it must not be
the code under test: it is the plain reading of the SSE specification (blank-line separated
events, ``event:`` and ``data:`` fields, comments skipped), with no incremental state.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, NamedTuple

__all__ = ["Frame", "frames", "json_frames", "json_payloads"]


class Frame(NamedTuple):
    """One event: its ``event:`` name (``None`` when it has none) and its joined ``data:``."""

    event: str | None
    data: str


def frames(raw: bytes | str) -> list[Frame]:
    """Every event of a whole SSE body, in order (comment-only blocks left out)."""
    text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    out: list[Frame] = []
    for block in text.split("\n\n"):
        event: str | None = None
        data: list[str] = []
        for line in block.split("\n"):
            if not line or line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "event":
                event = value
            elif name == "data":
                data.append(value)
        if event is not None or data:
            out.append(Frame(event, "\n".join(data)))
    return out


def json_frames(raw: bytes | str) -> Iterator[tuple[str | None, Any]]:
    """``(event name, decoded data)`` for every event with JSON data (``[DONE]`` left out)."""
    for frame in frames(raw):
        if frame.data and frame.data != "[DONE]":
            yield frame.event, json.loads(frame.data)


def json_payloads(raw: bytes | str) -> list[Any]:
    """The decoded ``data:`` of every event with JSON data."""
    return [data for _, data in json_frames(raw)]
