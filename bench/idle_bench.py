"""What an idle daemon costs: CPU per second of a ``thoughtgate serve`` that has nothing to do.

A daemon on a developer's laptop, or many replicas on a shared host, spend most of their life
idle, so what they burn then is paid for hours (ADR 0057). Each variant is a real ``thoughtgate
serve`` subprocess -- SQLite with durable runs (the default), SQLite with ``durability.enabled =
false``, and PostgreSQL with durable runs when the test server answers -- started on a fresh store
with no run and no client. :data:`SETTLE_S` after the last of them is listening -- which a daemon
says once its start-up, DBOS's launch included, is done; so past the first minute after DBOS's
launch, when its scheduler polls every second, however long a start-up took (a slow PostgreSQL, a
busy host) -- the bench reads each process's CPU time over :data:`WINDOW_S`: the sum of its
threads' on-CPU nanoseconds (``/proc/PID/task/*/schedstat``), and their voluntary context
switches (each one a sleep that ended: a wake-up). The variants run at the same time, so one
window covers them all; idle, they hardly compete. Beside them, the
window's ``host_steal`` and ``host_other_load`` (the share of all CPU busy outside these
daemons: another process's work makes each wake-up dearer, ADR 0050).

Figures: ``idle_cpu_ms_per_s_<variant>`` (CPU milliseconds per wall second; 10 ms/s is 1 % of a
core) and ``idle_wakeups_per_s_<variant>``. Targets (ADR 0057): a durable daemon at most
:data:`TARGET_DURABLE_MS_PER_S`, what is left being the daemon's queue poll at
``durability.idle_poll_interval_s`` and DBOS's queue manager's wake every second (its list of
queues reused, ADR 0067; on PostgreSQL DBOS's background jobs run once a minute without their lock
since ADR 0075); a daemon without durable runs at most :data:`TARGET_PLAIN_MS_PER_S`.

``python -m bench.idle_bench`` prints the rows; ``TG_BENCH_IDLE_SETTLE_S`` and
``TG_BENCH_IDLE_WINDOW_S`` change the two durations, ``TG_BENCH_IDLE_START_S`` how long a daemon
may take to start.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.emulator_process import stop
from bench.environment import PG_URL, drop_schemas, free_port, throwaway_schema
from bench.host_steal import run_row, sample, since

Row = dict[str, Any]
SETTLE_S = float(os.environ.get("TG_BENCH_IDLE_SETTLE_S", "61"))
"""From the last daemon listening to the window: DBOS's scheduler polls every second for the first
60 s after its launch (its last wait of that minute ends a second later), and the daemon says it
listens after DBOS's launch. 65 s from the process's start, before: a start-up of more than 4 s
(three daemons starting at once on a 2-core host take 5 to 14) put DBOS's first minute inside the
window."""
WINDOW_S = float(os.environ.get("TG_BENCH_IDLE_WINDOW_S", "30"))
START_S = float(os.environ.get("TG_BENCH_IDLE_START_S", "300"))
"""How long a daemon may take to be listening (a PostgreSQL one sets up its schemas first)."""
LISTENING = b"thoughtgate listening on "
"""What ``thoughtgate serve`` prints once its start-up, the durable engine's launch included, is
done (``--log-level warning`` leaves it in: it is no log record)."""
TARGET_DURABLE_MS_PER_S = 5.0
TARGET_PLAIN_MS_PER_S = 1.0
NOTES = [
    "Idle daemon: a real `thoughtgate serve` per variant on a fresh store, no run and no client; "
    f"CPU and wake-ups over {WINDOW_S:.0f} s, starting {SETTLE_S:.0f} s after the last daemon "
    "finished its start-up, DBOS's launch included (ADR 0057).",
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


@dataclass
class Daemon:
    """A ``thoughtgate serve`` of one variant: its output goes to ``log``, read as it comes so
    that ``listening_at`` (``time.monotonic()``) is set the moment it says it listens."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path
    listening_at: float | None = None
    said: threading.Event = field(default_factory=threading.Event)
    """Set once it listens, or once its output ends (it exited)."""
    reader: threading.Thread | None = None

    @classmethod
    def watch(cls, name: str, process: subprocess.Popen[bytes], log: Path) -> Daemon:
        """``process`` (its output a pipe), its output copied to ``log`` from now on."""
        daemon = cls(name, process, log)
        daemon.reader = threading.Thread(target=daemon.copy_output, name=f"output-{name}")
        daemon.reader.daemon = True
        daemon.reader.start()
        return daemon

    def copy_output(self) -> None:
        assert self.process.stdout is not None
        with self.process.stdout as output, self.log.open("wb") as out:
            for line in output:
                out.write(line)
                out.flush()
                if self.listening_at is None and LISTENING in line:
                    self.listening_at = time.monotonic()
                    self.said.set()
        self.said.set()

    def listening(self, deadline: float) -> float:
        """When it began to listen; raises when it exited first or is not listening by
        ``deadline``, with what it printed."""
        self.said.wait(max(0.0, deadline - time.monotonic()))
        if self.listening_at is None:
            if self.said.is_set():  # its output ended: it exited, or is about to
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.process.wait(timeout=10)
            code = self.process.poll()
            why = f"exited with {code}" if code is not None else f"not listening after {START_S} s"
            printed = self.log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{self.name}: the daemon {why} at start-up:\n{printed}")
        return self.listening_at


def _serve(name: str, db: str, *, durable: bool, log: Path) -> Daemon:
    env = {**os.environ, "THOUGHTGATE_DURABILITY__ENABLED": "true" if durable else "false"}
    cmd = [sys.executable, "-m", "thoughtgate", "serve", "--db", db, "--port", str(free_port())]
    cmd += ["--no-bootstrap-key", "--log-level", "warning"]
    process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    return Daemon.watch(name, process, log)


def settle(daemons: list[Daemon], settle_s: float, start_s: float = START_S) -> None:
    """Wait until ``settle_s`` after the last of ``daemons`` is listening."""
    deadline = time.monotonic() + start_s
    last = max(d.listening(deadline) for d in daemons)
    time.sleep(max(0.0, last + settle_s - time.monotonic()))


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
        daemons = [
            _serve(name, db, durable=durable, log=root / f"{name}.log")
            for name, (db, durable) in variants.items()
        ]
        processes = {d.name: d.process for d in daemons}
        try:
            settle(daemons, settle_s)
            for name, process in processes.items():
                if process.poll() is not None:
                    log = (root / f"{name}.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"{name}: the daemon exited after start-up:\n{log}")
            host = sample(p.pid for p in processes.values())
            before = {name: usage(p.pid) for name, p in processes.items()}
            time.sleep(window_s)
            after = {name: usage(p.pid) for name, p in processes.items()}
            share = since(host)
        finally:
            for daemon in daemons:
                stop(daemon.process)
                if daemon.reader is not None:
                    daemon.reader.join(timeout=10)  # its log is in the directory removed next
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
