"""The cyclic collector's pauses while 1,000 SSE readers of a live run connect and leave at once.

Not a test, and not part of ``make bench`` (~30 s for the default six bursts). Run
``PYTHONPATH=src python -m bench.gc_bursts``; options: ``--bursts N``, ``--readers R``;
``--replay``: a burst's readers replay the run from its start instead of following on from its
last event; ``--hold S``: they stay S seconds, reading the run live, before they leave (the
fan-out case: 1,000 readers of a live run); ``--thresholds A,B,C``: the collector's thresholds once the daemon listens;
``--freeze-after-burst``: the daemon calls ``gc.freeze()`` once each burst has settled;
``--census``: instead of timing the passes, count by type what they had to free, and what is
alive with all of the first burst's readers connected; ``--memory``: after each burst the
daemon's RSS and pymalloc's arenas, with ``--tracemalloc`` tracemalloc's growth by traceback
since the first burst, with ``--trim`` RSS after glibc's ``malloc_trim(0)`` (ADR 0171: a
replaying burst's memory); ``--json FILE``.

Why (ADR 0166): a profile found collector passes of 26-120 ms while ~1,000 connections opened or
closed together. A pass stops the daemon's one event loop, so every stream stalls for it;
``bench.fanout_bench`` measures its p99 after its readers are connected, so it does not see them.

Set-up: ``thoughtgate serve``'s ``serve_app`` in a subprocess over a SQLite file, as
``bench.fanout_bench`` serves it. One run of the fake provider says a word every ``GAP_S`` until
the bench ends it; one reader (the *existing* reader) follows it from before the first burst to
its end. A burst: ``--readers`` raw-socket SSE readers of that run connect (each reads its response's
head; they follow on from the run's last event, so that every burst costs the same, unless
``--replay``), then all close at once, then the bench waits ``SETTLE_S``; between bursts the
daemon is left alone for ``QUIET_S``.

The daemon times every collector pass with ``gc.callbacks``: ``time.thread_time`` (CPU of the
loop's thread; a pass is pure CPU, so this is robust to a shared host) and ``time.perf_counter``
(wall, which also counts the moments the host ran something else). Printed: the passes that
began inside the bursts (from the first connect to the end of the settle), per generation,
their longest and p99 CPU and wall, their CPU total; the existing reader's append→delivery
during the bursts (max, p99) and outside them (p99); the daemon's RSS after each burst.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import types
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from bench.atomic import write_json
from bench.emulator_process import stop
from bench.environment import LOOPBACK, REPO, child_env
from bench.fanout_bench import _pct, _Reader, _request, _started
from bench.process_stats import rss_mb

__all__ = ["main"]

READERS = 1000
BURSTS = 6
GAP_S = 0.05
SETTLE_S = 1.5
QUIET_S = 1.0


# ----------------------------------------------------------------------------- server side


def _words_script(request: Any, turn: int) -> AsyncIterator[Any]:
    """``words STOP_FILE GAP_S``: a word every ``GAP_S`` until ``STOP_FILE`` exists."""
    from thoughtgate.testing.fake import text

    _, stop_file, gap = request.messages[0].text.split()

    async def gen() -> AsyncIterator[Any]:
        for i in range(100_000):
            if os.path.exists(stop_file):  # noqa: ASYNC240 (a stat, once a word)
                return
            yield text(f"w{i} ")
            await asyncio.sleep(float(gap))

    return gen()


class _Passes:
    """Every collector pass once ``on``: when it began, its generation, what it freed, its CPU
    (the collecting thread's: start and stop run on it) and wall time."""

    def __init__(self) -> None:
        self.rows: list[tuple[float, int, int, float, float]] = []
        self.on = False
        self._wall = self._cpu = 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._cpu = time.thread_time()
            self._wall = time.perf_counter()
            return
        cpu = time.thread_time() - self._cpu
        wall = time.perf_counter() - self._wall
        if self.on:
            at = time.time() - wall
            self.rows.append((at, info["generation"], info["collected"], cpu, wall))


def _kind(o: object) -> str:
    """An object's type, and for code (functions, methods, coroutines) which code."""
    kind = f"{type(o).__module__}.{type(o).__qualname__}"
    if isinstance(o, types.FunctionType | types.CoroutineType | types.AsyncGeneratorType):
        return f"{kind} {o.__qualname__}"
    if isinstance(o, types.MethodType):
        return f"{kind} {getattr(o.__func__, '__qualname__', '?')}"
    return kind


def _serve(port_file: Path, db_url: str, out_dir: Path, thresholds: str, mode: str) -> None:
    """The daemon. ``mode`` ``census``: instead of timing passes, keep what they find (``dump``)
    and, on ``SIGUSR2``, count the live objects outside the start-up freeze by type (``peak``);
    ``freeze``: on ``SIGUSR2`` (after each burst), ``gc.freeze()``."""
    census = mode == "census"
    trace, trim = mode.startswith("memory") and "trace" in mode, "trim" in mode
    mode = "memory" if mode.startswith("memory") else mode
    import logging

    from thoughtgate.access.keys import create_key
    from thoughtgate.config import Config
    from thoughtgate.orchestration.runtime import Runtime
    from thoughtgate.server.app import create_app
    from thoughtgate.server.serve import daemon_runner, serve_app
    from thoughtgate.store.urls import open_store
    from thoughtgate.testing.fake import FAKE_SCRIPTS

    FAKE_SCRIPTS["words"] = _words_script
    logging.basicConfig(level=logging.WARNING)
    passes = _Passes()

    def dump() -> None:
        data: dict[str, Any] = {
            "passes": passes.rows,
            "frozen": gc.get_freeze_count(),
            "threshold": list(gc.get_threshold()),
        }
        if census:  # what the passes found since the daemon listened: kept (DEBUG_SAVEALL)
            gc.collect()
            counts = Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.garbage)
            data["garbage"] = len(gc.garbage)
            data["garbage_types"] = counts.most_common(60)
            gc.set_debug(0)
            gc.garbage.clear()
        write_json(out_dir / "server.json", data)

    memory_rows: list[dict[str, Any]] = []
    snapshots: list[Any] = []

    def memory() -> None:
        """After a burst (``--memory``): RSS; pymalloc's arenas (``sys._debugmallocstats``);
        with ``--tracemalloc``, what tracemalloc holds and its growth by traceback since the
        first burst; then RSS after glibc's ``malloc_trim(0)`` (what the allocator kept free)."""
        import ctypes
        import tracemalloc

        gc.collect()
        row: dict[str, Any] = {"rss_mb": _own_rss_mb(), **_pymalloc()}
        if tracemalloc.is_tracing():
            snapshot = tracemalloc.take_snapshot().filter_traces(
                [tracemalloc.Filter(False, tracemalloc.__file__)]
            )
            row["traced_mb"] = tracemalloc.get_traced_memory()[0] / 1e6
            if not snapshots:
                snapshots.append(snapshot)
            else:
                stats = snapshot.compare_to(snapshots[0], "traceback")
                row["growth_since_first"] = [
                    (s.size_diff, s.count_diff, s.traceback.format()[-6:]) for s in stats[:12]
                ]
        if trim:
            with contextlib.suppress(OSError, AttributeError):
                ctypes.CDLL("libc.so.6").malloc_trim(0)
            row["rss_after_trim_mb"] = _own_rss_mb()
        memory_rows.append(row)
        write_json(out_dir / "memory.json", memory_rows)

    def peak() -> None:
        if mode == "freeze":
            gc.freeze()
            return
        if mode == "memory":
            memory()
            return
        objects = gc.get_objects()
        counts = Counter(_kind(o) for o in objects)
        write_json(
            out_dir / "peak.json", {"objects": len(objects), "types": counts.most_common(120)}
        )
        del objects

    async def run() -> None:
        store = await open_store(db_url)
        key = (await create_key(store, name="bench", role="owner")).key
        # One key holds every reader: the per-key stream limit (ADR 0155) is a policy, not a cost.
        config = Config.from_mapping({"quotas": {"max_live_streams_per_key": 1_000_000}})
        app = create_app(Runtime(store, config), config)
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, dump)
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR2, peak)

        if trace:
            import tracemalloc

            tracemalloc.start(12)

        def ready(host: str, port: int) -> None:
            if thresholds != "-":
                gc.set_threshold(*(int(t) for t in thresholds.split(",")))
            passes.on = True
            if census:
                gc.set_debug(gc.DEBUG_SAVEALL)
            write_json(port_file, {"url": f"http://{host}:{port}", "key": key})

        try:
            await serve_app(app, host=LOOPBACK, port=0, log_level="warning", on_ready=ready)
        finally:
            await store.close()

    daemon_runner()(run())


@contextlib.contextmanager
def _server(
    db_url: str, out_dir: Path, thresholds: str, mode: str
) -> Iterator[tuple[subprocess.Popen[bytes], dict[str, Any]]]:
    port_file = out_dir / "port.json"
    args = [str(port_file), db_url, str(out_dir), thresholds or "-", mode]
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.gc_bursts", "--serve", *args], env=child_env(), cwd=str(REPO)
    )
    try:
        yield proc, _started(proc, port_file)
    finally:
        stop(proc)


# ----------------------------------------------------------------------------- client side


async def _stream_request(base: str, key: str, run_id: str, after: int = 0) -> bytes:
    ticket = (await _request(base, key, "POST", "/v1/tickets", {"run_id": run_id}))["ticket"]
    query = f"ticket={ticket}" + (f"&last_event_id={after}" if after else "")
    return f"GET /v1/runs/{run_id}/stream?{query} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()


def _last_id(reader: _Reader) -> int:
    """The last event id the reader has seen (its reads are kept raw until the end)."""
    for _, data in reversed(reader.reads):
        found = re.findall(rb"\nid: (\d+)", data)
        if found:
            return int(found[-1])
    return 0


async def _burst(
    base: str,
    key: str,
    run_id: str,
    readers: int,
    after: int,
    hold: float,
    peak: int | None = None,
) -> None:
    """``readers`` readers connect, stay ``hold`` seconds, then all leave; ``peak``: with all of
    them connected, have the daemon (this pid, in census mode) count its live objects first
    (``peak.json``)."""
    host, port = base.removeprefix("http://").split(":")
    request = await _stream_request(base, key, run_id, after)
    loop = asyncio.get_running_loop()
    visitors: list[_Reader] = []  # fan-out's readers: they stamp and keep what they read
    try:
        for i in range(readers):
            visitor = _Reader(request)
            visitors.append(visitor)
            await loop.create_connection(lambda v=visitor: v, host, int(port))  # type: ignore[misc]
            if i % 50 == 49:
                await asyncio.sleep(0)
        await asyncio.wait_for(asyncio.gather(*(v.connected.wait() for v in visitors)), 120)
        if peak is not None:
            os.kill(peak, signal.SIGUSR2)
            await asyncio.sleep(2.0)  # the count walks every object (census mode only)
        await asyncio.sleep(hold)
    finally:
        for visitor in visitors:
            visitor.close()


async def _session(
    base: str,
    key: str,
    pid: int,
    bursts: int,
    readers: int,
    replay: bool,
    hold: float,
    mode: str,
    stop_file: Path,
) -> dict[str, Any]:
    host, port = base.removeprefix("http://").split(":")
    prompt = f"words {stop_file} {GAP_S}"
    created = await _request(
        base, key, "POST", "/v1/runs", {"prompt": prompt, "model": "fake:words"}
    )
    run_id = created["run_id"]
    existing = _Reader(await _stream_request(base, key, run_id))
    loop = asyncio.get_running_loop()
    await loop.create_connection(lambda: existing, host, int(port))
    await asyncio.wait_for(existing.connected.wait(), 30)
    await asyncio.sleep(QUIET_S)
    windows: list[tuple[float, float]] = []
    rss = [rss_mb(pid)]
    for n in range(bursts):
        start = time.time()
        after = 0 if replay else _last_id(existing)
        await _burst(
            base, key, run_id, readers, after, hold, pid if mode == "census" and n == 0 else None
        )
        await asyncio.sleep(SETTLE_S)
        if mode == "freeze" or mode.startswith("memory"):
            os.kill(pid, signal.SIGUSR2)
            if mode.startswith("memory"):  # the figures (a snapshot walks every traced block)
                await asyncio.sleep(3.0 if "trace" in mode else 0.5)
        windows.append((start, time.time()))
        rss.append(rss_mb(pid))
        await asyncio.sleep(QUIET_S)
    stop_file.touch()  # noqa: ASYNC240 (a file's creation, once)
    await asyncio.wait_for(existing.done, 60)
    existing.close()
    return {"windows": windows, "rss_mb": rss, "deliveries": existing.deliveries()}


def _inside(at: float, windows: list[tuple[float, float]]) -> bool:
    return any(start <= at <= end for start, end in windows)


def _summary(session: dict[str, Any], server: dict[str, Any], readers: int) -> dict[str, Any]:
    windows = session["windows"]
    passes = [p for p in server["passes"] if _inside(p[0], windows)]
    out: dict[str, Any] = {"bursts": len(windows), "readers": readers}
    for generation in (0, 1, 2):
        mine = [p for p in passes if p[1] == generation]
        out[f"gen{generation}_passes"] = len(mine)
        out[f"gen{generation}_collected"] = sum(p[2] for p in mine)
        out[f"gen{generation}_cpu_ms_max"] = max((p[3] * 1000 for p in mine), default=0.0)
    cpu = sorted(p[3] * 1000 for p in passes) or [0.0]
    wall = sorted(p[4] * 1000 for p in passes) or [0.0]
    out |= {
        "pause_cpu_ms_max": cpu[-1],
        "pause_cpu_ms_p99": _pct(cpu, 0.99),
        "pause_wall_ms_max": wall[-1],
        "pause_wall_ms_p99": _pct(wall, 0.99),
        "pause_cpu_ms_total": sum(cpu),
        "pause_cpu_ms_per_burst": sum(cpu) / max(1, len(windows)),
    }
    during = sorted(a - ts for ts, a in session["deliveries"] if _inside(a, windows))
    outside = sorted(a - ts for ts, a in session["deliveries"] if not _inside(a, windows))
    out |= {
        "reader_ms_max_in_bursts": (during[-1] if during else 0.0) * 1000,
        "reader_ms_p99_in_bursts": (_pct(during, 0.99) if during else 0.0) * 1000,
        "reader_ms_p99_outside": (_pct(outside, 0.99) if outside else 0.0) * 1000,
        "rss_mb": [round(r, 1) for r in session["rss_mb"]],
        "frozen": server["frozen"],
    }
    if "peak" in server:
        out["peak"] = server["peak"]
    if "memory" in server:
        out["memory"] = server["memory"]
    if "garbage" in server:
        out["garbage"] = server["garbage"]
        out["garbage_types"] = server["garbage_types"]
    return out


def _pymalloc() -> dict[str, float]:
    """pymalloc's arenas now (``sys._debugmallocstats``, which writes to the C stderr): how many
    are allocated, and the bytes in use in their blocks against the bytes they take."""
    with tempfile.TemporaryFile() as out:
        saved = os.dup(2)
        try:
            os.dup2(out.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        text = out.read().decode()
    found = {
        name: re.search(pattern, text)
        for name, pattern in (
            ("arenas", r"# arenas allocated current\s*=\s*([\d,]+)"),
            ("in_blocks", r"# bytes in allocated blocks\s*=\s*([\d,]+)"),
            ("total", r"Total\s*=\s*([\d,]+)"),
        )
    }
    return {
        f"pymalloc_{name}": int(m.group(1).replace(",", "")) / (1 if name == "arenas" else 1e6)
        for name, m in found.items()
        if m is not None
    }


def _own_rss_mb() -> float:
    """This process's resident set (Linux ``/proc/self/statm``), in MB."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def _print(summary: dict[str, Any]) -> None:
    for n, row in enumerate(summary.get("memory", []), 1):
        line = f"burst {n}: RSS {row['rss_mb']:.1f} MB"
        if "pymalloc_arenas" in row:  # (not while tracemalloc traces: its hooks hide them)
            line += (
                f"; pymalloc {row['pymalloc_arenas']:.0f} arenas,"
                f" {row['pymalloc_in_blocks']:.1f} MB in blocks of {row['pymalloc_total']:.1f} MB"
            )
        if "traced_mb" in row:
            line += f"; traced {row['traced_mb']:.1f} MB"
        if "rss_after_trim_mb" in row:
            line += f"; RSS after malloc_trim {row['rss_after_trim_mb']:.1f} MB"
        print(line)
    if summary.get("memory", [{}])[-1].get("growth_since_first"):
        print("tracemalloc growth, last burst against the first:")
        for size, count, frames in summary["memory"][-1].get("growth_since_first", []):
            print(
                f"  {size / 1e3:+10.1f} kB {count:+7d} blocks  "
                + " | ".join(f.strip() for f in frames[-4:])
            )
    if "peak" in summary:
        print(
            f"live objects outside the freeze, all readers connected: {summary['peak']['objects']}"
        )
        for name, n in summary["peak"]["types"]:
            print(f"  {n:>8}  {name}")
    if "garbage" in summary:
        print(f"collector found {summary['garbage']} objects (census: DEBUG_SAVEALL, untimed)")
        for name, n in summary["garbage_types"]:
            print(f"  {n:>8}  {name}")
    for generation in (0, 1, 2):
        print(
            f"gen{generation}: {summary[f'gen{generation}_passes']:>4} passes in bursts, "
            f"{summary[f'gen{generation}_collected']:>8} freed, "
            f"longest {summary[f'gen{generation}_cpu_ms_max']:7.2f} ms CPU"
        )
    print(
        f"pause CPU  max {summary['pause_cpu_ms_max']:7.2f}  p99 {summary['pause_cpu_ms_p99']:7.2f}"
        f"  total {summary['pause_cpu_ms_total']:8.1f} ms"
        f" ({summary['pause_cpu_ms_per_burst']:.1f} ms a burst)"
    )
    print(
        f"pause wall max {summary['pause_wall_ms_max']:7.2f}  p99 {summary['pause_wall_ms_p99']:7.2f}"
    )
    print(
        f"existing reader append->delivery: in bursts max {summary['reader_ms_max_in_bursts']:.1f}"
        f" p99 {summary['reader_ms_p99_in_bursts']:.1f} ms; outside p99"
        f" {summary['reader_ms_p99_outside']:.1f} ms"
    )
    print(f"RSS after each burst (MB): {summary['rss_mb']}; frozen objects {summary['frozen']}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bursts", type=int, default=BURSTS)
    parser.add_argument("--readers", type=int, default=READERS)
    parser.add_argument(
        "--thresholds",
        default="",
        help="A,B,C: the collector's thresholds once the daemon listens (default: the daemon's)",
    )
    parser.add_argument(
        "--replay", action="store_true", help="a burst's readers replay the run from its start"
    )
    parser.add_argument(
        "--hold",
        type=float,
        default=0.0,
        help="seconds a burst's readers stay connected, reading the run, before they leave",
    )
    parser.add_argument("--census", action="store_true", help="count what the collector frees")
    parser.add_argument(
        "--freeze-after-burst", action="store_true", help="the daemon calls gc.freeze() after each"
    )
    parser.add_argument(
        "--memory",
        action="store_true",
        help="after each burst: RSS and pymalloc's arenas (the daemon's own figures)",
    )
    parser.add_argument(
        "--tracemalloc",
        action="store_true",
        help="with --memory: tracemalloc's growth by traceback since the first burst",
    )
    parser.add_argument(
        "--trim", action="store_true", help="with --memory: then malloc_trim(0), and RSS again"
    )
    parser.add_argument("--json", type=Path, help="write the summary here too")
    parser.add_argument("--serve", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args([] if argv is None else argv)
    if args.serve:
        port_file, db_url, out_dir, thresholds, mode = args.serve
        _serve(Path(port_file), db_url, Path(out_dir), thresholds, mode)
        return {}
    mode = (
        "census"
        if args.census
        else "freeze"
        if args.freeze_after_burst
        else "memory" + ("-trace" if args.tracemalloc else "") + ("-trim" if args.trim else "")
        if args.memory
        else "time"
    )
    with tempfile.TemporaryDirectory() as tmp:
        out_dir = Path(tmp)
        db_url = f"sqlite:///{out_dir / 'bursts.db'}"
        with _server(db_url, out_dir, args.thresholds, mode) as (proc, info):
            stop_file = out_dir / f"stop-{uuid.uuid4().hex}"
            session = asyncio.run(
                _session(
                    info["url"],
                    info["key"],
                    proc.pid,
                    args.bursts,
                    args.readers,
                    args.replay,
                    args.hold,
                    mode,
                    stop_file,
                )
            )
            os.kill(proc.pid, signal.SIGUSR1)
            target = out_dir / "server.json"
            deadline = time.monotonic() + 60
            while not target.exists():
                if time.monotonic() > deadline:
                    raise TimeoutError("the bench server wrote no figures")
                time.sleep(0.05)
            server = json.loads(target.read_text())
            if (out_dir / "memory.json").exists():
                server["memory"] = json.loads((out_dir / "memory.json").read_text())
            if (out_dir / "peak.json").exists():
                server["peak"] = json.loads((out_dir / "peak.json").read_text())
    summary = _summary(session, server, args.readers)
    _print(summary)
    if args.json:
        write_json(args.json, summary)
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
