"""Stream events are decoded by orjson where it reads them exactly as ``json`` does, by ``json``
everywhere else (``providers.http.parse_json_event``): the values, what is accepted and what is
refused must be ``json``'s, whatever the payload; and blanks around a payload never change what
the JSON formats' parser reads from it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from thoughtgate.errors import MalformedResponseError
from thoughtgate.providers.http import parse_json_event
from thoughtgate.providers.openai_compatible import CompatParser
from thoughtgate.providers.sse import SSEMessage
from thoughtgate.types import TurnAccumulator

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),  # past 64 bits too: orjson would make those floats
    st.floats(),  # NaN and infinities too: orjson refuses those
    st.text(),  # lone surrogates too: orjson refuses those
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


def outcome(decode: Any, data: str) -> str:
    try:
        value = decode(data)
    except (json.JSONDecodeError, MalformedResponseError):
        return "refused"
    return repr(value) if isinstance(value, dict) else "not an object"


def ours(data: str) -> Any:
    return parse_json_event("test", SSEMessage("message", data))


def json_object(data: str) -> Any:
    value = json.loads(data)
    if not isinstance(value, dict):
        raise MalformedResponseError("not an object", provider="test")
    return value


@settings(max_examples=300)
@given(value=st.dictionaries(st.text(), values, max_size=5), indent=st.sampled_from([None, 1]))
def test_an_event_decodes_to_what_json_gives(value: dict[str, Any], indent: int | None) -> None:
    data = json.dumps(value, indent=indent)
    assert outcome(ours, data) == outcome(json_object, data)


@settings(max_examples=300)
@given(data=st.text(alphabet=st.sampled_from('{}[]":,0123456789.eE-+ aNInfity\\u\n')))
def test_any_text_is_accepted_or_refused_as_json_does(data: str) -> None:
    assert outcome(ours, data) == outcome(json_object, data)


def test_a_malformed_event_names_the_event_and_json_s_reason() -> None:
    with pytest.raises(MalformedResponseError, match=r"malformed JSON in 'delta' stream event: "):
        parse_json_event("test", SSEMessage("delta", '{"a": '))


def _chat_turn(datas: list[str]) -> tuple[str, str, str | None, list[str] | None]:
    """What a Chat Completions parser makes of a stream of ``data:`` payloads: reasoning,
    answer, finish reason, and the failure it stopped at (its class and what it names, not the
    place in the payload or the payload's size)."""
    parser = CompatParser(provider="openai-compatible", model="m", capture=True)
    acc = TurnAccumulator()
    acc.feed_all(parser.feed([SSEMessage("message", data) for data in datas]))
    failure = parser.failure
    if failure is None:
        acc.feed_all(parser.end())
    turn = acc.finish()
    said = None if failure is None else f"{type(failure).__name__}: {failure}".split(": ")[:3]
    return turn.reasoning_text, turn.text, parser.finish_raw, said


def _chunk(delta: dict[str, Any], finish: str | None = None) -> str:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return json.dumps({"id": "c1", "model": "m", "choices": [choice]})


_CHAT_STREAM = [
    _chunk({"role": "assistant", "content": None, "reasoning_content": ""}),
    _chunk({"content": None, "reasoning_content": "think "}),
    _chunk({"content": "Answer", "tool_calls": None}),
    _chunk({}, "stop"),
    "[DONE]",
]
json_blanks = st.text(alphabet=" \t\n\r", max_size=3)
"""Blanks JSON allows around a value."""
blanks = st.text(alphabet=" \t\n\r\f\v\x1c\u2028", max_size=3)
"""Blanks ``str.strip`` removes: around ``[DONE]``, and payloads of nothing else."""


@settings(max_examples=200)
@given(
    pads=st.lists(st.tuples(json_blanks, json_blanks), min_size=len(_CHAT_STREAM), max_size=8),
    done_pads=st.tuples(blanks, blanks),
    extra=st.lists(blanks, max_size=3),
    cut=st.integers(0, len(_CHAT_STREAM)),
    broken=st.sampled_from([None, '{"choices": [', '  {"choices": [', "not json", "\f{}"]),
)
def test_blanks_around_a_payload_never_change_what_the_stream_says(
    pads: list[tuple[str, str]],
    done_pads: tuple[str, str],
    extra: list[str],
    cut: int,
    broken: str | None,
) -> None:
    """The JSON formats' parser reads a payload with blanks around it as the payload itself: an
    object with JSON's blanks around it (the object is decoded as sent, a payload starting with
    ``{`` needs no strip), ``[DONE]`` with any blanks, blank payloads skipped, a malformed payload
    refused with the same error whether it starts with ``{`` or not."""
    plain = _CHAT_STREAM[:cut] + ([broken] if broken is not None else []) + _CHAT_STREAM[cut:]
    padded = [f"{left}{data}{right}" for data, (left, right) in zip(plain, pads, strict=False)]
    padded += plain[len(padded) :]
    padded[-1] = f"{done_pads[0]}[DONE]{done_pads[1]}"
    padded[cut:cut] = extra
    expected = _chat_turn(plain)
    if broken is None or cut == len(_CHAT_STREAM):  # what follows [DONE] is read and ignored
        assert expected == ("think ", "Answer", "stop", None)
    else:
        assert expected[3] is not None and expected[3][0] == "MalformedResponseError"
    assert _chat_turn(padded) == expected
