"""Shared HTTP plumbing for adapters: requests, timeouts, retries, and error mapping in one place.

Clients: a transport holds no client of its own. Each request borrows the process's shared client
for its endpoint (:mod:`thoughtgate.providers.clients`) and sends the run's timeouts and headers
(the key among them) with the request, so runs share connection pools and keep-alive connections
while their settings stay their own.

Errors are mapped once, here, from two tables (httpx's ``map_httpcore_exceptions`` is the model:
the most specific row wins):

* :data:`TRANSPORT_ERRORS`: each httpx exception, by the stage it struck in, becomes a
  :class:`~thoughtgate.errors.ProviderError` subclass. Before the first byte of the response
  (connecting, sending, waiting for the status line) nothing has reached the caller, so every
  timeout and connection failure there is retryable; once the body streams, a timeout is a
  :class:`ProviderTimeoutError` and any other failure a cut stream
  (:class:`ProviderStreamError`), neither retried, so output a caller has seen is never repeated.
* :data:`RETRYABLE_STATUSES`: answers with status 408, 409, 429 or 500-599 (529 among them) are
  retried, as the official SDKs retry them. The provider's ``x-should-retry`` header, when it
  sends one, overrides the table either way.

Retries use exponential backoff with jitter, honouring ``retry-after-ms`` / ``retry-after``, up to
``max_retries`` times. Every non-2xx answer becomes a :class:`ProviderHTTPError` carrying the
status, the provider's error type and message, and the request id.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import functools
import json
import random
import time
import weakref
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeAlias

import httpx
import orjson

from thoughtgate.errors import (
    MalformedResponseError,
    ProviderConnectionError,
    ProviderError,
    ProviderHTTPError,
    ProviderStreamError,
    ProviderTimeoutError,
    public_url,
)
from thoughtgate.providers.base import ProviderSettings
from thoughtgate.providers.clients import ProviderClients, shared_clients
from thoughtgate.providers.described import (
    is_field_name,
    measure_of,
    shape_of,
    size_of,
    without_quoted_bytes,
)
from thoughtgate.providers.h11_body import BODY_READS
from thoughtgate.providers.sse import SSEDecoder, SSEEventTooLarge, SSEMessage

__all__ = [
    "RETRYABLE_STATUSES",
    "TRANSPORT_ERRORS",
    "ErrorInfo",
    "ErrorStage",
    "HTTPTransport",
    "error_from_body",
    "error_info",
    "parse_json_event",
    "parse_retry_after",
    "should_retry",
    "stream_error",
    "transport_error",
]

RETRYABLE_STATUSES: frozenset[int] = frozenset({408, 409, 429, *range(500, 600)})
"""Statuses retried when the provider does not say otherwise (``x-should-retry``)."""

ErrorStage: TypeAlias = Literal["request", "body"]
"""``request``: before the first byte of the response; ``body``: while it streams."""

TRANSPORT_ERRORS: Mapping[type[httpx.HTTPError], Mapping[ErrorStage, type[ProviderError]]] = {
    httpx.TimeoutException: {"request": ProviderTimeoutError, "body": ProviderTimeoutError},
    httpx.ConnectError: {"request": ProviderConnectionError, "body": ProviderStreamError},
    httpx.TransportError: {"request": ProviderConnectionError, "body": ProviderStreamError},
    httpx.HTTPError: {"request": ProviderConnectionError, "body": ProviderStreamError},
}
"""httpx exception -> the error it becomes, by stage; the most specific class listed wins."""
_DIGITS = bytes(48 if 48 <= byte <= 57 else 32 for byte in range(256))
"""Every ASCII digit as ``0``, every other byte as a space: a run of digits is a run of zeros."""
_LONG_NUMBER = b"0" * 19
"""19 digits in a row: a number orjson may not read as ``json`` does (see
:func:`parse_json_event`); a scan for it costs a fraction of a regular expression's."""
_BY_JSON = object()
"""Stands for "json decodes this payload" in :func:`parse_json_event`."""
REQUEST_ID_HEADERS = ("request-id", "x-request-id", "openai-request-id", "x-amzn-requestid")


def should_retry(status: int, headers: Mapping[str, str]) -> bool:
    """Whether an answer with ``status`` is retried: the provider's ``x-should-retry`` when it
    sends ``true`` or ``false``, else :data:`RETRYABLE_STATUSES`."""
    verdict = headers.get("x-should-retry")
    if verdict == "true":
        return True
    if verdict == "false":
        return False
    return status in RETRYABLE_STATUSES


async def _body_at_most(response: httpx.Response, limit: int) -> bytes | None:
    """A response's whole (decoded) body, or ``None`` as soon as it passes ``limit`` bytes,
    the rest left unread (the response's close drops the connection): a provider's answer
    that never ends holds no more than that (ADR 0147)."""
    parts: list[bytes] = []
    size = 0
    async for part in response.aiter_bytes():
        size += len(part)
        if size > limit:
            return None
        parts.append(part)
    return b"".join(parts)


def _only_pings(batch: list[SSEMessage]) -> bool:
    return all(message.event == "ping" for message in batch)


class Progress(Protocol):
    """What judges a stream's progress: the parser its events are fed to (ADR 0161)."""

    progress: int
    """Events of a kind the stream's format defines, read so far."""


def transport_error(
    exc: httpx.HTTPError, stage: ErrorStage, *, provider: str, base_url: str
) -> ProviderError:
    """The error an httpx exception becomes (:data:`TRANSPORT_ERRORS`); only the ``request``
    stage is retryable: nothing of the answer has reached the caller yet."""
    kind = next(TRANSPORT_ERRORS[c][stage] for c in type(exc).__mro__ if c in TRANSPORT_ERRORS)
    name = type(exc).__name__
    said = without_quoted_bytes(str(exc)).strip() or None  # httpx's words: the detail (ADR 0071)
    if kind is ProviderTimeoutError:
        message = f"{name}: the provider did not answer in time"
    elif isinstance(exc, httpx.ConnectError):
        message = f"could not connect to {public_url(base_url)} ({name})"  # every reader sees it
    elif kind is ProviderStreamError:
        message = f"the stream was cut: {name}"
    else:
        message = name
    return kind(message, provider=provider, retryable=stage == "request", detail=said)


def parse_retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds from ``retry-after-ms`` / ``retry-after`` (seconds or an HTTP date), if present."""
    ms = headers.get("retry-after-ms")
    if ms:
        with contextlib.suppress(ValueError):
            return max(0.0, float(ms) / 1000)
    raw = headers.get("retry-after")
    if not raw:
        return None
    with contextlib.suppress(ValueError):
        return max(0.0, float(raw))
    try:  # a value that is neither seconds nor a date is no hint (the backoff stands)
        parsed = email.utils.parsedate_to_datetime(raw)
        return max(0.0, parsed.timestamp() - time.time())
    except (ValueError, TypeError, IndexError, OverflowError):
        return None


def _request_id(headers: Mapping[str, str], body: Any = None) -> str | None:
    for name in REQUEST_ID_HEADERS:
        if headers.get(name):
            return headers[name]
    if isinstance(body, Mapping) and isinstance(body.get("request_id"), str):
        return str(body["request_id"])
    return None


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """What a provider's error body says, whatever its shape."""

    message: str
    error_type: str | None = None
    code: str | None = None
    request_id: str | None = None


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, bool) or value == "":
        return None
    return str(value) if isinstance(value, str | int) else None


def error_info(body: Any) -> ErrorInfo:
    """The message, type, code and request id of an error body, read from every shape seen live:

    * Anthropic ``{"type": "error", "error": {"type", "message"}, "request_id"}``;
    * OpenAI ``{"error": {"message", "type", "param", "code"}}``, and the Responses stream's
      ``event: error`` both nested (``{"type": "error", "error": {"type", "code", "message"}}``,
      as the live API sends it) and flat (``{"type": "error", "code", "message"}``, as documented);
    * OpenRouter ``{"error": {"code": 429, "message", "metadata": {"raw", "error_type"}}}``, the
      upstream's own body appended from ``metadata.raw``;
    * flat bodies (``{"message", "type", "code"}``) and a bare ``{"error": "text"}``.
    """
    if not isinstance(body, Mapping):
        text = body if isinstance(body, str) else json.dumps(body)[:500]
        return ErrorInfo(text or "(empty error body)")
    rid = _text(body.get("request_id"))
    err = body.get("error")
    if isinstance(err, str):
        return ErrorInfo(err, request_id=rid)
    if not isinstance(err, Mapping):
        if isinstance(body.get("message"), str):
            etype = _text(body.get("type"))
            if etype == "error":  # a flat Responses error event: the code says what happened
                etype = _text(body.get("code"))
            return ErrorInfo(str(body["message"]), etype, _text(body.get("code")), rid)
        return ErrorInfo(json.dumps(body)[:500], request_id=rid)
    message = str(err.get("message") or json.dumps(err)[:500])
    metadata = err.get("metadata")
    metadata = metadata if isinstance(metadata, Mapping) else {}
    if isinstance(metadata.get("raw"), str):
        # OpenRouter wraps the upstream provider's error body here
        message = f"{message}: {metadata['raw'][:1000]}"
    code = _text(err.get("code"))
    etype = _text(err.get("type")) or _text(metadata.get("error_type")) or code
    return ErrorInfo(message, etype, code, rid or _text(err.get("request_id")))


def stream_error(provider: str, body: Any, *, request_id: str | None = None) -> ProviderStreamError:
    """The error an in-stream error payload (or a 200 body carrying an error) reports."""
    info = error_info(body)
    return ProviderStreamError(
        info.message,
        provider=provider,
        error_type=info.error_type,
        code=info.code,
        request_id=info.request_id or request_id,
        by_provider=True,
    )


def error_from_body(body: Any) -> tuple[str | None, str]:
    """``(error_type, message)`` from any error body (see :func:`error_info`)."""
    info = error_info(body)
    return info.error_type, info.message


def _where(exc: json.JSONDecodeError, text: str | bytes) -> str:
    """Where json stopped in ``text`` and how long ``text`` was: a malformed answer's
    ``detail``, not its public ``error`` (ADR 0169)."""
    return f"line {exc.lineno} column {exc.colno} (char {exc.pos}), in {size_of(text)}"


def _event_named(event: str) -> str:
    """``'content_block_delta' `` for an error's text: a stream's ``event:`` line is the
    provider's text, named only when it looks like a field name (as :func:`shape_of` names
    keys), else left out (ADR 0111)."""
    return f"{event!r} " if is_field_name(event) else ""


def parse_json_event(provider: str, message: SSEMessage) -> dict[str, Any]:
    """Decode one SSE ``data:`` payload, or raise :class:`MalformedResponseError`.

    orjson decodes it (about half ``json``'s CPU per event, ADR 0024). ``json`` decodes what
    orjson would read otherwise: a payload with a run of 19 digits or more (orjson makes integers
    past 64 bits floats) and what orjson refuses (``NaN``, ``Infinity``, lone surrogates). So the
    payloads accepted, their values and the error messages are ``json``'s.
    """
    data = message.data
    try:
        scan = data.encode("utf-8", "surrogatepass").translate(_DIGITS)
        value: Any = orjson.loads(data) if scan.find(_LONG_NUMBER) < 0 else _BY_JSON
    except orjson.JSONDecodeError:
        value = _BY_JSON
    if value is _BY_JSON:
        try:
            value = json.loads(data)
        except json.JSONDecodeError as exc:
            # json's reason is public; where it stopped and the event's length measure the
            # reasoning the event may hold: the developer-only detail (ADR 0169)
            raise MalformedResponseError(
                f"malformed JSON in {_event_named(message.event)}stream event: {exc.msg}",
                provider=provider,
                detail=_where(exc, data),
            ) from exc
        except RecursionError as exc:  # orjson refuses past 1024 levels, json past the stack
            raise MalformedResponseError(
                f"{_event_named(message.event)}stream event is nested too deeply to read",
                provider=provider,
                detail=f"in {size_of(data)}",
            ) from exc
    if not isinstance(value, dict):
        raise MalformedResponseError(
            f"{_event_named(message.event)}stream event is not a JSON object: it is "
            f"{shape_of(value)}",
            provider=provider,
            detail=f"it is {measure_of(value)}",
        )
    return value


@functools.lru_cache(maxsize=256)
def _timeout(read: float, connect: float) -> tuple[httpx.Timeout, tuple[Any, ...]]:
    """A transport's timeouts and their key, made once per pair of values (an adapter, so its
    transport, is built per run; ``httpx.Timeout`` has no mutator)."""
    timeout = httpx.Timeout(read, connect=connect)
    return timeout, tuple(timeout.as_dict().items())


@functools.lru_cache(maxsize=256)
def _parsed_url(url: str) -> httpx.URL:
    """A request URL parsed once: httpx takes a parsed URL as it is and parses a string on every
    request, and an adapter (so its transport) is built per run (``httpx.URL`` is immutable)."""
    return httpx.URL(url)


_encode_json: Callable[[Any], tuple[dict[str, str], httpx.ByteStream]] | None
try:  # httpx's own JSON body encoding (private): the bytes build_request would send
    from httpx._content import encode_json as _encode_json
except ImportError:  # pragma: no cover - another httpx: every request is built by httpx
    _encode_json = None

_TEMPLATES: weakref.WeakKeyDictionary[
    httpx.AsyncClient, dict[tuple[Any, ...], httpx.Headers | None]
] = weakref.WeakKeyDictionary()
"""Per shared client: the headers its ``build_request`` gave a JSON POST to a URL with a
transport's headers and timeout (:func:`_post_request`); ``None`` where they cannot be reused."""
_TEMPLATES_PER_CLIENT = 256


def _post_request(
    client: httpx.AsyncClient,
    url: httpx.URL,
    body: Mapping[str, Any],
    header_items: tuple[tuple[str, str], ...],
    timeout: httpx.Timeout,
    key: tuple[Any, ...],
) -> httpx.Request:
    """``client.build_request("POST", url, json=body, headers=header_items, timeout=timeout)``, the
    same request (method, URL, headers in their order and case, body bytes, extensions) at a
    fraction of the cost.

    Why: an adapter is built per run and sends one request per turn, and ``build_request``
    merges the client's headers with the request's, checks cookies and query parameters and
    validates every header again each time, though only the body and its ``Content-Length``
    change from one request to the next (about 6 % of an adapter's request CPU, ADR 0032). So
    the first request to a URL with given headers and timeout (``key``) is built by httpx and its
    headers are kept; later ones are that copy with their own body (encoded by httpx's own
    ``encode_json``, private: an httpx without it builds every request itself) and length. A
    client with cookies in its jar (the jar adds a ``Cookie`` header) builds every request
    itself; so do requests whose headers are not httpx's usual (a ``Content-Length`` of their
    own). The headers are given as items, made into ``httpx.Headers`` only when httpx builds
    the request.
    """
    if _encode_json is None or client.cookies:
        headers = httpx.Headers(header_items)
        return client.build_request("POST", url, json=body, headers=headers, timeout=timeout)
    templates = _TEMPLATES.get(client)
    if templates is None:
        templates = _TEMPLATES[client] = {}
    if key not in templates:
        headers = httpx.Headers(header_items)
        request = client.build_request("POST", url, json=body, headers=headers, timeout=timeout)
        lengths = request.headers.get_list("content-length")
        if len(templates) >= _TEMPLATES_PER_CLIENT:
            templates.clear()
        usable = "content-length" not in headers and lengths == [str(len(request.content))]
        templates[key] = request.headers.copy() if usable else None
        return request
    template = templates[key]
    if template is None:
        headers = httpx.Headers(header_items)
        return client.build_request("POST", url, json=body, headers=headers, timeout=timeout)
    length, stream = _encode_json(body)
    request = httpx.Request(
        "POST", url, headers=template, stream=stream, extensions={"timeout": timeout.as_dict()}
    )
    request.headers["Content-Length"] = length["Content-Length"]
    request.read()
    return request


class HTTPTransport:
    """One provider's base URL, request headers, timeouts and retry policy; no connection state.

    ``client``: an explicit client this transport uses instead of the shared one, and closes in
    :meth:`aclose` (tests hand one in with a mock transport). ``clients``: the pool to borrow from
    (the process's by default).
    """

    def __init__(
        self,
        provider: str,
        base_url: str,
        headers: Mapping[str, str],
        settings: ProviderSettings,
        *,
        client: httpx.AsyncClient | None = None,
        clients: ProviderClients | None = None,
    ) -> None:
        self.provider = provider
        self.base_url = base_url.rstrip("/")
        self.settings = settings
        self._timeout, timeout_key = _timeout(settings.timeout_s, settings.connect_timeout_s)
        self._own_client = client
        self._clients = clients or shared_clients()
        self._header_items = tuple(headers.items())
        # the headers as given, not httpx's normalized copy: the copy is made only when a request
        # is built by httpx (the first to a URL with these headers), see _post_request
        self._request_key = (self._header_items, timeout_key)
        self.sleep = asyncio.sleep

    @functools.cached_property
    def _headers(self) -> httpx.Headers:
        """The request headers as httpx holds them, made on first use: a run builds its
        transport, yet after the first request of a shared client no request needs them."""
        return httpx.Headers(self._header_items)

    def _client(self) -> httpx.AsyncClient:
        return self._own_client or self._clients.client(self.base_url)

    def url(self, path: str) -> str:
        return f"{self.base_url}/{path.lstrip('/')}"

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, 60.0)
        base: float = min(8.0, 0.5 * 2**attempt)
        return base * (0.5 + random.random() / 2)

    async def _error(self, response: httpx.Response) -> ProviderHTTPError:
        limit = self.settings.max_event_bytes
        raw = await _body_at_most(response, limit)
        body: Any
        if raw is None:  # read no further: its words cannot be worth that much memory
            body = f"an error body longer than {limit} bytes (providers.*.max_event_bytes)"
        else:
            try:
                body = json.loads(raw) if raw else {}
            except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested past the stack
                body = raw.decode("utf-8", errors="replace")[:500]
        info = error_info(body)
        status = response.status_code
        return ProviderHTTPError(
            info.message,
            provider=self.provider,
            status=status,
            error_type=info.error_type,
            code=info.code,
            request_id=_request_id(response.headers, body),
            retryable=should_retry(status, response.headers),
            retry_after=parse_retry_after(response.headers),
            by_provider=True,
        )

    def _transport_error(self, exc: httpx.HTTPError, stage: ErrorStage) -> ProviderError:
        return transport_error(exc, stage, provider=self.provider, base_url=self.base_url)

    @contextlib.asynccontextmanager
    async def open(
        self, path: str, body: Mapping[str, Any], *, stream: bool
    ) -> AsyncIterator[httpx.Response]:
        """POST ``body``; yields a 2xx response whose body has not been read yet.

        Non-2xx answers raise :class:`ProviderHTTPError` (after retries where allowed).
        """
        # The lease keeps the shared client open while this request runs.
        async with self._clients.lease(), self._open(path, body, stream=stream) as response:
            yield response

    @contextlib.asynccontextmanager
    async def _open(
        self, path: str, body: Mapping[str, Any], *, stream: bool
    ) -> AsyncIterator[httpx.Response]:
        attempt = 0
        while True:
            client = self._client()
            try:
                text = self.url(path)
                url = _parsed_url(text)
                if self._own_client is None:  # a shared client: its headers never change
                    request = _post_request(
                        client,
                        url,
                        body,
                        self._header_items,
                        self._timeout,
                        (text, self._request_key),
                    )
                else:
                    request = client.build_request(
                        "POST", url, json=body, headers=self._headers, timeout=self._timeout
                    )
                response = await client.send(request, stream=True)
            except httpx.HTTPError as exc:
                error = self._transport_error(exc, "request")
                if error.retryable and attempt < self.settings.max_retries:
                    await self.sleep(self._backoff(attempt, None))
                    attempt += 1
                    continue
                raise error from exc
            except ProviderError as exc:  # said by the client itself (a SOCKS proxy, no socksio)
                exc.provider = exc.provider or self.provider
                raise
            if response.status_code >= 400:
                http_error = await self._error(response)
                await response.aclose()
                if http_error.retryable and attempt < self.settings.max_retries:
                    await self.sleep(self._backoff(attempt, http_error.retry_after))
                    attempt += 1
                    continue
                raise http_error
            try:
                self._check_content_type(response, stream=stream)
                yield response
            finally:
                await response.aclose()
            return

    def _check_content_type(self, response: httpx.Response, *, stream: bool) -> None:
        ctype = response.headers.get("content-type", "")
        wanted = "text/event-stream" if stream else "application/json"
        if wanted not in ctype:
            raise MalformedResponseError(
                f"expected content-type {wanted}, got {ctype or 'none'!r}",
                provider=self.provider,
                status=response.status_code,
                request_id=_request_id(response.headers),
            )

    async def events(self, response: httpx.Response) -> AsyncIterator[SSEMessage]:
        """SSE messages from a streaming response; transport failures become typed errors."""
        async for batch in self.event_batches(response):
            for message in batch:
                yield message

    async def event_batches(
        self, response: httpx.Response, judge: Progress | None = None
    ) -> AsyncIterator[list[SSEMessage]]:
        """The SSE messages completed by each network read, one list per read.

        Adapters on a hot path consume these to pay the async-iteration cost per read rather than
        per event, and may merge the deltas of one read (they arrived at the same moment).
        ``judge``: the parser the caller feeds each list to before asking for the next; a read
        is progress only if that moved its :attr:`Progress.progress` (without one, any event but
        a ``ping`` is).
        """
        decoder = SSEDecoder(self.settings.max_event_bytes)
        # A body sent as is (no Content-Encoding, the providers' streams) is read raw: httpx's
        # decoding layer would cost an async generator step and two calls per read for nothing;
        # from an HTTP/1.1 connection of the shared clients, past httpx altogether, every chunk
        # one read brought joined into one piece (h11_body, ADR 0024). A body a transport
        # already read whole (a test's canned answer) is served by aiter_bytes.
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        raw = encoding == "identity" and not response.is_stream_consumed
        body = response.extensions.get(BODY_READS) if raw else None
        if body is not None:
            response.is_stream_consumed = True  # httpx's own iterators must not read it again
            reads = body()
        else:
            reads = response.aiter_raw() if raw else response.aiter_bytes()
        # Bytes that complete no event (keep-alive comments, an event trickling in) keep httpx's
        # read timeout from ever firing: ``timeout_s`` of them is a timeout too (ADR 0147). So
        # are reads whose events the parser finds nothing of the turn in: ``ping`` events
        # (Anthropic's keep-alive, an event and not a comment, ADR 0155), event types the format
        # does not define, chunks that carry nothing (ADR 0161). They are passed on
        # first: the parser is what judges them.
        quiet_since: float | None = None
        mark = judge.progress if judge is not None else 0
        try:
            async for chunk in reads:
                batch = decoder.feed(chunk)
                if batch:
                    yield batch
                    if judge is None:
                        if batch[0].event != "ping" or not _only_pings(batch):
                            quiet_since = None
                            continue
                    elif judge.progress != mark:
                        mark = judge.progress
                        quiet_since = None
                        continue
                if quiet_since is None:
                    quiet_since = time.monotonic()
                elif time.monotonic() - quiet_since > self.settings.timeout_s:
                    raise ProviderTimeoutError(
                        f"the stream sent no event for {self.settings.timeout_s:g} s that moved "
                        "the turn on, only keep-alive comments, pings, events of types its format "
                        "does not define or part of an event (providers.*.timeout_s)",
                        provider=self.provider,
                    )
        except httpx.HTTPError as exc:
            raise self._transport_error(exc, "body") from exc
        except SSEEventTooLarge as exc:
            raise MalformedResponseError(
                f"the stream sent an event of more than {exc.limit} bytes without ending it "
                "(providers.*.max_event_bytes)",
                provider=self.provider,
            ) from None
        tail = decoder.flush()
        if tail:
            yield tail

    async def post_json(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """A non-streamed call; returns the decoded JSON object."""
        limit = self.settings.max_event_bytes
        async with self.open(path, body, stream=False) as response:
            try:
                read = await _body_at_most(response, limit)
            except httpx.HTTPError as exc:
                raise self._transport_error(exc, "body") from exc
        if read is None:
            raise MalformedResponseError(
                f"the answer is longer than {limit} bytes (providers.*.max_event_bytes)",
                provider=self.provider,
            )
        raw = read
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise MalformedResponseError(
                f"malformed JSON body: {exc.msg}",
                provider=self.provider,
                detail=_where(exc, raw),
            ) from exc
        except UnicodeDecodeError as exc:  # cut inside a character, or another encoding
            raise MalformedResponseError(
                f"response body is not UTF-8 JSON: {exc.reason}",
                provider=self.provider,
                detail=f"at byte {exc.start}, in {size_of(raw)}",
            ) from exc
        except RecursionError as exc:
            raise MalformedResponseError(
                "response body is nested too deeply to read",
                provider=self.provider,
                detail=f"in {size_of(raw)}",
            ) from exc
        if not isinstance(value, dict):
            raise MalformedResponseError(
                "response body is not a JSON object", provider=self.provider
            )
        return value

    def request_id(self, response: httpx.Response) -> str | None:
        return _request_id(response.headers)

    async def aclose(self) -> None:
        """Close an explicit client; the shared ones belong to the process (see clients)."""
        if self._own_client is not None:
            await self._own_client.aclose()
