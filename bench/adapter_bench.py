"""CPU per delta of each HTTP adapter, streaming from the emulator in a process of its own.

The emulator process (:mod:`bench.emulator_process`) serves the ``bench`` scenario in the four
wire formats, paced so each delta arrives in its own network read, as a real provider sends it.
The consumer process runs ``TURNS`` sequential turns per adapter through ``stream_llm_turn`` and
reports ``time.process_time`` per delta (its own CPU only: HTTP, SSE, parsing, accumulating),
the minimum over ``REPEATS``.

``--src DIR`` (repeatable) measures the adapters of another checkout's ``src`` in the same run,
consumer processes alternating, so a change is compared with its base under the same load:
``python -m bench.adapter_bench --src /tmp/base/src --src src``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.emulator_pace import DELTAS
from bench.emulator_process import emulator_process
from bench.environment import REPO, child_env

TURNS = 40
REPEATS = 5
MODELS = (
    "anthropic:claude-sonnet-4-5",
    "openrouter:anthropic/claude-sonnet-4.5",
    "openai:gpt-5",
    "openai-compatible:deepseek-reasoner",
)


async def _measure(url: str, model: str, turns: int) -> float:
    """Microseconds of this process's CPU per delta over ``turns`` streamed turns."""
    from thoughtgate.engine.turn import stream_llm_turn
    from thoughtgate.providers.base import (
        ProviderSettings,
        ReasoningRequest,
        TurnRequest,
        create_provider,
    )
    from thoughtgate.providers.clients import shared_clients
    from thoughtgate.types import Message

    prefix = model.partition(":")[0]
    base = url if prefix == "anthropic" else f"{url}/v1"
    extra = {"thoughtgate": {"server": "deepseek"}} if prefix == "openai-compatible" else {}
    settings = ProviderSettings(base_url=base, api_key="bench", max_retries=0, extra=extra)
    request = TurnRequest([Message.user("bench")], reasoning=ReasoningRequest(True))
    async with shared_clients().lease():
        provider = create_provider(model, settings)
        await stream_llm_turn(provider, request)  # warm: connection, imports, caches
        start = time.process_time()
        for _ in range(turns):
            turn = await stream_llm_turn(provider, request)
        spent = time.process_time() - start
        await provider.aclose()
    assert turn.text, f"{model}: no answer"
    return spent / (turns * 2 * DELTAS) * 1e6


def consumer(url: str, turns: int) -> dict[str, float]:
    return {model: asyncio.run(_measure(url, model, turns)) for model in MODELS}


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", action="append", default=[], help="a checkout's src directory")
    parser.add_argument("--turns", type=int, default=TURNS)
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--consume", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.consume:
        print(json.dumps(consumer(args.consume, args.turns)))
        return {}
    sources = [str(Path(s).resolve()) for s in args.src] or [str(REPO / "src")]
    best: dict[str, dict[str, float]] = {s: {} for s in sources}
    with tempfile.TemporaryDirectory() as tmp, emulator_process(Path(tmp)) as url:
        for _ in range(args.repeats):
            for src in sources:
                env = child_env(src)
                command = [sys.executable, "-m", "bench.adapter_bench", "--consume", url]
                out = subprocess.run(
                    [*command, "--turns", str(args.turns)],
                    env=env,
                    cwd=str(REPO),
                    capture_output=True,
                    text=True,
                )
                if out.returncode:
                    raise SystemExit(f"consumer on {src} failed:\n{out.stderr}")
                for model, value in json.loads(out.stdout).items():
                    best[src][model] = min(value, best[src].get(model, value))
    first = best[sources[0]]
    for src, row in best.items():
        print(src)
        for model, value in row.items():
            print(f"  {model:42s} {value:7.1f} µs/delta  {value / first[model]:4.2f}x the first")
    return best


if __name__ == "__main__":
    main()
