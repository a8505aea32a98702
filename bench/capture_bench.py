"""CPU cost of capturing one Anthropic thinking stream, against reading the same bytes raw.

One stream of about 2,000 ``thinking_delta`` and 500 ``text_delta`` events (with the real API's
padding, ping and signature) is served by a loopback HTTP server running in a *separate process*,
so the CPU time measured here (``time.process_time``) is the consumer's alone. Every consumer reads
the same bytes from the same server:

* ``raw``: httpx (async) ``aiter_raw`` over the body, doing nothing with it (the floor);
* ``thoughtgate``: the Anthropic adapter through ``stream_llm_turn`` into a finished turn;
* ``anthropic-sdk``: the official SDK's ``messages.stream`` up to ``get_final_message``;
* ``litellm``: measured when ``import litellm`` works, else reported as not installed.

Two chunkings: one SSE event per HTTP chunk, and the byte stream cut into 4 KB chunks. Each
measurement is the minimum over several runs. Linearity: a stream with 10x the events must cost at
most 11x the CPU. A plot series (``capture-cost``) gives each consumer's CPU time against stream
length (250 to 10,000 events, one event per chunk). ``litellm`` is the library (the ``bench``
extra); its proxy cannot be installed beside thoughtgate (``litellm[proxy]`` 1.79 pins
uvicorn<0.30). Run ``python -m bench.capture_bench`` (``--quick``: one round, no series);
``main()`` returns the result rows.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import httpx

from bench.emulator_process import stop
from bench.environment import LOOPBACK, child_env, free_port
from thoughtgate.engine.turn import stream_llm_turn
from thoughtgate.providers.anthropic import AnthropicProvider
from thoughtgate.providers.base import ProviderSettings, ReasoningRequest, TurnRequest
from thoughtgate.providers.clients import shared_clients
from thoughtgate.types import Message

THINKING_DELTAS = 2000
TEXT_DELTAS = 500
SERIES_SCALES = (0.1, 0.4, 1, 4)  # 250, 1,000, 2,500 and 10,000 deltas
SERIES_REPEATS = {"litellm": 1}  # its CPU time is ~100x raw: noise is small next to it
NOTES = [
    "litellm is the `litellm==1.79.*` library (`acompletion`, streaming); `litellm[proxy]` "
    "cannot be installed beside thoughtgate (it pins uvicorn<0.30, thoughtgate needs >=0.30)."
]
RATIO_TARGET = 4.0
LINEARITY_TARGET = 11.0
REPEATS = 7
CHUNKINGS = ("event", "4k")

Row = dict[str, Any]


# --------------------------------------------------------------------------- the stream


def stream_bytes(scale: float = 1) -> bytes:
    """An Anthropic stream in the real byte shape with ``scale`` times the usual deltas."""
    pad_cycle = [15, 13, 0, 9, 11, 4, 2, 10, 3, 7, 1, 12, 6, 14, 5, 8]
    count = 0

    def event(name: str, data: dict[str, Any]) -> str:
        nonlocal count
        count += 1
        text = json.dumps(data, separators=(",", ":"))
        return f"event: {name}\ndata: {text[:-1]}{' ' * pad_cycle[count % 16]}}}\n\n"

    def delta(index: int, body: dict[str, Any]) -> str:
        return event(
            "content_block_delta", {"type": "content_block_delta", "index": index, "delta": body}
        )

    words = ["The", " user", " asks", " about", " tides;", " the", " moon's", " gravity", " pulls"]
    out = [
        event(
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "model": "claude-sonnet-4-5-20250929",
                    "id": "msg_01Bench",
                    "type": "message",
                    "role": "assistant",
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {"input_tokens": 50, "output_tokens": 1},
                },
            },
        ),
        event(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "thinking", "thinking": "", "signature": ""},
            },
        ),
        'event: ping\ndata: {"type": "ping"}\n\n',
    ]
    for i in range(int(THINKING_DELTAS * scale)):
        out.append(delta(0, {"type": "thinking_delta", "thinking": words[i % 9] + f" {i}"}))
    out.append(delta(0, {"type": "thinking_delta", "thinking": ""}))
    out.append(delta(0, {"type": "signature_delta", "signature": "EqQBCkYIBxgCKkB" + "x" * 300}))
    out.append(event("content_block_stop", {"type": "content_block_stop", "index": 0}))
    out.append(
        event(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 1,
                "content_block": {"type": "text", "text": ""},
            },
        )
    )
    for i in range(int(TEXT_DELTAS * scale)):
        out.append(delta(1, {"type": "text_delta", "text": words[i % 9] + " ok"}))
    out.append(event("content_block_stop", {"type": "content_block_stop", "index": 1}))
    out.append(
        event(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": int(9000 * scale)},
            },
        )
    )
    out.append('event: message_stop\ndata: {"type":"message_stop"}\n\n')
    return "".join(out).encode()


def chunked(data: bytes, chunking: str) -> list[bytes]:
    if chunking == "event":
        pieces = data.split(b"\n\n")
        return [p + b"\n\n" for p in pieces[:-1]]
    return [data[i : i + 4096] for i in range(0, len(data), 4096)]


def http_body(pieces: list[bytes]) -> bytes:
    """Chunked transfer encoding: each piece is one HTTP chunk the consumer reads on its own."""
    framed = [f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in pieces if p]
    return b"".join(framed) + b"0\r\n\r\n"


# --------------------------------------------------------------------------- the server process


def serve(port: int) -> None:
    """Run the bench server (in its own process: see :func:`server_process`)."""
    payloads = {
        f"{chunking}-{scale:g}": http_body(chunked(stream_bytes(scale), chunking))
        for chunking in CHUNKINGS
        for scale in sorted({1, 10, *SERIES_SCALES})
    }
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
        b"request-id: req_bench\r\ntransfer-encoding: chunked\r\n\r\n"
    )

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                request = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                headers = {}
                for line in request.split("\r\n")[1:]:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
                await reader.readexactly(int(headers.get("content-length", "0")))
                writer.write(head + payloads[headers["x-bench-payload"]])
                await writer.drain()
        writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, LOOPBACK, port)
        print("ready", flush=True)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


@contextlib.contextmanager
def server_process() -> Iterator[str]:
    """The bench server in a child process, so its CPU time is not counted as the consumer's."""
    port = free_port()
    env = child_env()
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.capture_bench", "--serve", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        if process.stdout.readline().strip() != "ready":
            raise RuntimeError("the bench server did not start")
        yield f"http://{LOOPBACK}:{port}"
    finally:
        stop(process, grace_s=5)


# --------------------------------------------------------------------------- consumers

Consumer = Callable[[str], Awaitable[None]]


async def cpu_seconds(
    runs: dict[str, tuple[Consumer, str]], repeats: int = REPEATS
) -> dict[str, float]:
    """Minimum process CPU time of each ``(consumer, payload)`` over ``repeats`` rounds.

    The consumers take turns within each round, so a change in machine load between them
    cannot skew their ratio.
    """
    for consume, payload in runs.values():
        await consume(payload)  # warm-up: connections, imports, caches
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(repeats):
        for name, (consume, payload) in runs.items():
            start = time.process_time()
            await consume(payload)
            best[name] = min(best[name], time.process_time() - start)
    return best


def raw_consumer(url: str) -> tuple[Consumer, Callable[[], Awaitable[None]]]:
    client = httpx.AsyncClient(timeout=60)

    async def consume(payload: str) -> None:
        headers = {"x-bench-payload": payload}
        async with client.stream("POST", url + "/v1/messages", json={}, headers=headers) as r:
            async for _ in r.aiter_raw():
                pass

    return consume, client.aclose


REQUEST = TurnRequest([Message.user("Tides?")], reasoning=ReasoningRequest(True), max_tokens=1024)


def thoughtgate_consumer(url: str) -> tuple[Consumer, Callable[[], Awaitable[None]]]:
    providers: dict[str, AnthropicProvider] = {}

    def provider(payload: str) -> AnthropicProvider:
        if payload not in providers:
            settings = ProviderSettings(
                base_url=url,
                api_key="bench",
                extra={"thoughtgate": {"headers": {"x-bench-payload": payload}}},
            )
            providers[payload] = AnthropicProvider("claude-sonnet-4-5", settings)
        return providers[payload]

    async def consume(payload: str) -> None:
        turn = await stream_llm_turn(provider(payload), REQUEST)
        assert turn.complete and turn.reasoning_text and turn.text

    async def close() -> None:
        for p in providers.values():
            await p.aclose()

    return consume, close


def sdk_consumer(url: str) -> tuple[Consumer, Callable[[], Awaitable[None]]]:
    import anthropic

    client = anthropic.AsyncAnthropic(base_url=url, api_key="bench", max_retries=0)

    async def consume(payload: str) -> None:
        async with client.messages.stream(
            model="claude-sonnet-4-5",
            max_tokens=1024,
            messages=[{"role": "user", "content": "Tides?"}],
            extra_headers={"x-bench-payload": payload},
        ) as stream:
            message = await stream.get_final_message()
        assert message.content

    return consume, client.close


def litellm_consumer(url: str) -> tuple[Consumer, Callable[[], Awaitable[None]]] | None:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch from GitHub
    try:
        import litellm  # optional: measured only if installed
        from litellm.llms.custom_httpx.http_handler import AsyncHTTPHandler
    except ImportError:
        return None

    # LiteLLM's Anthropic streaming sends through ``litellm.module_level_aclient`` unless given a
    # client, and ``close_litellm_async_clients`` closes only the clients in LiteLLM's cache, not
    # that one: its aiohttp session was left open, and aiohttp printed "Unclosed client session"
    # and "Unclosed connector" at exit. The bench's own client (the same class and timeout as the
    # module's: the same aiohttp transport) is closed with the rest.
    client = AsyncHTTPHandler(timeout=litellm.request_timeout)

    async def consume(payload: str) -> None:
        response = await litellm.acompletion(
            model="anthropic/claude-sonnet-4-5",
            api_base=url,
            api_key="bench",
            messages=[{"role": "user", "content": "Tides?"}],
            stream=True,
            extra_headers={"x-bench-payload": payload},
            client=client,
        )
        async for _ in response:
            pass

    async def close() -> None:
        await client.close()
        await litellm.close_litellm_async_clients()

    return consume, close


# --------------------------------------------------------------------------- the run


def _row(name: str, value: float | str, unit: str, target: str | None, ok: bool | None) -> Row:
    shown = round(value, 4) if isinstance(value, float) else value
    return {"name": name, "value": shown, "unit": unit, "target": target, "ok": ok}


async def measure(url: str, *, quick: bool = False) -> list[Row]:
    """The figures; ``quick``: one round, no series (a check that every consumer runs)."""
    rows: list[Row] = []
    made = {
        "raw": raw_consumer(url),
        "thoughtgate": thoughtgate_consumer(url),
        "anthropic-sdk": sdk_consumer(url),
        "litellm": litellm_consumer(url),
    }
    consumers = {name: c for name, c in made.items() if c is not None}
    try:
        for chunking in CHUNKINGS:
            runs = {name: (c[0], f"{chunking}-1") for name, c in consumers.items()}
            runs["thoughtgate 10x"] = (consumers["thoughtgate"][0], f"{chunking}-10")
            runs["raw 10x"] = (consumers["raw"][0], f"{chunking}-10")
            seconds = await cpu_seconds(runs, 1 if quick else REPEATS)
            for name in made:
                if name not in seconds:
                    rows.append(_row(f"{name} [{chunking}]", "not installed", "", None, None))
                    continue
                rows.append(
                    _row(f"{name} cpu [{chunking}]", seconds[name] * 1000, "ms", None, None)
                )
            for name in consumers:
                if name == "raw":
                    continue
                ratio = seconds[name] / seconds["raw"]
                ours = name == "thoughtgate"
                target = f"<= {RATIO_TARGET:g}x raw" if ours else "(comparison)"
                ok = ratio <= RATIO_TARGET if ours else None
                rows.append(_row(f"{name} / raw [{chunking}]", ratio, "x", target, ok))
            raw_growth = seconds["raw 10x"] / seconds["raw"]
            rows.append(_row(f"raw 10x events / 1x [{chunking}]", raw_growth, "x", None, None))
            growth = seconds["thoughtgate 10x"] / seconds["thoughtgate"]
            target = f"<= {LINEARITY_TARGET:g}x"
            ok = growth <= LINEARITY_TARGET
            rows.append(_row(f"thoughtgate 10x events / 1x [{chunking}]", growth, "x", target, ok))
            if "litellm" in seconds:
                ratio = seconds["litellm"] / seconds["thoughtgate"]
                rows.append(_row(f"litellm / thoughtgate [{chunking}]", ratio, "x", None, None))
        rows += [] if quick else await series(consumers)
    finally:
        for consumer in consumers.values():
            await consumer[1]()
    return rows


async def series(consumers: dict[str, tuple[Consumer, Any]]) -> list[Row]:
    """Each consumer's CPU time against stream length (one SSE event per HTTP chunk)."""
    out: list[Row] = []
    for name, (consume, _) in consumers.items():
        points = []
        for scale in SERIES_SCALES:
            payload = f"event-{scale:g}"
            best = float("inf")
            for _ in range(SERIES_REPEATS.get(name, 3)):
                start = time.process_time()
                await consume(payload)
                best = min(best, time.process_time() - start)
            events = int(THINKING_DELTAS * scale) + int(TEXT_DELTAS * scale)
            points.append([events, round(best * 1000, 3)])
        out.append(
            {
                "series": "capture-cost",
                "label": name,
                "points": points,
                "xlabel": "deltas in the stream",
                "ylabel": "consumer CPU time (ms)",
                "title": "Capture cost against stream length (one SSE event per HTTP chunk)",
                "logx": True,
                "logy": True,
            }
        )
        print(f"series {name}: {points}", flush=True)
    return out


async def _sharing_connections(url: str, quick: bool) -> list[Row]:
    """Measure with the provider connections held open, as the raw client keeps its own."""
    async with shared_clients().lease():
        return await measure(url, quick=quick)


def main(quick: bool = False) -> list[Row]:
    with server_process() as url:
        rows = asyncio.run(_sharing_connections(url, quick))
    size = len(stream_bytes())
    print(
        f"stream: {THINKING_DELTAS} thinking + {TEXT_DELTAS} text deltas, {size} bytes; "
        f"python {sys.version.split()[0]}, {os.cpu_count()} cpus, "
        f"min of {1 if quick else REPEATS} runs"
    )
    for row in rows:
        if "series" in row:
            continue
        ok = {True: "ok", False: "MISSED", None: ""}[row["ok"]]
        target = row["target"] or ""
        print(f"{row['name']:<40} {row['value']:>13} {row['unit']:<3} {target:<16} {ok}")
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one round and no series")
    parser.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve)
    else:
        main(quick=args.quick)
