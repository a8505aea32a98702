"""A daemon run's instructions at 10 concurrent runs, counted by callgrind. Not a test.

Run ``PYTHONPATH=src python -m bench.run_instructions`` (``--src DIR`` once per checkout to
compare, e.g. a detached ``main``'s ``src`` and this one's; ``--rounds R`` alternates them R
times; ``--runs N`` timed runs at ``--concurrency C``; ``--single`` for the one-request client;
``--requests`` for N ``POST /v1/tickets`` alone, one after another on one connection;
``--cpu`` for process CPU instead of instructions, without valgrind; with
``RUN_INSTRUCTIONS_PROFILE=FILE`` and ``--consume --cpu`` a cProfile of the timed runs).

Why (ADR 0103): on the shared two-core host the daemon bench's runs/s and CPU per delta move by
tens of per cent between minutes, so a change of a few per cent in a run's CPU cannot be seen
there. This counts it: one process serves the daemon's app (``serve_app`` on loopback, the
daemon's event loop, its collector policy, a SQLite store, the output filter on, ``fake:bench``
runs, as :mod:`bench.daemon_bench`'s server) and drives it with that bench's own client (three
requests a run, or one), under valgrind's callgrind, which counts the instructions of the timed
runs only (``callgrind_control`` around them). The client's instructions are in the count, the
same in every arm: the arms differ by the server's.

Under callgrind the process runs ~50-100x slower; with the provider's pace unchanged the daemon
would fall behind it and batch deltas differently from natively. So every clock the run's work
follows is stretched by ``--scale`` (default 150; at 30 and 60 the daemon still fell behind): the
provider's first delta and its gap, and the recorder's batching window. The same scale in every
arm. Even so a whole run's count moves by up to ~10 % between processes of the same code (how
many frames the deltas were batched into moves every per-commit and per-frame cost with it);
``--requests`` repeats to ~0.2 %. The warm-up's collector debt is paid before the count starts.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import re
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.environment import LOOPBACK, REPO, callgrind_control, consumer_row

RUNS = 200
CONCURRENCY = 10
SCALE = 150.0


class _Window:
    """``daemon_bench._phase`` reads its ``cpu`` twice, around the timed runs: the first read
    starts the count, the second ends it."""

    def __init__(self, instructions: bool) -> None:
        self.instructions = instructions
        self.reads = 0
        self.profile: Any = None
        if os.environ.get("RUN_INSTRUCTIONS_PROFILE"):  # where the calls go (cProfile)
            import cProfile

            self.profile = cProfile.Profile()

    def __call__(self) -> float:
        import time

        self.reads += 1
        if self.reads == 1:  # the warm-up's collector debt is not the timed runs' (ADR 0089)
            gc.collect()
        if self.profile is not None:
            if self.reads == 1:
                self.profile.enable()
            else:
                self.profile.disable()
                self.profile.dump_stats(os.environ["RUN_INSTRUCTIONS_PROFILE"])
        if not self.instructions:
            return time.process_time()
        if self.reads == 1:
            callgrind_control("--instr=on")
            callgrind_control("--zero")
        else:
            callgrind_control("--dump")
            callgrind_control("--instr=off")
        return 0.0


async def _requests(url: str, key: str, total: int, window: _Window) -> dict[str, Any]:
    """``total`` ticket requests (a bearer key's read, a body parsed, a ticket signed) one after
    another on one connection, after as many to warm up."""
    from bench.daemon_bench import _Connection

    host, port = url.removeprefix("http://").split(":")
    conn = await _Connection(host, int(port), key).open()
    body = {"scope": "runs"}
    for _ in range(total):
        await conn.request("POST", "/v1/tickets", body)
    before = window()
    for _ in range(total):
        status, _ = await conn.request("POST", "/v1/tickets", body)
        assert status == 200, status
    cpu = window() - before
    await conn.close()
    return {"runs": total, "events": 0, "cpu": cpu}


async def _drive(
    db: Path, runs: int, concurrency: int, scale: float, single: bool, instr: bool, requests: bool
) -> dict[str, Any]:
    import bench.daemon_bench as daemon_bench
    from bench.emulator_pace import GAP_S, PROVIDER_TTFB_S
    from thoughtgate.access.keys import create_key
    from thoughtgate.config import Config
    from thoughtgate.orchestration.recorder import EventRecorder
    from thoughtgate.orchestration.runtime import Runtime
    from thoughtgate.server.app import create_app
    from thoughtgate.server.serve import serve_app
    from thoughtgate.store.urls import open_store
    from thoughtgate.testing.fake import FAKE_SCRIPTS

    daemon_bench.PROVIDER_TTFB_S = PROVIDER_TTFB_S * scale  # type: ignore[attr-defined]
    daemon_bench.GAP_S = GAP_S * scale  # type: ignore[attr-defined]
    defaults = EventRecorder.__init__.__kwdefaults__
    assert defaults is not None
    defaults["flush_interval"] = defaults["flush_interval"] * scale
    FAKE_SCRIPTS["bench"] = daemon_bench._bench_script
    store = await open_store(f"sqlite:///{db}")
    key = (await create_key(store, name="bench", role="developer")).key
    # daemon_bench's config; its connections wait their turn for tens of seconds under
    # callgrind, so they are kept alive (natively they never idle that long)
    keep = {"idle_timeout_s": 3600, "header_timeout_s": 3600}
    config = Config.from_mapping({"quotas": daemon_bench._NO_QUOTAS, "server": keep})
    app = create_app(Runtime(store, config), config)
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[str] = loop.create_future()
    server = asyncio.ensure_future(
        serve_app(
            app,
            host=LOOPBACK,
            port=0,
            log_level="warning",
            on_ready=lambda host, port: ready.set_result(f"http://{host}:{port}"),
        )
    )
    url = await ready
    if requests:  # the request path alone: POST /v1/tickets for the run list, one connection
        return await _requests(url, key, runs, _Window(instr))
    for _ in range(2):  # warm: imports, caches, the store's statements (three runs a phase)
        await daemon_bench._phase(
            url, key, concurrency, concurrency, "fake:bench", lambda: 0.0, single
        )
    stats = await daemon_bench._phase(
        url, key, concurrency, runs, "fake:bench", _Window(instr), single
    )
    server.cancel()
    return {"runs": stats["runs"], "events": stats["events"], "cpu": stats["cpu"]}


def consume(
    runs: int, concurrency: int, scale: float, single: bool, instr: bool, requests: bool = False
) -> dict[str, Any]:
    from thoughtgate.server.serve import daemon_runner

    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp) / "s.db"
        return daemon_runner()(_drive(where, runs, concurrency, scale, single, instr, requests))


def _dump(folder: Path) -> int:
    for path in folder.glob("cg.out*"):
        text = path.read_text(errors="replace")
        summary = re.search(r"^summary: (\d+)", text, re.M)
        if summary is not None and int(summary[1]) > 0:
            return int(summary[1])
    raise SystemExit(f"no callgrind dump in {folder}")


def main(argv: list[str] | None = None) -> dict[str, list[float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", action="append", default=[], help="a checkout's src directory")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--runs", type=int, default=RUNS)
    parser.add_argument("--concurrency", type=int, default=CONCURRENCY)
    parser.add_argument(
        "--scale", type=float, default=None, help=f"default {SCALE:g}; 1 with --cpu"
    )
    parser.add_argument("--single", action="store_true", help="POST /v1/runs/follow")
    parser.add_argument(
        "--requests", action="store_true", help="RUNS ticket requests alone, no run (one client)"
    )
    parser.add_argument("--cpu", action="store_true", help="process CPU, without valgrind")
    parser.add_argument("--consume", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    scale = args.scale if args.scale is not None else (1.0 if args.cpu else SCALE)
    if args.consume:
        found = consume(
            args.runs, args.concurrency, scale, args.single, not args.cpu, args.requests
        )
        print(json.dumps(found), flush=True)
        os._exit(0)  # the server task and its threads: nothing to keep
    sources = [str(Path(s).resolve()) for s in args.src] or [str(REPO / "src")]
    figures: dict[str, list[float]] = {s: [] for s in sources}
    unit = "µs CPU" if args.cpu else "instructions"
    with tempfile.TemporaryDirectory() as tmp:
        for number in range(args.rounds):
            order = sources if number % 2 == 0 else sources[::-1]
            for src in order:
                folder = Path(tmp) / f"cg-{number}-{sources.index(src)}"
                folder.mkdir()
                command = [sys.executable, "-m", "bench.run_instructions", "--consume"]
                command += ["--runs", str(args.runs), "--concurrency", str(args.concurrency)]
                command += ["--scale", str(scale)] + (["--single"] if args.single else [])
                command += ["--requests"] if args.requests else []
                if args.cpu:
                    command += ["--cpu"]
                else:
                    out_file = f"--callgrind-out-file={folder / 'cg.out'}"
                    command = [
                        "valgrind",
                        "--tool=callgrind",
                        "--instr-atstart=no",
                        out_file,
                        *command,
                    ]
                row = consumer_row(command, src)
                total = row["cpu"] * 1e6 if args.cpu else _dump(folder)
                per_run = total / row["runs"]
                figures[src].append(per_run)
                print(
                    f"round {number} {src}: {per_run:,.0f} {unit} a run ({row['runs']} runs, {row['events']} events)",
                    flush=True,
                )
    for src, values in figures.items():
        print(
            f"{src}: median {statistics.median(values):,.0f} {unit} a run, {[round(v) for v in values]}"
        )
    return figures


if __name__ == "__main__":
    main()
