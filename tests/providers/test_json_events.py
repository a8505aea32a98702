"""Stream events are decoded by orjson where it reads them exactly as ``json`` does, by ``json``
everywhere else (``providers.http.parse_json_event``): the values, what is accepted and what is
refused must be ``json``'s, whatever the payload."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from thoughtgate.errors import MalformedResponseError
from thoughtgate.providers.http import parse_json_event
from thoughtgate.providers.sse import SSEMessage

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
