"""Scripted scenarios: what the emulated model "does" on each turn, independent of wire format.

A :class:`Scenario` is a list of :class:`ScriptedTurn`; the emulator picks the turn by counting the
assistant messages already in the request's history, so a tool loop walks through the turns with
no server-side state. Each format module renders the same steps in its own wire format.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, TypeAlias

__all__ = [
    "Call",
    "Cut",
    "Fail",
    "Pause",
    "Redacted",
    "Say",
    "Scenario",
    "ScriptedTurn",
    "Sleep",
    "Step",
    "StreamError",
    "Summary",
    "Think",
    "opaque_blob",
    "sign",
    "verify",
]

_KEY = b"thoughtgate-emulator-signing-key"


def sign(*parts: str) -> str:
    """A deterministic signature over the given texts, so tampering is detectable."""
    mac = hmac.new(_KEY, "\x1f".join(parts).encode(), hashlib.sha256).digest()
    return "Eq" + base64.b64encode(b"\x12\x08" + mac).decode()


def verify(signature: str, *parts: str) -> bool:
    return hmac.compare_digest(signature, sign(*parts))


def opaque_blob(label: str) -> str:
    """Deterministic opaque base64 bytes standing in for encrypted content."""
    raw = hashlib.sha256(label.encode()).digest() * 4
    return "gAAAAA" + base64.b64encode(raw).decode()


@dataclass(frozen=True, slots=True)
class Think:
    """Raw reasoning text (Anthropic thinking, reasoning_content, <think>, reasoning.text)."""

    text: str


@dataclass(frozen=True, slots=True)
class Summary:
    """A provider-written reasoning summary (OpenAI summaries, OpenRouter reasoning.summary)."""

    text: str


@dataclass(frozen=True, slots=True)
class Redacted:
    """Anthropic ``redacted_thinking`` (opaque); other formats render an encrypted detail."""

    label: str = "redacted"


@dataclass(frozen=True, slots=True)
class Say:
    """Answer text."""

    text: str


@dataclass(frozen=True, slots=True)
class Call:
    """A tool call with JSON arguments."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    _: KW_ONLY
    call_id: str | None = None


@dataclass(frozen=True, slots=True)
class Fail:
    """Answer the request with an HTTP error instead of a turn (before any output)."""

    status: int
    error_type: str
    message: str
    _: KW_ONLY
    retry_after: float | None = None
    times: int = 1
    """Fail only the first ``times`` attempts of this turn (a retry then succeeds)."""


@dataclass(frozen=True, slots=True)
class StreamError:
    """An in-stream error event at this point (HTTP status already 200)."""

    error_type: str
    message: str


@dataclass(frozen=True, slots=True)
class Cut:
    """Close the connection abruptly at this point."""


@dataclass(frozen=True, slots=True)
class Pause:
    """Anthropic: end this response with ``stop_reason: "pause_turn"``; the request that sends
    the paused content back as the final assistant message gets the steps after it. Other formats
    ignore it."""


@dataclass(frozen=True, slots=True)
class Sleep:
    """Pause the stream (slow streams, keep-alives, timeouts)."""

    seconds: float


Step: TypeAlias = Think | Summary | Redacted | Say | Call | Fail | StreamError | Cut | Sleep | Pause


@dataclass(frozen=True, slots=True)
class ScriptedTurn:
    """One model turn. ``chunk_chars`` splits texts into deltas of about that many characters."""

    steps: tuple[Step, ...]
    _: KW_ONLY
    input_tokens: int = 40
    chunk_chars: int = 12

    @property
    def calls(self) -> tuple[Call, ...]:
        return tuple(s for s in self.steps if isinstance(s, Call))

    def segments(self) -> tuple[tuple[Step, ...], ...]:
        """The steps split at each :class:`Pause` (one segment when there is none)."""
        out: list[tuple[Step, ...]] = []
        current: list[Step] = []
        for step in self.steps:
            if isinstance(step, Pause):
                out.append(tuple(current))
                current = []
            else:
                current.append(step)
        out.append(tuple(current))
        return tuple(out)


@dataclass(frozen=True, slots=True)
class Scenario:
    """A named script; ``turns[i]`` answers the request whose history has ``i`` assistant turns."""

    name: str
    turns: tuple[ScriptedTurn, ...]

    def turn(self, index: int) -> ScriptedTurn:
        if not self.turns:
            return ScriptedTurn((Say(""),))
        return self.turns[min(index, len(self.turns) - 1)]


def split_text(text: str, size: int) -> list[str]:
    """Split into deltas of ``size`` characters (at least one delta, possibly empty)."""
    if not text:
        return [""]
    return [text[i : i + size] for i in range(0, len(text), max(1, size))]
