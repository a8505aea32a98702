"""The daemon's memory blocks per delivered event, counted by the site that allocated them.

Not a test. Run ``PYTHONPATH=src python -m bench.alloc_census`` (``--runs N`` timed runs at
``--concurrency C``, ``--top K`` sites, ``--samples S`` snapshots while runs are in flight).

Why (ADR 0143): the cyclic collector is 8-10 % of the daemon's CPU at 100 concurrent runs (ADR
0138); a pass costs what the runs in flight hold and comes after so many *net* container
allocations. Both are counted here, deterministically, where wall time on the shared host is
not: one process serves the daemon's app as :mod:`bench.run_instructions` does (``fake:bench``
runs, a SQLite store, the output filter on, the bench's own client), with the collector off and
``tracemalloc`` on for the timed runs only. Printed, per delivered event (the SSE events the
clients read):

* ``net containers``: the collector's young count over the timed runs (allocations of
  containers less those freed), the figure its threshold is compared with;
* ``held in flight``: blocks and bytes alive in the middle of the timed runs above those alive
  before them, by site, averaged over ``--samples`` snapshots (what a pass would walk);
* ``left``: blocks alive after the timed runs above those before them, by site: garbage only
  the collector frees (cycles), and caches.

A block's site is the innermost frame of its allocation in thoughtgate's own code (``src/``), or
the innermost frame when none is (the client's, the server's, the standard library's). The
client's blocks are in the counts, the same in every arm.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import sys
import tempfile
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

from bench import run_instructions

RUNS = 200
CONCURRENCY = 100
DEPTH = 12
OWN = f"{os.sep}thoughtgate{os.sep}"


def _site(trace: tracemalloc.Trace) -> str:
    frames = list(trace.traceback)  # oldest first
    for frame in reversed(frames):
        if OWN in frame.filename and "site-packages" not in frame.filename:
            name = frame.filename.split(OWN, 1)[1]
            return f"thoughtgate/{name}:{frame.lineno}"
    last = frames[-1]
    return f"{Path(last.filename).name}:{last.lineno}"


def _by_site(snapshot: tracemalloc.Snapshot) -> tuple[Counter[str], Counter[str]]:
    blocks: Counter[str] = Counter()
    size: Counter[str] = Counter()
    mine = [tracemalloc.Filter(False, __file__), tracemalloc.Filter(False, tracemalloc.__file__)]
    for trace in snapshot.filter_traces(mine).traces:
        site = _site(trace)
        blocks[site] += 1
        size[site] += trace.size
    return blocks, size


class _Census:
    """``daemon_bench._phase`` reads its ``cpu`` twice, around the timed runs."""

    def __init__(self, samples: int, interval: float) -> None:
        self.reads = 0
        self.samples = samples
        self.interval = interval
        self.start: tuple[Counter[str], Counter[str]] = (Counter(), Counter())
        self.held: list[tuple[Counter[str], Counter[str]]] = []
        self.left: tuple[Counter[str], Counter[str]] = (Counter(), Counter())
        self.young = 0
        self._sampler: asyncio.Task[None] | None = None

    async def _sample(self) -> None:
        for _ in range(self.samples):
            await asyncio.sleep(self.interval)
            self.held.append(_by_site(tracemalloc.take_snapshot()))

    def __call__(self) -> float:
        self.reads += 1
        if self.reads == 1:
            gc.collect()
            gc.disable()
            tracemalloc.start(DEPTH)
            self.start = _by_site(tracemalloc.take_snapshot())
            self.young = gc.get_count()[0]
            self._sampler = asyncio.get_running_loop().create_task(self._sample())
        else:
            self.young = gc.get_count()[0] - self.young
            if self._sampler is not None:
                self._sampler.cancel()
            self.left = _by_site(tracemalloc.take_snapshot())
            tracemalloc.stop()
            gc.enable()
        return 0.0


def _rows(
    found: tuple[Counter[str], Counter[str]],
    base: tuple[Counter[str], Counter[str]],
    per: float,
    top: int,
) -> list[list[Any]]:
    blocks, size = found
    diff = Counter({k: blocks[k] - base[0][k] for k in blocks})
    rows = []
    for site, count in diff.most_common(top):
        rows.append([site, round(count / per, 3), round((size[site] - base[1][site]) / per, 1)])
    total = sum(diff.values())
    total_size = sum(size.values()) - sum(base[1].values())
    rows.append(["(all)", round(total / per, 3), round(total_size / per, 1)])
    return rows


def consume(runs: int, concurrency: int, samples: int, interval: float, top: int) -> None:
    from thoughtgate.server.serve import daemon_runner

    census = _Census(samples, interval)
    run_instructions._Window = lambda instructions: census  # type: ignore[assignment,misc,return-value]
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp) / "s.db"
        drive = run_instructions._drive(where, runs, concurrency, 1.0, False, False, False)
        stats = daemon_runner()(drive)
    events = stats["events"]
    held_blocks: Counter[str] = Counter()
    held_size: Counter[str] = Counter()
    for blocks, size in census.held:
        held_blocks.update(blocks)
        held_size.update(size)
    n = max(1, len(census.held))
    base = (
        Counter({k: v * n for k, v in census.start[0].items()}),
        Counter({k: v * n for k, v in census.start[1].items()}),
    )
    print(
        json.dumps(
            {
                "runs": stats["runs"],
                "events": events,
                "net_containers_per_event": round(census.young / events, 3),
                "held_in_flight_per_run": _rows(
                    (held_blocks, held_size), base, n * concurrency, top
                ),
                "left_per_event": _rows(census.left, census.start, events, top),
            },
            indent=1,
        ),
        flush=True,
    )


def frames(total: int, build_only: bool) -> None:
    from thoughtgate.access import filter as output_filter
    from thoughtgate.access.roles import Role
    from thoughtgate.events.schema import Event
    from thoughtgate.server.fanout import RunFeeds
    from thoughtgate.server.sse import event_frame
    from thoughtgate.store.memory import MemoryStore

    feeds = RunFeeds(MemoryStore())
    kinds = ("reasoning.delta", "message.delta")
    events = [
        Event(i + 1, "run_x", kinds[i % 2], {"text": f"word{i} "}, ts=1.0) for i in range(total)
    ]
    # as ``live_frames`` frames them; a checkout before ADR 0143 had no reader's filter to pass
    resolve = getattr(output_filter, "event_filter", None)
    extra = {} if resolve is None else {"show": resolve(Role.DEVELOPER, mode="surface")}
    size = 0
    for event in () if build_only else events:
        data = feeds.frame(event, Role.DEVELOPER, "surface", event_frame, cache=False, **extra)
        size += 0 if data is None else len(data)
    print(json.dumps({"events": total, "bytes": size}))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=RUNS)
    parser.add_argument("--concurrency", type=int, default=CONCURRENCY)
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--interval", type=float, default=0.5, help="s between snapshots")
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument("--frames", type=int, default=0, help="frame N events alone")
    parser.add_argument("--build-only", action="store_true", help="with --frames")
    args = parser.parse_args(argv)
    if args.frames:
        frames(args.frames, args.build_only)
        return
    consume(args.runs, args.concurrency, args.samples, args.interval, args.top)
    sys.stdout.flush()
    os._exit(0)  # the server task and its threads: nothing to keep


if __name__ == "__main__":
    main()
