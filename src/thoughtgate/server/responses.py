"""The daemon's JSON responses: Starlette's, written by a JSON encoder built once.

Starlette's ``JSONResponse.render`` calls ``json.dumps`` with options of its own, and ``json``
builds a new encoder (a ``JSONEncoder`` and its C encoder) for every such call: on the bench
host that was two thirds of rendering a ticket's answer (ADR 0103). The C encoder here has the
same options (``ensure_ascii=False``, ``allow_nan=False``, compact separators), so every body is
the text Starlette writes, byte for byte. Without ``json``'s circular-reference markers (which
cannot be shared between calls), a value that holds itself ends in ``RecursionError``; it is
then written by Starlette's own ``render``, which refuses it as it always did. A body holding a
lone surrogate, which UTF-8 cannot carry, is written with ``\\u`` escapes (ASCII) instead.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from starlette import responses
from starlette.background import BackgroundTask

__all__ = ["NOT_KEPT", "JSONResponse", "compact_json"]


def _c_encoder(*, sort_keys: bool) -> Callable[[Any], str] | None:
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # pragma: no cover - CPython always has it
        return None
    encode = make(
        None,  # markers: none (below)
        None,  # default: nothing else is JSON
        json.encoder.c_encode_basestring,  # type: ignore[attr-defined]  # ensure_ascii=False
        None,  # indent
        ":",
        ",",
        sort_keys,
        False,  # skipkeys
        False,  # allow_nan
    )

    def dumps(value: Any) -> str:
        return "".join(encode(value, 0))

    return dumps


_NO_STORE = (b"cache-control", b"no-store")
_NOSNIFF = (b"x-content-type-options", b"nosniff")

NOT_KEPT: dict[str, str] = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}
"""The headers of every answer that is not the page's (a live stream, a ``204``, a redirect):
no cache keeps it, and no browser reads it as anything but what it says it is (ADR 0159)."""

_COMPACT = {False: _c_encoder(sort_keys=False), True: _c_encoder(sort_keys=True)}


def compact_json(value: Any, *, sort_keys: bool = False) -> str:
    """``json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"),
    sort_keys=sort_keys)``, the same text, without building an encoder per call."""
    encode = _COMPACT[sort_keys]
    if encode is not None:
        try:
            return encode(value)
        except (RecursionError, TypeError):  # a value that holds itself, or one that is not
            pass  # JSON (the encoder has no ``default``): ``json`` says so in its own words
    return json.dumps(
        value, ensure_ascii=False, allow_nan=False, separators=(",", ":"), sort_keys=sort_keys
    )


class JSONResponse(responses.JSONResponse):
    """Starlette's ``JSONResponse``, rendered by :func:`compact_json` (the same bytes), and
    ``Cache-Control: no-store`` unless the route says otherwise: every answer of the API is
    what one key may see at one moment (its role's filter, ADR 0135), never a page a shared
    cache between the client and the daemon may keep and hand to the next caller; and
    ``X-Content-Type-Options: nosniff``, so that no browser runs or renders a body that quotes a
    run (an answer holding markup) as anything but JSON (ADR 0159)."""

    def __init__(
        self,
        content: Any,
        status_code: int = 200,
        headers: Mapping[str, str] | None = None,
        media_type: str | None = None,
        background: BackgroundTask | None = None,
    ) -> None:
        super().__init__(content, status_code, headers, media_type, background)
        if headers is None or not any(k.lower() == "cache-control" for k in headers):
            self.raw_headers.append(_NO_STORE)
        self.raw_headers.append(_NOSNIFF)

    def render(self, content: Any) -> bytes:
        text = compact_json(content)
        try:
            return text.encode("utf-8")
        except UnicodeEncodeError:
            # A lone surrogate (a payload keeps one exactly, ADR 0114), which UTF-8 cannot
            # carry: written as ``\u`` escapes, as the live stream writes it (``codec.dumps``);
            # any JSON reader turns them back into the same text.
            return json.dumps(
                content, ensure_ascii=True, allow_nan=False, separators=(",", ":")
            ).encode("ascii")
