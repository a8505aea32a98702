"""The daemon's JSON answers and request bodies (ADR 0103): the same bytes as before, read once.

``server.responses.JSONResponse`` renders with an encoder built once instead of Starlette's
``json.dumps`` per answer; ``BodyLimitMiddleware`` hands the body it read to ``parse_body``
through the scope. Neither may change what a client sends or gets.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel
from starlette import responses as starlette_responses
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from thoughtgate.server.api import parse_body
from thoughtgate.server.errors import exception_handlers
from thoughtgate.server.middleware import READ_BODY, BodyLimitMiddleware
from thoughtgate.server.responses import JSONResponse, compact_json

pytestmark = pytest.mark.unit

_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(), inner, max_size=4)
    ),
    max_leaves=12,
)


@given(st.dictionaries(st.text(), _values, max_size=6))
def test_an_answer_is_the_text_starlette_writes(content: dict[str, Any]) -> None:
    """Any JSON content (non-ASCII text, floats, tuples, nesting): the bytes of Starlette's own
    ``JSONResponse``, so no client sees a difference."""
    assert JSONResponse(content).body == starlette_responses.JSONResponse(content).body


@given(_values)
def test_sorted_compact_json_is_jsons_text(value: Any) -> None:
    assert compact_json(value, sort_keys=True) == json.dumps(
        value, ensure_ascii=False, allow_nan=False, separators=(",", ":"), sort_keys=True
    )


_any_text = st.text(st.characters())  # every code point: lone surrogates (U+D800-U+DFFF) too


@given(
    st.dictionaries(
        _any_text,
        st.recursive(
            st.none() | st.integers() | _any_text,
            lambda inner: (
                st.lists(inner, max_size=4) | st.dictionaries(_any_text, inner, max_size=4)
            ),
            max_leaves=12,
        ),
        max_size=6,
    )
)
def test_an_answer_holding_a_lone_surrogate_is_utf8_that_reads_back_the_same(
    content: dict[str, Any],
) -> None:
    """An event's payload keeps a lone surrogate exactly (a provider's text cut inside an emoji,
    ADR 0114), and the events page answers with it: the body is UTF-8 (the surrogate as a
    ``\\u`` escape, as the live stream writes it) that any JSON reader turns back into the same
    value, not a 500 for every reader of the run."""
    body = JSONResponse(content).body
    assert json.loads(body.decode("utf-8")) == content


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_number_json_cannot_carry_is_refused_as_starlette_refuses_it(bad: float) -> None:
    for response in (JSONResponse, starlette_responses.JSONResponse):
        with pytest.raises(ValueError, match="Out of range float values"):
            response({"ok": 1, "x": [bad]})


def test_a_value_that_holds_itself_is_refused_as_starlette_refuses_it() -> None:
    """The encoder built once keeps no circular-reference markers: such a value is handed to
    Starlette's ``render``, which refuses it as before (not a ``RecursionError``)."""
    loop: dict[str, Any] = {"a": 1}
    loop["self"] = loop
    for response in (JSONResponse, starlette_responses.JSONResponse):
        with pytest.raises(ValueError, match="Circular reference detected"):
            response(loop)


def test_a_value_that_is_not_json_is_refused_as_starlette_refuses_it() -> None:
    """The encoder built once has no ``default``: a value it cannot write is written by
    ``json``, which names the type (not "'NoneType' object is not callable")."""
    for response in (JSONResponse, starlette_responses.JSONResponse):
        with pytest.raises(TypeError, match="Object of type object is not JSON serializable"):
            response({"ok": [1, object()]})


class _Body(BaseModel):
    name: str


def _app(seen: list[Any]) -> Starlette:
    async def parsed(request: Request) -> Response:
        body = await parse_body(request, _Body)
        seen.append((body.name, READ_BODY in request.scope))
        return JSONResponse({"name": body.name})

    async def raw(request: Request) -> Response:
        seen.append(await request.body())
        return Response(b"ok")

    return Starlette(
        routes=[Route("/parsed", parsed, methods=["POST"]), Route("/raw", raw, methods=["POST"])],
        middleware=[Middleware(BodyLimitMiddleware, max_body_bytes=1000)],
        exception_handlers=exception_handlers(),
    )


async def _pieces(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:  # a body in several ``http.request`` messages (chunked)
        yield part


async def test_a_body_the_limit_read_reaches_its_route_once_by_either_way() -> None:
    """``parse_body`` takes the body the middleware read (and the scope keeps no copy of it);
    a route that reads ``request.body()`` instead gets the same bytes through ``receive``; a
    body over the limit reaches neither."""
    seen: list[Any] = []
    transport = httpx.ASGITransport(app=_app(seen))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        parsed = await client.post("/parsed", content=b'{"name": "caf\xc3\xa9"}')
        raw = await client.post("/raw", content=b'{"name": "x"}')
        chunked = await client.post("/parsed", content=_pieces(b'{"name"', b': "y"}'))
        too_large = await client.post("/parsed", content=b"x" * 1001)
        bad = await client.post("/parsed", content=b"{")
    assert parsed.json() == {"name": "café"}
    assert raw.content == b"ok"
    assert chunked.json() == {"name": "y"}
    assert too_large.status_code == 413
    assert bad.status_code == 400
    assert seen == [("café", False), b'{"name": "x"}', ("y", False)]
