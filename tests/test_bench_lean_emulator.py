"""``bench.lean_emulator`` (ADR 0133): the bench's provider emulator without uvicorn and Starlette
per request answers every request byte for byte as ``thoughtgate.testing.emulator`` under
uvicorn and ``bench.emulator_process._paced`` does (apart from the send-time stamp and the ids
both make fresh per request), so what the daemon bench measures against it is the same stream;
the real adapters and the official SDKs read it as they read the ASGI emulator's."""

from __future__ import annotations

import json
import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import anthropic
import openai
import pytest
import uvicorn
from support.bench_modules import bench_package_module

from thoughtgate.engine.turn import stream_llm_turn
from thoughtgate.listening import listen
from thoughtgate.providers.anthropic import AnthropicProvider
from thoughtgate.providers.base import ProviderSettings, ReasoningRequest, TurnRequest
from thoughtgate.providers.openai_compatible import OpenAICompatibleProvider
from thoughtgate.providers.openai_responses import OpenAIResponsesProvider
from thoughtgate.providers.openrouter import OpenRouterProvider
from thoughtgate.types import Message, Turn

pytestmark = pytest.mark.inprocess

_STAMP = re.compile(rb"T\d\d\.\d{4}")
_DATE = re.compile(rb"\r\ndate: [^\r]*\r\n")
_IDS = re.compile(rb'(request-id: req_(?:011Emu)?|"msg_01Emu|"request_id": ?"req_011Emu)[0-9a-f]+')


@pytest.fixture(scope="module")
def modules() -> Iterator[tuple[ModuleType, ModuleType, ModuleType]]:
    with (
        bench_package_module("emulator_process") as process,
        bench_package_module("lean_emulator") as lean,
        bench_package_module("emulator_bench") as load,
    ):
        yield process, lean, load


@pytest.fixture(scope="module")
def asgi_url(modules: tuple[ModuleType, ...]) -> Iterator[str]:
    """The ASGI emulator as the bench served it before ADR 0133: uvicorn, ``_paced``."""
    process = modules[0]
    sockets = listen("127.0.0.1", 0)
    config = uvicorn.Config(
        process._paced(process.bench_emulator().app),
        log_level="warning",
        lifespan="off",
        loop="asyncio",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": sockets}, daemon=True)
    thread.start()
    for _ in range(500):
        if server.started:
            break
        threading.Event().wait(0.01)
    try:
        yield f"http://127.0.0.1:{sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(5)


@pytest.fixture(scope="module")
def lean_url(modules: tuple[ModuleType, ...]) -> Iterator[str]:
    process, lean, _ = modules
    with lean.lean_server(process.bench_emulator()) as server:
        yield server.url


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _request(method: str, path: str, body: bytes = b"", headers: str = "") -> bytes:
    return (
        f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer k\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n{headers}\r\n"
    ).encode() + body


class _Reader:
    """Whole HTTP/1.1 responses off one socket (``Content-Length`` or chunked bodies)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buffer = sock, b""

    def _fill(self) -> bool:
        data = self.sock.recv(65536)
        self.buffer += data
        return bool(data)

    def _until(self, marker: bytes) -> int:
        while (at := self.buffer.find(marker)) < 0:
            if not self._fill():
                raise EOFError(self.buffer)
        return at + len(marker)

    def response(self, head_only: bool = False) -> bytes:
        end = self._until(b"\r\n\r\n")
        head = self.buffer[:end].lower()
        if head_only:
            at = end
        elif b"transfer-encoding: chunked" in head:
            at = end
            while True:
                line_end = self.buffer.find(b"\r\n", at)
                while line_end < 0:
                    self._fill()
                    line_end = self.buffer.find(b"\r\n", at)
                size = int(self.buffer[at:line_end], 16)
                at = line_end + 2 + size + 2
                while len(self.buffer) < at:
                    if not self._fill():
                        raise EOFError(self.buffer)
                if size == 0:
                    break
        else:
            found = re.search(rb"content-length: (\d+)", head)
            at = end + (int(found.group(1)) if found else 0)
            while len(self.buffer) < at:
                if not self._fill():
                    raise EOFError(self.buffer)
        whole, self.buffer = self.buffer[:at], self.buffer[at:]
        return whole

    def closed(self) -> bool:
        return not self._fill() and not self.buffer


def _exchange(url: str, *requests: bytes) -> list[bytes]:
    """Each request in turn on one keep-alive connection; the whole responses."""
    with socket.create_connection(("127.0.0.1", _port(url)), timeout=10) as sock:
        reader = _Reader(sock)
        out = []
        for request in requests:
            sock.sendall(request)
            out.append(reader.response(head_only=request.startswith(b"HEAD ")))
        return out


def _normal(response: bytes) -> bytes:
    """A response without what differs between two answers to one request: its date, the
    send-time stamp, the ids made fresh per request."""
    response = _DATE.sub(b"\r\ndate: *\r\n", response)
    response = _STAMP.sub(b"T*", response)
    return _IDS.sub(lambda m: m.group(1) + b"*", response)


def _cases(load: ModuleType) -> dict[str, bytes]:
    cases = {}
    for fmt, (path, headers, body) in load.REQUESTS.items():
        raw = json.dumps(body).encode()
        cases[fmt] = _request("POST", path, raw, headers)
        unstreamed = json.dumps({**body, "stream": False}).encode()
        cases[f"{fmt}, not streamed"] = _request("POST", path, unstreamed, headers)
    chat = load.REQUESTS["chat"]
    cases.update(
        {
            "not JSON": _request("POST", chat[0], b"{nope"),
            "no such route": _request("POST", "/v1/embeddings", b"{}"),
            "health": _request("GET", "/healthz"),
            "health, HEAD": _request("HEAD", "/healthz"),
            "HTTP/1.0": _request("GET", "/healthz").replace(b"HTTP/1.1", b"HTTP/1.0", 1),
            "GET on a POST route": _request("GET", "/v1/messages"),
            "anthropic without its version": _request(
                "POST", "/v1/messages", json.dumps(load.REQUESTS["anthropic"][2]).encode()
            ),
            "unknown scenario": _request(
                "POST", chat[0], json.dumps(chat[2]).encode(), "x-emulator-scenario: nope\r\n"
            ),
            "unknown flavour": _request(
                "POST", chat[0], json.dumps(chat[2]).encode(), "x-emulator-flavor: nope\r\n"
            ),
            "client closes": _request(
                "POST", chat[0], json.dumps(chat[2]).encode(), "Connection: close\r\n"
            ),
        }
    )
    return cases


def test_every_answer_is_the_asgi_emulators_byte_for_byte(
    modules: tuple[ModuleType, ...], asgi_url: str, lean_url: str
) -> None:
    """Each wire format's stream (the real adapters' own requests), its answer when not
    streamed, and the errors: status line, headers, chunked framing and body alike (the
    date, the send-time stamps and the fresh ids aside)."""
    for name, request in _cases(modules[2]).items():
        for attempt in range(2):  # the first renders, the second replays
            [theirs] = _exchange(asgi_url, request)
            [ours] = _exchange(lean_url, request)
            assert _normal(ours) == _normal(theirs), (name, attempt)
            # the placeholder is stamped where the ASGI emulator stamps it, and left where it is
            assert ours.count(b"T00.0000") == theirs.count(b"T00.0000"), (name, attempt)


def test_one_connection_serves_request_after_request(
    modules: tuple[ModuleType, ...], lean_url: str
) -> None:
    """Keep-alive, and requests sent before the last answer ended (a pipelining client) are
    answered in turn, each with its own stamp and fresh ids."""
    path, headers, body = modules[2].REQUESTS["anthropic"]
    request = _request("POST", path, json.dumps(body).encode(), headers)
    with socket.create_connection(("127.0.0.1", _port(lean_url)), timeout=10) as sock:
        reader = _Reader(sock)
        sock.sendall(request * 3)
        answers = [reader.response() for _ in range(3)]
    assert all(a.startswith(b"HTTP/1.1 200 OK\r\n") for a in answers)
    assert len({_normal(a) for a in answers}) == 1
    ids = {re.search(rb'"msg_01Emu([0-9a-f]+)', a).group(1) for a in answers}  # type: ignore[union-attr]
    assert len(ids) == 3


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"NOT HTTP\r\n\r\n",
        b"POST /v1/chat/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: many\r\n\r\n",
        b"POST /v1/chat/completions HTTP/1.1\r\nno colon\r\n\r\n",
    ],
)
def test_a_request_it_cannot_read_is_a_400_and_closed(lean_url: str, request_bytes: bytes) -> None:
    with socket.create_connection(("127.0.0.1", _port(lean_url)), timeout=10) as sock:
        sock.sendall(request_bytes)
        reader = _Reader(sock)
        answer = reader.response()
        assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n")
        assert reader.closed()


def test_a_built_in_scenario_is_refused_in_the_formats_error_shape(
    modules: tuple[ModuleType, ...], lean_url: str
) -> None:
    """The lean server replays the bench scenario only: a built-in one (whose ``Sleep`` and
    ``Cut`` it would not replay) is a 400 the SDKs read as such, never a wrong stream."""
    for fmt, (path, headers, body) in modules[2].REQUESTS.items():
        asked = headers + "x-emulator-scenario: think-and-answer\r\n"
        [answer] = _exchange(lean_url, _request("POST", path, json.dumps(body).encode(), asked))
        assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n"), fmt
        error = json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
        assert error["type"] == "invalid_request_error" and "bench scenario" in error["message"]


def test_the_trace_records_the_first_deltas_schedule(
    modules: tuple[ModuleType, ...], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``BENCH_TRACE``: one record a request, keyed by the stamp the stream carries, with the
    fields ``bench.first_byte_trace`` reads (as ``_paced`` writes them)."""
    process, lean, load = modules
    monkeypatch.setattr(process, "_TRACE", str(tmp_path))
    monkeypatch.setattr(lean, "_TRACE", str(tmp_path))
    path, headers, body = load.REQUESTS["openrouter"]
    with lean.lean_server(process.bench_emulator()) as server:
        [answer] = _exchange(server.url, _request("POST", path, json.dumps(body).encode(), headers))
    [record] = [json.loads(line) for f in tmp_path.iterdir() for line in f.read_text().splitlines()]
    stamps = set(_STAMP.findall(answer))
    assert stamps == {b"T" + record["key"].encode()}
    fields = {"e_start", "e_due_first", "e_first_written", "e_last_write", "e_terminal", "e_end"}
    assert fields <= set(record)
    assert record["e_start"] < record["e_due_first"] and record["e_terminal"] <= record["e_end"]


# ----------------------------------------------------------------------------- clients


def _turn_shape(turn: Turn) -> tuple[Any, ...]:
    stamp = re.compile(r"T\d\d\.\d{4}")
    return (
        stamp.sub("T*", turn.reasoning_text),
        turn.text,
        turn.usage,
        turn.finish_reason,
        turn.complete,
        [type(p).__name__ for p in turn.parts],
    )


_ADAPTERS: dict[str, tuple[Any, str, str]] = {
    "anthropic": (AnthropicProvider, "claude-sonnet-4-5", ""),
    "chat": (OpenAICompatibleProvider, "deepseek-reasoner", "/v1"),
    "openrouter": (OpenRouterProvider, "qwen/qwen3-235b-a22b-thinking-2507", "/v1"),
    "responses": (OpenAIResponsesProvider, "gpt-5", "/v1"),
}


async def _adapter_turn(url: str, fmt: str) -> Turn:
    cls, model, path = _ADAPTERS[fmt]
    provider = cls(model, ProviderSettings(base_url=url + path, api_key="k"))
    try:
        request = TurnRequest([Message.user("bench")], reasoning=ReasoningRequest(True))
        return await stream_llm_turn(provider, request)
    finally:
        await provider.aclose()


@pytest.mark.parametrize("fmt", list(_ADAPTERS))
async def test_each_adapter_reads_the_same_turn_from_both(
    fmt: str, asgi_url: str, lean_url: str
) -> None:
    ours = await _adapter_turn(lean_url, fmt)
    assert ours.complete and ours.text.startswith("word000 ")
    assert re.match(r"T\d\d\.\d{4}", ours.reasoning_text) or fmt == "responses"
    assert _turn_shape(ours) == _turn_shape(await _adapter_turn(asgi_url, fmt))


async def test_the_official_sdks_read_what_the_adapters_read(lean_url: str) -> None:
    """``anthropic`` and ``openai`` parse each stream whole and see the adapters' texts."""
    stamp = re.compile(r"T\d\d\.\d{4}")
    with anthropic.Anthropic(base_url=lean_url, api_key="k", max_retries=0) as claude:
        thinking, text = [], []
        with claude.messages.stream(
            model="claude-sonnet-4-5",
            max_tokens=8192,
            thinking={"type": "enabled", "budget_tokens": 4096},
            messages=[{"role": "user", "content": "bench"}],
        ) as stream:
            for event in stream:
                if event.type == "thinking":
                    thinking.append(event.thinking)
                elif event.type == "text":
                    text.append(event.text)
            assert stream.get_final_message().stop_reason == "end_turn"
    turn = await _adapter_turn(lean_url, "anthropic")
    assert (stamp.sub("", "".join(thinking)), "".join(text)) == (
        stamp.sub("", turn.reasoning_text),
        turn.text,
    )
    sdk = openai.OpenAI(base_url=lean_url + "/v1", api_key="k", max_retries=0)
    try:
        for fmt, field in (("chat", "reasoning_content"), ("openrouter", "reasoning")):
            model = _ADAPTERS[fmt][1]
            extra = {"reasoning": {"enabled": True}} if fmt == "openrouter" else {}
            reasoning, content = [], []
            for chunk in sdk.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": "bench"}],
                stream=True,
                stream_options={"include_usage": True},
                extra_body=extra,
            ):
                for choice in chunk.choices:
                    piece = (choice.delta.model_extra or {}).get(field)
                    reasoning.append(piece if isinstance(piece, str) else "")
                    content.append(choice.delta.content or "")
            turn = await _adapter_turn(lean_url, fmt)
            assert (stamp.sub("", "".join(reasoning)), "".join(content)) == (
                stamp.sub("", turn.reasoning_text),
                turn.text,
            ), fmt
        with sdk.responses.stream(
            model="gpt-5",
            input=[{"role": "user", "content": "bench"}],
            reasoning={"summary": "auto"},
            store=False,
        ) as events:
            text = [e.delta for e in events if e.type == "response.output_text.delta"]
            assert events.get_final_response().status == "completed"
        assert "".join(text) == (await _adapter_turn(lean_url, "responses")).text
    finally:
        sdk.close()


def test_a_client_whose_requests_vary_is_told_its_figures_carry_the_renders(
    modules: tuple[ModuleType, ...],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A client sending the same request is answered from what was rendered once, silently; one
    whose bodies vary per request (an id, a time) makes every answer a render, three times the
    ASGI emulator's CPU on the bench's shared cores -- said on stderr, so a comparison with that
    client is not read as fair without a look."""
    process, lean, load = modules
    monkeypatch.setattr(lean, "_MANY", 4)
    path, headers, body = load.REQUESTS["chat"]
    same = _request("POST", path, json.dumps(body).encode(), headers)
    with lean.lean_server(process.bench_emulator()) as server:
        _exchange(server.url, *[same] * 6)
        assert "distinct requests rendered" not in capsys.readouterr().err
        varying = [
            _request("POST", path, json.dumps({**body, "user": f"u{i}"}).encode(), headers)
            for i in range(4)
        ]
        _exchange(server.url, *varying)
    assert "4 distinct requests rendered" in capsys.readouterr().err
