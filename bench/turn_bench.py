"""CPU of one adapter turn and of one delta, per wire format, with no socket. Not a test.

A run builds its adapter and streams each turn through one request (ADR 0088: at the bench's 40
deltas a turn, most of an adapter's CPU per delta is what a turn costs once). This measures the
two apart, in memory, so a change to the adapters' Python can be compared with its base without
the daemon bench's noise:

* each format's answer is recorded once from the bench's emulator (:mod:`bench.emulator_process`)
  and cut into one HTTP chunk a read, as a paced provider's reads arrive;
* each turn then builds its adapter (``create_provider``, as a run does) and streams the turn
  (``stream_llm_turn``) through the shared clients, over a network backend that answers every
  request with the recorded reads from memory (no system call, no loop wake-up);
* the turn is run at its recorded length (40 deltas) and with every delta's read repeated four
  times (160 deltas, the same events again); with ``c(n) = T + n × d``, the two lengths give the
  turn's fixed CPU ``T`` and each delta's ``d``.

Per format: ``BATCHES`` batches of ``PER_BATCH`` turns of each length, alternated, each batch's
``time.thread_time()`` per turn; the medians. The daemon's collector policy holds meanwhile.

* ``--instructions``: each consumer runs under valgrind's callgrind, which counts the
  instructions of the turns alone (one batch of each length; ``--per-batch 20`` makes the
  ``callgrind_control`` calls around them ~25k instructions a turn). Same code, same count to
  within a tenth of a per cent, where thread time on a shared host moves 2× (ADR 0097);
* ``--loopback``: the emulator's own paced turns over its socket (one length: the per-read
  wake-ups included, no split).

``--src DIR`` (repeatable) measures another checkout's ``src`` in the same run, the processes
alternating ``--rounds`` times: ``python -m bench.turn_bench --src /tmp/base/src --src src``.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.emulator_pace import DELTAS
from bench.emulator_process import emulator_process
from bench.environment import REPO, callgrind_control, consumer_row
from bench.request_bench import memory_backend

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

    class Backend(real):
        async def connect_tcp(self, *args: Any, **kwargs: Any) -> Any:
            return Stream(await super().connect_tcp(*args, **kwargs))

    clients.AsyncioBackend = Backend  # type: ignore[attr-defined]
    async with clients.shared_clients().lease():
        await stream_llm_turn(create_provider(model, _settings(url, model)), _request())
    return reads


_DELTA = re.compile(rb'"(step \d\d |word\d{3} |T\d\d\.\d{4})"')
"""One of the scenario's 8-character deltas (the first holds the emulator's stamp), alone in its
JSON string."""


def _as_paced(reads: list[bytes]) -> list[bytes]:
    """The recorded answer as a paced provider's reads: the head with the first HTTP chunk, then
    one chunk a read, the body's end with the last (whatever reads the recording happened to get:
    a busy host joins them)."""
    raw = b"".join(reads)
    pos = raw.index(b"\r\n\r\n") + 4
    head = raw[:pos]
    chunks: list[bytes] = []
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


KIND = "short"
"""Which answer the memory backend serves the next request: "short" (as recorded) or "long"."""


async def _measure(url: str, fmt: str, batches: int, per_batch: int, mode: str) -> dict[str, Any]:
    global KIND
    from thoughtgate.engine.turn import stream_llm_turn
    from thoughtgate.providers import clients
    from thoughtgate.providers.base import create_provider
    from thoughtgate.server.gc_policy import daemon_gc

    model = MODELS[fmt]
    if mode == "loopback":  # the emulator's own paced turns, over its socket: one length only
        kinds: tuple[str, ...] = ("short",)
        deltas = 2 * DELTAS
    else:
        kinds = ("short", "long")
        reads = _as_paced(await _record(url, model))
        answers = {"short": reads, "long": _longer(reads)}
        deltas = sum(map(_is_delta, reads))
        clients.AsyncioBackend = memory_backend(lambda: answers[KIND])  # type: ignore[attr-defined]
    settings, request = _settings(url, model), _request()
    figures: dict[str, list[float]] = {kind: [] for kind in ("short", "long")}

    async def turns(kind: str) -> None:
        global KIND
        KIND = kind
        for _ in range(per_batch):
            await stream_llm_turn(create_provider(model, settings), request)

    async with clients.shared_clients().lease():
        for kind in kinds * 2:  # warm: the pool, imports, caches
            await turns(kind)
        with daemon_gc(10_000):  # the daemon's collector policy (ADR 0045)
            for _ in range(1 if mode == "instructions" else batches):
                for kind in kinds:
                    if mode == "instructions":  # counted by callgrind, one dump per length
                        callgrind_control("--instr=on")
                        callgrind_control("--zero")
                        await turns(kind)
                        callgrind_control("--dump")
                        callgrind_control("--instr=off")
                        continue
                    began = time.thread_time()
                    await turns(kind)
                    figures[kind].append((time.thread_time() - began) / per_batch * 1e6)
    return {"deltas": deltas, **figures}


def consumer(
    url: str, batches: int, per_batch: int, formats: list[str], mode: str
) -> dict[str, Any]:
    import uvloop

    return {f: uvloop.run(_measure(url, f, batches, per_batch, mode)) for f in formats}


def _dumps(folder: Path) -> list[int]:
    """Instructions counted in each of callgrind's dumps in ``folder``, in dump order."""
    found = []
    for path in folder.glob("cg.out.*"):
        summary = re.search(r"^summary: (\d+)", path.read_text(errors="replace"), re.M)
        if summary is not None:
            found.append((int(path.suffix[1:]), int(summary[1])))
    return [count for _, count in sorted(found)]


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
    how = parser.add_mutually_exclusive_group()
    how.add_argument("--loopback", action="store_true", help="the emulator's socket, paced")
    how.add_argument("--instructions", action="store_true", help="instructions, by callgrind")
    parser.add_argument("--consume", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    formats = args.formats.split(",")
    mode = "loopback" if args.loopback else "instructions" if args.instructions else "memory"
    if args.consume:
        found = consumer(args.consume, args.batches, args.per_batch, formats, mode)
        print(json.dumps(found))
        return {}
    sources = [str(Path(s).resolve()) for s in args.src] or [str(REPO / "src")]
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in sources}
    with tempfile.TemporaryDirectory() as tmp, emulator_process(Path(tmp)) as url:
        for number in range(args.rounds):
            for index, src in enumerate(sources):
                folder = Path(tmp) / f"cg-{number}-{index}"
                folder.mkdir()
                command = [sys.executable, "-m", "bench.turn_bench", "--consume", url]
                if mode == "instructions":
                    out_file = f"--callgrind-out-file={folder / 'cg.out'}"
                    command = ["valgrind", "--tool=callgrind", "--instr-atstart=no", out_file]
                    command += [sys.executable, "-m", "bench.turn_bench", "--consume", url]
                    command += ["--instructions"]
                elif mode == "loopback":
                    command += ["--loopback"]
                command += ["--batches", str(args.batches), "--per-batch", str(args.per_batch)]
                row = consumer_row([*command, "--formats", args.formats], src)
                if mode == "instructions":  # two dumps per format: short, then long turns
                    counts = iter(_dumps(folder))
                    for f in formats:
                        row[f]["short"] = [next(counts) / args.per_batch]
                        row[f]["long"] = [next(counts) / args.per_batch]
                runs[src].append(row)
                print(src, " ".join(f"{f}={_median(row[f]['short']):.0f}" for f in formats))
    return _report(runs, formats, "instructions" if mode == "instructions" else "µs")


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _report(runs: dict[str, list[dict[str, Any]]], formats: list[str], unit: str) -> dict[str, Any]:
    """Per checkout and format: the median turn, and (in memory) its fixed and per-delta parts;
    with two checkouts or more, each round's ratio to the first checkout's in the same round."""
    result: dict[str, Any] = {}
    first = next(iter(runs))
    for src, rows in runs.items():
        print(src)
        result[src] = {}
        for f in formats:
            short = _median([x for row in rows for x in row[f]["short"]])
            long = _median([x for row in rows for x in row[f]["long"]])
            turn, delta = _split(short, long, rows[0][f]["deltas"])
            ratios = [
                _median(row[f]["short"]) / _median(base[f]["short"])
                for row, base in zip(rows, runs[first], strict=True)
            ]
            result[src][f] = {"turn_us": short, "fixed_us": turn, "delta_us": delta}
            line = f"  {f:10s} {short:7.0f} {unit} a turn of {rows[0][f]['deltas']} deltas"
            if long == long:  # not NaN: measured in memory at two lengths
                line += f"; fixed {turn:6.0f} {unit}, {delta:5.1f} {unit} a delta"
            if src != first:
                lower = sum(r < 1 for r in ratios)
                line += (
                    f"; turn vs the first, per round: median {statistics.median(ratios):.3f}, "
                    f"lower in {lower} of {len(ratios)}"
                )
            print(line)
    return result


if __name__ == "__main__":
    main()
