"""Text another program chose, made fit to show: its control characters visible, not obeyed, and
its length bounded.

A terminal obeys escape sequences (``ESC ]0;...`` retitles it, ``ESC [2J`` clears it, OSC 8
plants a link, C1's one-byte CSI ``\\x9b`` does what ``ESC [`` does), and a log line ends where a
line break is. Words a server at a mistyped or hostile address sent, a driver's, a model's, go
through here before they are printed or put into an error's text: the CLI's lines and a run's
data (ADR 0135, amendments 2 and 3), the Python client's errors (ADR 0135, amendment 4).
"""

from __future__ import annotations

from typing import Final

__all__ = ["bounded", "inert_line", "inert_text"]

_BIDI: Final = (*range(0x202A, 0x202F), *range(0x2066, 0x206A))
"""Unicode's bidirectional embeddings, overrides and isolates (LRE .. RLO, LRI .. PDI): a
terminal or log viewer that honours them shows text in another order than it is ("Trojan
Source"); the marks LRM / RLM, which right-to-left text uses and which reorder nothing by
themselves, stay. The web page shows the same code points the same way (``inert`` in
``server/static/util.js``)."""

_CONTROLS: Final = {
    **{c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0))},
    **{c: f"\\u{c:04x}" for c in _BIDI},
}
"""C0, DEL and C1 (shown as ``\\x1b``) and the bidirectional controls (``\\u202e``): never
sent to a terminal as they are."""

_TEXT_CONTROLS: Final[dict[int, str | None]] = {
    **{c: v for c, v in _CONTROLS.items() if c not in (0x09, 0x0A)},
    0x0D: None,
}
"""As ``_CONTROLS``, but a tab and a line break stay what they are (text spans lines), and a
carriage return goes, as rich drops it: a model's ``\\r\\n`` line ends are line breaks."""


def inert_line(line: str) -> str:
    """``line`` with every control character shown, not obeyed (one line of an error)."""
    return line.translate(_CONTROLS)


def inert_text(value: object) -> str:
    """``str(value)`` with every control character but tab and line break shown, not obeyed: a
    model's answer or reasoning, a tool's output, a server's words, which span lines."""
    return str(value).translate(_TEXT_CONTROLS)


def bounded(text: str, limit: int) -> str:
    """``text``, or its first ``limit`` characters and how long it was when it is longer:
    ``… (1048576 characters in all)``. An answer may be megabytes; an error's text goes into
    a log line or a terminal, whole."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text)} characters in all)"
