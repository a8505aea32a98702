"""What the CLI and the client print of text another program chose (a model's answer, a
server's error) is inert: no character a terminal or log viewer obeys survives, and everything
else is kept as it was (ADR 0135)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from thoughtgate.inert import inert_line, inert_text

pytestmark = pytest.mark.unit

_OBEYED = {*range(0x20), *range(0x7F, 0xA0), *range(0x202A, 0x202F), *range(0x2066, 0x206A)}
"""C0, DEL, C1 and Unicode's bidirectional embeddings, overrides and isolates."""


@given(st.text())
def test_no_obeyed_character_survives_and_the_rest_is_kept(text: str) -> None:
    line = inert_line(text)
    assert not {ord(c) for c in line} & _OBEYED
    shown = inert_text(text)
    assert not {ord(c) for c in shown} & (_OBEYED - {0x09, 0x0A})
    plain = "".join(c for c in text if ord(c) not in _OBEYED)
    assert inert_line(plain) == plain


def test_a_right_to_left_override_is_shown_not_obeyed() -> None:
    """``invoice\\u202etxt.exe`` shows as ``invoiceexe.txt`` where bidi is honoured."""
    assert inert_text("invoice\u202etxt.exe") == "invoice\\u202etxt.exe"
    assert inert_line("a\u2066b\u2069") == "a\\u2066b\\u2069"


def test_right_to_left_text_and_its_marks_are_kept() -> None:
    hebrew = "\u05e9\u05dc\u05d5\u05dd\u200f world\u200e"
    assert inert_text(hebrew) == hebrew
