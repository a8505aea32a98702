"""What an idle daemon costs: CPU per second of a ``thoughtgate serve`` that has nothing to do.

A daemon on a developer's laptop, or many replicas on a shared host, spend most of their life
idle, so what they burn then is paid for hours (ADR 0057). Each variant is a real ``thoughtgate
serve`` subprocess -- SQLite with durable runs (the default), SQLite with ``durability.enabled =
false``, and PostgreSQL with durable runs when the test server answers -- started on a fresh store
with no run and no client. After :data:`SETTLE_S` (past start-up, including DBOS's scheduler,
which polls every second for its first minute) the bench reads each process's CPU time over
:data:`WINDOW_S`: the sum of its threads' on-CPU nanoseconds (``/proc/PID/task/*/schedstat``), and
their voluntary context switches (each one a sleep that ended: a wake-up). The variants run at
the same time, so one window covers them all; idle, they hardly compete. Beside them, the
window's ``host_steal`` and ``host_other_load`` (the share of all CPU busy outside these
daemons: another process's work makes each wake-up dearer, ADR 0050).

Figures: ``idle_cpu_ms_per_s_<variant>`` (CPU milliseconds per wall second; 10 ms/s is 1 % of a
core) and ``idle_wakeups_per_s_<variant>``. Targets (ADR 0057): a durable daemon at most
:data:`TARGET_DURABLE_MS_PER_S`, what is left being the daemon's queue poll at
``durability.idle_poll_interval_s`` and DBOS's queue manager's wake every second (its list of
queues reused, ADR 0067; on PostgreSQL DBOS's background jobs run once a minute without their lock
since ADR 0075); a daemon without durable runs at most :data:`TARGET_PLAIN_MS_PER_S`.

``python -m bench.idle_bench`` prints the rows; ``TG_BENCH_IDLE_SETTLE_S`` and
``TG_BENCH_IDLE_WINDOW_S`` change the two durations.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.emulator_process import stop
from bench.environment import PG_URL, drop_schemas, free_port, throwaway_schema
from bench.host_steal import run_row, sample, since

Row = dict[str, Any]
SETTLE_S = float(os.environ.get("TG_BENCH_IDLE_SETTLE_S", "65"))
WINDOW_S = float(os.environ.get("TG_BENCH_IDLE_WINDOW_S", "30"))
TARGET_DURABLE_MS_PER_S = 5.0
TARGET_PLAIN_MS_PER_S = 1.0
NOTES = [
    "Idle daemon: a real `thoughtgate serve` per variant on a fresh store, no run and no client; "
    f"CPU and wake-ups over {WINDOW_S:.0f} s, starting {SETTLE_S:.0f} s after start-up (ADR 0057).",
]


@dataclass(frozen=True)
class Usage:
    """A process's CPU nanoseconds and voluntary context switches, all threads, at one time."""

    cpu_ns: int
    wakeups: int
    at: float


def usage(pid: int) -> Usage:
    """Read ``pid``'s threads now (threads that ended meanwhile are left out: a daemon keeps its
    threads, so none of the window's CPU is lost that way)."""
    cpu = wakeups = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            cpu += int((task / "schedstat").read_text().split()[0])
            for line in (task / "status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches:"):
                    wakeups += int(line.split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return Usage(cpu, wakeups, time.monotonic())


def _postgres_schema() -> str | None:
    """A fresh schema on the test server for the PostgreSQL variant, or ``None`` when it does not
    answer (the variant is left out)."""
    try:
        import psycopg
    except ImportError:
        return None
    try:
        with psycopg.connect(PG_URL, connect_timeout=3, autocommit=True) as conn:
            conn.execute("SELECT 1")
    except Exception:  # noqa: BLE001 - no server: no PostgreSQL row
        return None
    return throwaway_schema("idle")


def _serve(db: str, *, durable: bool, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "THOUGHTGATE_DURABILITY__ENABLED": "true" if durable else "false"}
    cmd = [sys.executable, "-m", "thoughtgate", "serve", "--db", db, "--port", str(free_port())]
    cmd += ["--no-bootstrap-key", "--log-level", "warning"]
    with log.open("wb") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)


def measure(settle_s: float = SETTLE_S, window_s: float = WINDOW_S) -> list[Row]:
    with tempfile.TemporaryDirectory(prefix="tg-idle-") as tmp:
        root = Path(tmp)
        variants: dict[str, tuple[str, bool]] = {
            "sqlite_durable": (f"sqlite:///{root / 'durable.db'}", True),
            "sqlite_plain": (f"sqlite:///{root / 'plain.db'}", False),
        }
        schema = _postgres_schema()
        if schema is not None:
            variants["postgres_durable"] = (f"{PG_URL}?schema={schema}", True)
        processes = {
            name: _serve(db, durable=durable, log=root / f"{name}.log")
            for name, (db, durable) in variants.items()
        }
        try:
            time.sleep(settle_s)
            for name, process in processes.items():
                if process.poll() is not None:
                    log = (root / f"{name}.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"{name}: the daemon exited at start-up:\n{log}")
            host = sample(p.pid for p in processes.values())
            before = {name: usage(p.pid) for name, p in processes.items()}
            time.sleep(window_s)
            after = {name: usage(p.pid) for name, p in processes.items()}
            share = since(host)
        finally:
            for process in processes.values():
                stop(process)
            if schema is not None:
                drop_schemas(schema)
    rows: list[Row] = []
    for name in processes:
        elapsed = after[name].at - before[name].at
        ms_per_s = (after[name].cpu_ns - before[name].cpu_ns) / 1e6 / elapsed
        target = TARGET_PLAIN_MS_PER_S if name == "sqlite_plain" else TARGET_DURABLE_MS_PER_S
        rows.append(
            {
                "name": f"idle_cpu_ms_per_s_{name}",
                "value": round(ms_per_s, 2),
                "unit": "ms/s",
                "target": f"<= {target:g}",
                "ok": ms_per_s <= target,
            }
        )
        wakeups = (after[name].wakeups - before[name].wakeups) / elapsed
        rows.append(
            {
                "name": f"idle_wakeups_per_s_{name}",
                "value": round(wakeups, 1),
                "unit": "/s",
                "target": None,
                "ok": None,
            }
        )
    rows.append(run_row(share))
    other = None if share is None else share.other_pct
    shown = "n/a" if other is None else round(other, 2)
    rows.append(
        {"name": "host_other_load", "value": shown, "unit": "%", "target": None, "ok": None}
    )
    return rows


def main() -> list[Row]:
    return measure()


if __name__ == "__main__":
    for row in main():
        print(json.dumps(row))
