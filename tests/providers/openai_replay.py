"""Replay recorded wire transcripts through the real httpx client, in any chunking.

A :class:`Replay` is an ``httpx.MockTransport`` that answers every request with one transcript,
streamed in the byte chunks a test chooses (whole, one byte at a time, random sizes). Each served
body remembers how far it was read; :meth:`Replay.assert_fully_read` fails a test that left part
of a transcript unread. ``cut_after`` turns the body into a connection that drops mid-way.
"""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from thoughtgate.engine.turn import stream_llm_turn
from thoughtgate.providers.base import ProviderSettings, ReasoningRequest, ToolSpec, TurnRequest
from thoughtgate.types import Message, ToolResultPart, Turn

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"

CHUNKINGS = ("whole", "bytes", "random")


def fixture(relative: str) -> bytes:
    return (FIXTURES / relative).read_bytes()


def chunk_sizes(kind: str, total: int, seed: int = 7) -> list[int]:
    if kind == "whole":
        return [max(1, total)]
    if kind == "bytes":
        return [1] * total
    rng = random.Random(seed)
    sizes: list[int] = []
    while sum(sizes) < total:
        sizes.append(rng.randint(1, 97))
    return sizes


class ChunkedBody(httpx.AsyncByteStream):
    """A response body served in fixed chunks; records how much of it was read."""

    def __init__(self, data: bytes, sizes: list[int], *, cut_after: int | None = None) -> None:
        self.data = data
        self.sizes = sizes
        self.cut_after = cut_after
        self.sent = 0
        self.exhausted = False

    def _pieces(self) -> Iterator[bytes]:
        pos = 0
        for size in self.sizes:
            if pos >= len(self.data):
                break
            yield self.data[pos : pos + size]
            pos += size
        if pos < len(self.data):
            yield self.data[pos:]

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for piece in self._pieces():
            if self.cut_after is not None and self.sent + len(piece) > self.cut_after:
                head = piece[: self.cut_after - self.sent]
                if head:
                    self.sent += len(head)
                    yield head
                raise httpx.RemoteProtocolError(
                    "peer closed connection without sending complete message body"
                )
            self.sent += len(piece)
            yield piece
        self.exhausted = True

    async def aclose(self) -> None:
        return None


class Replay:
    """Answers every request with ``data`` (status, content type and headers as given)."""

    def __init__(
        self,
        data: bytes,
        *,
        chunking: str = "whole",
        status: int = 200,
        content_type: str = "text/event-stream; charset=utf-8",
        headers: dict[str, str] | None = None,
        cut_after: int | None = None,
        seed: int = 7,
    ) -> None:
        self.data = data
        self.chunking = chunking
        self.status = status
        self.content_type = content_type
        self.headers = {"x-request-id": "req_replay_0001", **(headers or {})}
        self.cut_after = cut_after
        self.seed = seed
        self.requests: list[Any] = []
        self.bodies: list[ChunkedBody] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(json.loads(request.content or b"null"))
        body = ChunkedBody(
            self.data,
            chunk_sizes(self.chunking, len(self.data), self.seed),
            cut_after=self.cut_after,
        )
        self.bodies.append(body)
        headers = {"content-type": self.content_type, **self.headers}
        return httpx.Response(self.status, headers=headers, stream=body)

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(self.handler))

    def assert_fully_read(self, *, to_eof: bool = True) -> None:
        """Every byte was pulled by the client; with ``to_eof`` it also read on to the end of the
        body (an adapter that stops at ``[DONE]`` or ``response.completed`` fails this)."""
        assert self.bodies, "no request was made"
        for body in self.bodies:
            unread = len(body.data) - body.sent
            assert unread == 0, f"transcript left unread: {body.sent}/{len(body.data)} bytes read"
            assert body.exhausted or not to_eof, "the client stopped before the end of the body"


def settings(*, max_retries: int = 0, **extra: Any) -> ProviderSettings:
    return ProviderSettings(
        base_url="http://replay.invalid/v1", api_key="sk-test", max_retries=max_retries, extra=extra
    )


def make(cls: Callable[..., Any], model: str, replay: Replay, **extra: Any) -> Any:
    """An adapter wired to a replay transport."""
    return cls(model, settings(**extra), client=replay.client())


TOOLS = (
    ToolSpec("get_country", "The user's country", {"type": "object", "properties": {}}),
    ToolSpec(
        "largest_city",
        "Largest city of a country",
        {"type": "object", "properties": {"country": {"type": "string"}}},
    ),
)


def turn_request(
    mode: str = "surface",
    messages: list[Message] | None = None,
    *,
    tools: bool = False,
    **reasoning: Any,
) -> TurnRequest:
    """A request for a disclosure mode (``hidden`` / ``surface`` / ``telemetry_only``)."""
    return TurnRequest(
        messages or [Message.user("Why is the sky blue?")],
        tools=TOOLS if tools else (),
        reasoning=ReasoningRequest.for_mode(mode, **reasoning),
    )


async def streamed(provider: Any, request: TurnRequest) -> Turn:
    return await stream_llm_turn(provider, request)


async def run_tool_loop(provider: Any, *, mode: str = "surface", turns: int = 4) -> list[Turn]:
    """Drive the emulator's ``tool-loop`` scenario the way the agent loop does."""
    history: list[Message] = [Message.user("What is the largest city in my country?")]
    done: list[Turn] = []
    for _ in range(turns):
        turn = await stream_llm_turn(provider, turn_request(mode, history, tools=True))
        done.append(turn)
        if not turn.tool_calls:
            break
        results = tuple(ToolResultPart(c.call_id, "Mexico", name=c.name) for c in turn.tool_calls)
        history += [turn.as_message(), Message("tool", results)]
    return done
