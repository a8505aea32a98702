"""CPU of one adapter turn and of one delta, per wire format, with no socket. Not a test.

A run builds its adapter and streams each turn through one request (ADR 0088: at the bench's 40
deltas a turn, most of an adapter's CPU per delta is what a turn costs once). This measures the
two apart, in memory, so a change to the adapters' Python can be compared with its base without
the daemon bench's noise:

* each format's answer is recorded once from the bench's emulator (:mod:`bench.emulator_process`),
  read by read, as the adapter read it;
* each turn then builds its adapter (``create_provider``, as a run does) and streams the turn
  (``stream_llm_turn``) through the shared clients, over a network backend that answers every
  request with the recorded reads from memory (no system call, no loop wake-up);
* the turn is run at its recorded length (40 deltas) and with every delta's read repeated four
  times (160 deltas, the same events again); with ``c(n) = T + n × d``, the two lengths give the
  turn's fixed CPU ``T`` and each delta's ``d``.

Per format: ``BATCHES`` batches of ``PER_BATCH`` turns of each length, alternated, each batch's
``time.thread_time()`` per turn; the medians. ``--src DIR`` (repeatable) measures another
checkout's ``src`` in the same run, the processes alternating ``--rounds`` times:
``python -m bench.turn_bench --src /tmp/base/src --src src``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.emulator_process import emulator_process
from bench.environment import REPO, child_env

BATCHES = 9
PER_BATCH = 30
ROUNDS = 3
REPEAT = 4
"""Each delta's read is served this many times in the long turn."""
MODELS = {
    "anthropic": "anthropic:claude-sonnet-4-5",
    "chat": "openai-compatible:deepseek-reasoner",
    "openrouter": "openrouter:anthropic/claude-sonnet-4.5",
    "responses": "openai:gpt-5",
}


def _settings(url: str, model: str) -> Any:
    from thoughtgate.providers.base import ProviderSettings

    prefix = model.partition(":")[0]
    base = url if prefix == "anthropic" else f"{url}/v1"
    extra = {"thoughtgate": {"server": "deepseek"}} if prefix == "openai-compatible" else {}
    return ProviderSettings(base_url=base, api_key="bench", max_retries=0, extra=extra)


def _request() -> Any:
    from thoughtgate.providers.base import ReasoningRequest, TurnRequest
    from thoughtgate.types import Message

    return TurnRequest([Message.user("bench")], reasoning=ReasoningRequest(True))


async def _record(url: str, model: str) -> list[bytes]:
    """The reads of one streamed answer of ``model`` from the emulator, as the adapter got them."""
    from thoughtgate.engine.turn import stream_llm_turn
    from thoughtgate.providers import clients
    from thoughtgate.providers.base import create_provider

    from thoughtgate.providers.netio import AsyncioBackend as real

    reads: list[bytes] = []

    class Stream:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
            data: bytes = await self.inner.read(max_bytes, timeout)
            reads.append(data)
            return data

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

    class Backend(real):  # type: ignore[misc, valid-type]
        async def connect_tcp(self, *args: Any, **kwargs: Any) -> Any:
            return Stream(await super().connect_tcp(*args, **kwargs))

    clients.AsyncioBackend = Backend  # type: ignore[attr-defined]
    async with clients.shared_clients().lease():
        await stream_llm_turn(create_provider(model, _settings(url, model)), _request())
    return reads


_DELTA = re.compile(rb'"(step \d\d |word\d{3} )"')
"""One of the scenario's 8-character deltas, alone in its JSON string."""


def _as_paced(reads: list[bytes]) -> list[bytes]:
    """The recorded answer as a paced provider's reads: the head with the first HTTP chunk, then
    one chunk a read, the body's end with the last (whatever reads the recording happened to get:
    a busy host joins them)."""
    raw = b"".join(reads)
    pos = raw.index(b"\r\n\r\n") + 4
    head, chunks = raw[:pos], []
    while True:
        line_end = raw.index(b"\r\n", pos)
        size = int(raw[pos:line_end], 16)
        end = line_end + 2 + size + 2
        if size == 0:
            chunks[-1] += raw[pos:]
            break
        chunks.append(raw[pos:end])
        pos = end
    return [head + chunks[0], *chunks[1:]]


def _is_delta(read: bytes) -> bool:
    return _DELTA.search(read) is not None and b"message_delta" not in read


def _longer(reads: list[bytes]) -> list[bytes]:
    return [piece for read in reads for piece in ([read] * (REPEAT if _is_delta(read) else 1))]


def _memory_backend(answers: dict[str, list[bytes]]) -> Any:
    """Every connection answers each request with the reads ``answers[KIND]`` holds at the time
    the request is written (``KIND``: the module global the measuring loop sets)."""
    import httpcore

    class Stream(httpcore.AsyncNetworkStream):
        def __init__(self) -> None:
            self.unread: list[bytes] = []

        async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
            return self.unread.pop() if self.unread else b""

        async def write(self, buffer: bytes, timeout: float | None = None) -> None:
            if buffer and not self.unread:  # the request's first write: the answer is ready
                self.unread = answers[KIND][::-1]

        async def aclose(self) -> None:
            return None

        def get_extra_info(self, info: str) -> Any:
            return False if info == "is_readable" else None

    class Backend(httpcore.AsyncNetworkBackend):
        async def connect_tcp(self, *args: Any, **kwargs: Any) -> httpcore.AsyncNetworkStream:
            return Stream()

        async def sleep(self, seconds: float) -> None:
            await asyncio.sleep(seconds)

    return Backend


KIND = "short"


async def _measure(url: str, fmt: str, batches: int, per_batch: int) -> dict[str, Any]:
    global KIND
    from thoughtgate.engine.turn import stream_llm_turn
    from thoughtgate.providers import clients
    from thoughtgate.providers.base import create_provider

    model = MODELS[fmt]
    reads = _as_paced(await _record(url, model))
    answers = {"short": reads, "long": _longer(reads)}
    deltas = sum(map(_is_delta, reads))
    clients.AsyncioBackend = _memory_backend(answers)  # type: ignore[attr-defined]
    settings, request = _settings(url, model), _request()
    figures: dict[str, list[float]] = {"short": [], "long": []}
    async with clients.shared_clients().lease():
        for kind in ("short", "long") * 2:  # warm: the pool, imports, caches
            KIND = kind
            for _ in range(per_batch):
                await stream_llm_turn(create_provider(model, settings), request)
        for _ in range(batches):
            for kind in ("short", "long"):
                KIND = kind
                began = time.thread_time()
                for _ in range(per_batch):
                    await stream_llm_turn(create_provider(model, settings), request)
                figures[kind].append((time.thread_time() - began) / per_batch * 1e6)
    return {"deltas": deltas, **figures}


def consumer(url: str, batches: int, per_batch: int, formats: list[str]) -> dict[str, Any]:
    import uvloop

    return {f: uvloop.run(_measure(url, f, batches, per_batch)) for f in formats}


def _split(short: float, long: float, deltas: int) -> tuple[float, float]:
    """``(T, d)``: a turn's fixed CPU and a delta's, from turns of ``deltas`` and ``REPEAT`` ×
    ``deltas`` deltas."""
    d = (long - short) / (deltas * (REPEAT - 1))
    return short - deltas * d, d


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", action="append", default=[], help="a checkout's src directory")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--batches", type=int, default=BATCHES)
    parser.add_argument("--per-batch", type=int, default=PER_BATCH)
    parser.add_argument("--formats", default=",".join(MODELS))
    parser.add_argument("--consume", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    formats = args.formats.split(",")
    if args.consume:
        print(json.dumps(consumer(args.consume, args.batches, args.per_batch, formats)))
        return {}
    sources = [str(Path(s).resolve()) for s in args.src] or [str(REPO / "src")]
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in sources}
    with tempfile.TemporaryDirectory() as tmp, emulator_process(Path(tmp)) as url:
        for _ in range(args.rounds):
            for src in sources:
                command = [sys.executable, "-m", "bench.turn_bench", "--consume", url]
                command += ["--batches", str(args.batches), "--per-batch", str(args.per_batch)]
                out = subprocess.run(
                    [*command, "--formats", args.formats],
                    env=child_env(src),
                    cwd=str(REPO),
                    capture_output=True,
                    text=True,
                )
                if out.returncode:
                    raise SystemExit(f"consumer on {src} failed:\n{out.stderr}")
                runs[src].append(json.loads(out.stdout))
                row = runs[src][-1]
                print(
                    src,
                    " ".join(
                        f"{f}={statistics.median(row[f]['short']):.0f}/"
                        f"{statistics.median(row[f]['long']):.0f}"
                        for f in formats
                    ),
                    flush=True,
                )
    result: dict[str, Any] = {}
    for src, rows in runs.items():
        print(src)
        result[src] = {}
        for f in formats:
            short = statistics.median(x for row in rows for x in row[f]["short"])
            long = statistics.median(x for row in rows for x in row[f]["long"])
            turn, delta = _split(short, long, rows[0][f]["deltas"])
            result[src][f] = {"turn_us": short, "fixed_us": turn, "delta_us": delta}
            print(
                f"  {f:10s} {short:7.0f} µs a turn of {rows[0][f]['deltas']} deltas; "
                f"fixed {turn:6.0f} µs, {delta:5.1f} µs a delta"
            )
    return result


if __name__ == "__main__":
    main()
