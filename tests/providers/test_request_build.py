"""A shared client's JSON POSTs are built from the headers of its first one
(``providers.http._post_request``, ADR 0032): every request must be the one httpx's own
``build_request`` makes -- method, URL, headers in their order and case, body bytes, timeout --
whatever the body, and a client whose jar holds cookies, or headers httpx would not have made,
builds each request itself."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from thoughtgate.providers import http
from thoughtgate.providers.http import _post_request

URL = httpx.URL("http://127.0.0.1:9/v1/chat/completions")
HEADERS = httpx.Headers({"Authorization": "Bearer k", "X-Title": "thoughtgate", "accept": "x/y"})
TIMEOUT = httpx.Timeout(30.0, connect=5.0)
CLIENT = httpx.AsyncClient()
"""One client for the generated bodies (a client costs a TLS context): its first request makes
the copy the others are built from."""

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(),
)
bodies = st.dictionaries(
    st.text(),
    st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
        max_leaves=12,
    ),
    max_size=5,
)


def shape(request: httpx.Request) -> tuple[Any, ...]:
    return (
        request.method,
        str(request.url),
        request.headers.raw,
        request.content,
        request.extensions,
    )


def test_the_installed_httpx_takes_the_copied_path() -> None:
    """The copy needs httpx's private ``encode_json``; an httpx without it builds every request
    itself (slower, not wrong), and this says so."""
    assert http._encode_json is not None
    client = httpx.AsyncClient()
    _post_request(client, URL, {"a": 1}, HEADERS, TIMEOUT, ("path", str(URL)))
    assert http._TEMPLATES[client][("path", str(URL))] is not None


@settings(max_examples=200, deadline=None)
@given(first=bodies, later=st.lists(bodies, min_size=1, max_size=3))
def test_every_request_is_the_one_httpx_builds(first: dict[str, Any], later: list[Any]) -> None:
    key = ("k", str(URL))
    for body in [first, *later]:
        ours = _post_request(CLIENT, URL, body, HEADERS, TIMEOUT, key)
        theirs = CLIENT.build_request("POST", URL, json=body, headers=HEADERS, timeout=TIMEOUT)
        assert shape(ours) == shape(theirs)


def test_a_body_json_refuses_is_refused_as_httpx_refuses_it() -> None:
    client = httpx.AsyncClient()
    key = ("nan", str(URL))
    _post_request(client, URL, {"a": 1}, HEADERS, TIMEOUT, key)  # the template is made
    with pytest.raises(ValueError, match="JSON compliant"):
        _post_request(client, URL, {"a": float("nan")}, HEADERS, TIMEOUT, key)


def test_a_client_with_cookies_sends_them() -> None:
    client = httpx.AsyncClient()
    key = ("cookies", str(URL))
    _post_request(client, URL, {"a": 1}, HEADERS, TIMEOUT, key)
    client.cookies.set("lb", "a1", domain="127.0.0.1")
    request = _post_request(client, URL, {"a": 2}, HEADERS, TIMEOUT, key)
    assert request.headers["cookie"] == "lb=a1"
    theirs = client.build_request("POST", URL, json={"a": 2}, headers=HEADERS, timeout=TIMEOUT)
    assert shape(request) == shape(theirs)


def test_headers_httpx_would_not_make_are_never_copied() -> None:
    """A transport whose headers name a ``Content-Length`` of their own: httpx keeps that one,
    so no copy could stand for the next body; each request is built by httpx."""
    client = httpx.AsyncClient()
    key = ("length", str(URL))
    odd = httpx.Headers({"Content-Length": "2"})
    for body in ({"a": 1}, {"bb": 22}):
        ours = _post_request(client, URL, body, odd, TIMEOUT, key)
        theirs = client.build_request("POST", URL, json=body, headers=odd, timeout=TIMEOUT)
        assert shape(ours) == shape(theirs)
