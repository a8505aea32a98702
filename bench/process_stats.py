"""A bench server's state between phases: memory, garbage collector, live objects, files.

``daemon_bench --repeat N`` runs each phase N times against one daemon and prints these figures
after each repetition, so a daemon that slows down as it lives (more runs done, a larger
database, objects kept per finished run, longer collections) shows as a trend next to its
figures rather than as a gap between two separate bench runs.

The server side (:func:`install`, in the daemon's process when ``BENCH_STATS`` names a
directory) counts the collector's passes, their time and the objects they freed through
``gc.callbacks`` and, on ``SIGUSR1``, writes a snapshot; the bench side (:func:`snapshot`)
sends the signal and reads it. The snapshot walks ``gc.get_objects()``, which takes a few tens
of milliseconds: it runs between repetitions, outside the timed runs.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from bench.atomic import write_json

__all__ = ["GcClock", "file_sizes", "install", "rss_mb", "snapshot"]


def rss_mb(pid: int) -> float:
    """The process's resident set, in MB (``VmRSS`` of ``/proc/PID/status``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def file_sizes(db_path: Path) -> dict[str, float]:
    """The SQLite file's and its WAL's sizes, in MB (0 when absent)."""

    def size(path: Path) -> float:
        return path.stat().st_size / 2**20 if path.exists() else 0.0

    return {"db_mb": size(db_path), "wal_mb": size(db_path.with_name(db_path.name + "-wal"))}


class GcClock:
    """The collector's passes per generation and the CPU time they took in this process, from
    ``gc.callbacks`` (installed on creation). CPU, not wall: on a shared machine a pass's wall
    time also counts the moments the process was not running at all."""

    def __init__(self) -> None:
        self.passes = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self.collected = [0, 0, 0]
        self._started = 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.thread_time()  # the collecting thread's: start and stop share it
            return
        generation = info["generation"]
        self.passes[generation] += 1
        self.seconds[generation] += time.thread_time() - self._started
        self.collected[generation] += info["collected"]


def install(directory: str) -> None:
    """In the server, on its running loop: count collections and their time, and write a
    snapshot into ``directory`` on each ``SIGUSR1`` (``stats-<n>.json``, n from 1)."""
    clock = GcClock()
    passes, seconds, collected = clock.passes, clock.seconds, clock.collected
    written = [0]

    def write() -> None:
        objects = gc.get_objects()
        types = collections.Counter(type(o).__qualname__ for o in objects)
        written[0] += 1
        data = {
            "gc_passes": list(passes),
            "gc_ms": [s * 1000 for s in seconds],
            "gc_collected": list(collected),
            "gc_threshold": list(gc.get_threshold()),
            "objects": len(objects),
            "types": {name: n for name, n in types.items() if n >= 50},
            "gc_counts": list(gc.get_count()),
            "tasks": len(asyncio.all_tasks()),
        }
        del objects
        target = Path(directory) / f"stats-{written[0]}.json"
        write_json(target, data)

    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, write)


def snapshot(pid: int, directory: Path, n: int, timeout: float = 30.0) -> dict[str, Any]:
    """Ask the server ``pid`` for its ``n``-th snapshot (``SIGUSR1``) and return it."""
    target = directory / f"stats-{n}.json"
    os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + timeout
    while not target.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {target.name} from process {pid}")
        time.sleep(0.02)
    data: dict[str, Any] = json.loads(target.read_text())
    data["rss_mb"] = rss_mb(pid)
    return data
