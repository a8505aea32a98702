"""The one HTTP adapter: a wire format's parser driven over one endpoint's transport.

Every HTTP adapter is an :class:`HTTPProvider`: it resolves its endpoint (base URL, key, headers,
endpoint rule) from the :class:`~thoughtgate.providers.registry.Endpoint` profile, owns the
:class:`~thoughtgate.providers.http.HTTPTransport`, and implements ``stream``, ``request`` and
``aclose`` once. A wire format module (Anthropic Messages, Chat Completions, OpenAI Responses)
only says what the request body is (``build_body``), where it goes (``path``) and how its answers
are read (a :class:`WireParser`).

A :class:`WireParser` reads one response, in one of two ways, and emits normalized chunks for the
shared :class:`~thoughtgate.types.TurnAccumulator`:

* streamed: :meth:`~WireParser.feed` with the SSE messages of each network read (their text and
  reasoning deltas come out joined, one delta per part: :func:`joined_deltas`), then
  :meth:`~WireParser.end` when the body ends;
* whole: :meth:`~WireParser.whole` with the decoded JSON body, then :meth:`~WireParser.end`;

so streamed and non-streamed turns go through the same rules and give identical records. Errors
never lose chunks: ``feed`` and ``whole`` return what came before a problem and leave the problem
in :attr:`~WireParser.failure` (raised by the adapter at once: a malformed event, an Anthropic
``error`` event); an error the provider reported in a stream that goes on (Chat Completions,
Responses) is raised by ``end`` once the body has been read to its end. When the stream breaks,
:meth:`~WireParser.interrupted` releases what open blocks still hold (a tool call's argument
fragments) into the partial turn.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, ClassVar, Protocol

import httpx

from thoughtgate.errors import (
    MalformedResponseError,
    ProviderError,
    ProviderStreamError,
    ProviderTimeoutError,
)
from thoughtgate.providers.base import Capabilities, ProviderSettings, ServerInfo, TurnRequest
from thoughtgate.providers.base import server_info as _server_info
from thoughtgate.providers.endpoints import (
    adapter_options,
    endpoint_headers,
    resolve_api_key,
    resolve_base_url,
    resolve_endpoint_rule,
)
from thoughtgate.providers.http import HTTPTransport, parse_json_event
from thoughtgate.providers.registry import Endpoint
from thoughtgate.providers.rules import EndpointRule
from thoughtgate.providers.sse import SSEMessage
from thoughtgate.providers.think_tags import (
    Delimiters,
    ThinkTags,
    check_think_delimiters,
    check_think_tags,
    think_delimiters_for,
    vendor_think_tags,
)
from thoughtgate.types import (
    Chunk,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    Turn,
    TurnAccumulator,
)

__all__ = [
    "FollowUp",
    "HTTPProvider",
    "JSONEventParser",
    "VendorFormatProvider",
    "WireParser",
    "joined_deltas",
    "output_chars",
]


class WireParser(Protocol):
    """One response of one wire format in, normalized chunks out (see the module docstring)."""

    failure: ProviderError | None
    """A problem that ends the response now; the chunks before it were returned."""

    progress: int
    """How many events of a kind its format defines (content, structure, the end, an error)
    this parser has read: a read that moves it is progress; keep-alives and event types the
    format does not define are not (ADR 0161)."""

    @property
    def finished(self) -> bool:
        """The turn arrived whole: a connection lost after this point lost nothing."""
        ...

    def feed(self, events: Sequence[SSEMessage]) -> list[Chunk]:
        """Chunks for the SSE messages of one network read."""
        ...

    def whole(self, body: Mapping[str, Any]) -> list[Chunk]:
        """Chunks for a whole non-streamed answer, in the order a stream would give them."""
        ...

    def end(self) -> list[Chunk]:
        """The body ended: the last chunks, or the error the response reported or that its early
        end means (a stream cut before its terminal event)."""
        ...

    def interrupted(self) -> list[Chunk]:
        """The stream broke: what the open blocks still hold."""
        ...


def joined_deltas(chunks: list[Chunk]) -> list[Chunk]:
    """``chunks`` with every run of consecutive plain deltas of one part joined into one delta.

    Why: the deltas of one network read arrived at the same moment, so a reader cannot tell them
    apart, yet each chunk costs the agent loop, the accumulator and the recorder a step of their
    own. Joined, a read costs those steps once per part (the Anthropic parser does the same while
    it reads). Only text and reasoning deltas that carry nothing but text join: a signature, a
    redaction, a change of part or of reasoning kind, or any other chunk in between ends the
    run, so the text of every part, the order of parts and where each part starts are those of
    the chunks one by one, and the turn they accumulate to is the same.
    """
    if len(chunks) < 2:
        return chunks
    out: list[Chunk] = []
    pieces: list[str] = []
    for chunk in chunks:
        last = out[-1] if out else None
        if (type(chunk) is TextDelta and type(last) is TextDelta and chunk.index == last.index) or (
            type(chunk) is ReasoningDelta
            and type(last) is ReasoningDelta
            and chunk.index == last.index
            and chunk.reasoning_kind == last.reasoning_kind
            and chunk.signature is None
            and last.signature is None
            and not chunk.redacted
            and not last.redacted
        ):
            if not pieces:
                pieces.append(last.text)
            pieces.append(chunk.text)
            continue
        if pieces:
            out[-1] = _with_text(out[-1], "".join(pieces))
            pieces = []
        out.append(chunk)
    if pieces:
        out[-1] = _with_text(out[-1], "".join(pieces))
    return out


def output_chars(chunks: list[Chunk]) -> int:
    """The characters of text, reasoning and tool-call arguments ``chunks`` add to a turn: what
    its record grows by. Characters, not bytes: ``len`` of a string costs nothing, its UTF-8
    length an encoding."""
    total = 0
    for chunk in chunks:
        kind = type(chunk)
        if kind is TextDelta or kind is ReasoningDelta:
            total += len(chunk.text)  # type: ignore[union-attr]
        elif kind is ToolCallDelta:
            total += len(chunk.arguments_delta)  # type: ignore[union-attr]
    return total


def output_bound_error(most_chars: int, provider: str, after: str) -> ProviderStreamError:
    """The turn's output passed ``providers.*.max_turn_output_chars`` (ADR 0155); ``after``
    says what became of the rest."""
    return ProviderStreamError(
        f"the turn's output passed {most_chars} characters "
        f"(providers.*.max_turn_output_chars); {after}",
        provider=provider,
    )


def deadline_error(settings: ProviderSettings, provider: str, after: str) -> ProviderTimeoutError:
    """The turn went on past ``providers.*.turn_timeout_s`` (ADR 0155)."""
    return ProviderTimeoutError(
        f"the turn went on past {settings.turn_timeout_s:g} s "
        f"(providers.*.turn_timeout_s); {after}",
        provider=provider,
    )


def _with_text(delta: Chunk, text: str) -> Chunk:
    if isinstance(delta, TextDelta):
        return TextDelta(text, index=delta.index)
    assert isinstance(delta, ReasoningDelta)
    return ReasoningDelta(text, reasoning_kind=delta.reasoning_kind, index=delta.index)


class JSONEventParser:
    """The streamed half of a parser whose events each carry one JSON object (Chat Completions,
    Responses): the stream is read to its end, what follows the turn's end is read and ignored
    (so the connection ends cleanly), and a malformed event stops the response. The deltas of
    one network read are joined per part (:func:`joined_deltas`)."""

    provider: str
    done: bool
    failure: ProviderError | None
    progress: int

    def feed(self, events: Sequence[SSEMessage]) -> list[Chunk]:
        out: list[Chunk] = []
        for message in events:
            if self.done:
                continue
            data = message.data.strip()
            if not data:
                continue
            if data == "[DONE]":
                self.progress += 1
                out += self.done_marker()
                continue
            try:
                out += self.feed_event(parse_json_event(self.provider, message))
            except MalformedResponseError as exc:
                self.failure = exc
                break
        return joined_deltas(out)

    def done_marker(self) -> list[Chunk]:
        """``data: [DONE]``: what it means in this format."""
        raise NotImplementedError

    def feed_event(self, event: Mapping[str, Any]) -> list[Chunk]:
        """One decoded event."""
        raise NotImplementedError

    def interrupted(self) -> list[Chunk]:
        """Deltas are emitted as they arrive: nothing is held back."""
        return []


FollowUp = tuple[dict[str, Any], WireParser]
"""The next request of the same turn and the parser of its answer (Anthropic ``pause_turn``)."""


class HTTPProvider:
    """A wire format bound to an endpoint and a model, over HTTP (the ``Provider`` protocol).

    Subclasses name their :attr:`endpoint` and implement :meth:`build_body`, :meth:`parser`,
    :meth:`wire_path` and :meth:`wire_capabilities`; a wire format whose turn can take several
    requests overrides :meth:`follow_up`.

    ``client``: an explicit ``httpx.AsyncClient`` the transport uses (and closes) instead of the
    process's shared one (tests hand one in with a replay transport).
    """

    endpoint: ClassVar[Endpoint]
    version_headers: ClassVar[Mapping[str, str]] = {}
    """Headers the wire format always sends (Anthropic's ``anthropic-version``)."""

    def __init__(
        self,
        model: str,
        settings: ProviderSettings | None = None,
        *,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        endpoint = self.endpoint
        self.name: str = endpoint.name
        self.model = model
        self.settings = settings = settings or ProviderSettings()
        self.read_options(adapter_options(settings))
        api_key = resolve_api_key(settings, endpoint)
        base_url = resolve_base_url(settings, endpoint)
        assert endpoint.rules is not None, "an HTTP endpoint names its rule table"
        self.rule: EndpointRule = resolve_endpoint_rule(settings, endpoint.rules, model, base_url)
        headers = endpoint_headers(endpoint, api_key, settings, **self.version_headers)
        self.transport = HTTPTransport(endpoint.name, base_url, headers, settings, client=client)
        self.path = self.wire_path(base_url)
        self.capabilities: Capabilities = self.wire_capabilities()

    # -- what a wire format supplies

    def read_options(self, options: Mapping[str, Any]) -> None:
        """Take the adapter options (``extra["thoughtgate"]``) this adapter reads beyond the
        endpoint's own (``server``, ``rules``, ``headers``)."""

    def wire_path(self, base_url: str) -> str:
        raise NotImplementedError

    def wire_capabilities(self) -> Capabilities:
        raise NotImplementedError

    def build_body(self, request: TurnRequest, *, stream: bool) -> dict[str, Any]:
        """The exact JSON body sent for ``request``."""
        raise NotImplementedError

    def parser(self, request: TurnRequest) -> WireParser:
        """A fresh parser for one answer to ``request``."""
        raise NotImplementedError

    def follow_up(
        self, request: TurnRequest, body: Mapping[str, Any], parser: WireParser
    ) -> FollowUp | None:
        """The next request of this turn after a complete answer, or ``None`` (the usual case)."""
        return None

    # -- the Provider protocol, once for every wire format

    async def stream(self, request: TurnRequest) -> AsyncIterator[Chunk]:
        body = self.build_body(request, stream=True)
        parser = self.parser(request)
        transport = self.transport
        # A provider that keeps streaming real events (deltas, pings) resets every read and
        # no-event timeout: the turn's own bounds end it, checked once per network read
        # (ADR 0155). What a read brought is passed on before the check fails the turn.
        settings = self.settings
        most_chars = settings.max_turn_output_chars
        deadline = time.monotonic() + settings.turn_timeout_s if settings.turn_timeout_s else 0.0
        output = 0
        while True:
            # Each answer is read here, not in a generator of its own: every chunk would pass
            # one more async generator on its way out.
            async with transport.open(self.path, body, stream=True) as response:
                request_id = transport.request_id(response)
                try:
                    async for batch in transport.event_batches(response, parser):
                        chunks = parser.feed(batch)
                        for chunk in chunks:
                            yield chunk
                        if parser.failure is not None:
                            raise parser.failure
                        if most_chars:
                            output += output_chars(chunks)
                            if output > most_chars:
                                raise output_bound_error(
                                    most_chars, self.name, "the stream was closed"
                                )
                        if deadline and time.monotonic() > deadline:
                            raise deadline_error(settings, self.name, "the stream was closed")
                    for chunk in parser.end():
                        yield chunk
                except ProviderError as exc:
                    if exc.request_id is None:
                        exc.request_id = request_id
                    if not parser.finished:
                        for chunk in parser.interrupted():
                            yield chunk
                        raise
                    # the connection dropped after the turn was complete: nothing was lost
            step = self.follow_up(request, body, parser)
            if step is None:
                return
            body, parser = step

    async def request(self, request: TurnRequest) -> Turn:
        body = self.build_body(request, stream=False)
        parser = self.parser(request)
        acc = TurnAccumulator(provider=self.name, model=self.model)
        # A non-streamed turn has the bounds of a streamed one (ADR 0161): the deadline
        # covers its requests, their retries and the reading of their bodies (a body that
        # trickles in resets every read timeout), so it is a timer, not a check per read; each
        # body is bounded in bytes as it is read (``max_event_bytes``) and its output in
        # characters once decoded, what came before the bound kept as the partial.
        settings = self.settings
        most_chars = settings.max_turn_output_chars
        output = 0
        bound = asyncio.timeout(settings.turn_timeout_s or None)
        try:
            async with bound:
                while True:
                    data = await self.transport.post_json(self.path, body)
                    for chunk in parser.whole(data):
                        acc.feed(chunk)
                        if most_chars:
                            output += output_chars([chunk])
                            if output > most_chars:
                                raise output_bound_error(
                                    most_chars, self.name, "the rest of the answer was dropped"
                                )
                    if parser.failure is not None:
                        raise parser.failure
                    acc.feed_all(parser.end())
                    step = self.follow_up(request, body, parser)
                    if step is None:
                        return acc.finish()
                    body, parser = step
        except TimeoutError:
            if not bound.expired():
                raise
            error = deadline_error(settings, self.name, "the answer was not read to its end")
            error.partial = acc.partial()
            raise error from None
        except ProviderError as exc:
            # an earlier answer of the turn (a ``pause_turn`` continuation's) is kept too
            exc.partial = acc.partial()
            raise

    @property
    def server(self) -> ServerInfo:
        """The host, port and recognised server this adapter talks to (for telemetry)."""
        return _server_info(self.transport.base_url, self.rule.server)

    async def aclose(self) -> None:
        await self.transport.aclose()


class VendorFormatProvider(HTTPProvider):
    """An adapter of a vendor's wire format that other servers serve too (Anthropic Messages,
    OpenAI Responses): its ``think_tags`` option is ``off`` by default on the vendor's own API --
    the server named like the endpoint (``anthropic``, ``openai``) -- and ``leading`` on any
    other, where a model without a reasoning parser writes ``<think>`` into its answer (ADR 0077).
    """

    def read_options(self, options: Mapping[str, Any]) -> None:
        self._think_tags: object = options.get("think_tags")
        check_think_tags(self._think_tags)  # a value it cannot read: refused now
        check_think_delimiters(options.get("think_delimiters"))
        self.think_delimiters: Delimiters | None = think_delimiters_for(
            options.get("think_delimiters"), self.model
        )
        """The reasoning block's spelling the operator named for this model (ADR 0157)."""

    @property
    def think_tags(self) -> ThinkTags:
        """The ``think_tags`` mode for this model on this server."""
        return vendor_think_tags(
            self._think_tags, self.model, server=self.rule.server, vendor=self.name
        )
