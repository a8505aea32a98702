"""The pages each durable commit on a run's path writes, counted in the daemon's WAL. Not a test.

ADR 0115's method, kept runnable (ADR 0117): the daemon bench's own server (``fake:bench``, a
SQLite file, not durable) started with every store connection opened under
``PRAGMA wal_autocheckpoint = 0`` (the WAL keeps every frame of the measurement) and the
writer's statements traced (``set_trace_callback``). ``RUNS`` runs go through it one at a time
(``--concurrency 1``: each commit holds one kind of write) or ten at a time. The database and its
WAL are copied while the server lives; each WAL frame's header gives its page, a commit frame ends
a transaction, and SQLite's ``dbstat`` names each page's table or index. The traced ``COMMIT``\\ s
pair one for one with the WAL's commits, so each commit gets its kind from its statements:

* ``admission``: the run inserted (``runs``, ``tasks``, ``run_specs``, the opening events);
* ``task started``: the run set ``running``;
* ``terminal``: the run closed (``closed_at``), with the task's end;
* ``deltas``: anything else (a batch of reasoning deltas and ``last_seq``).

Run ``PYTHONPATH=src python -m bench.commit_pages [--runs N] [--concurrency C]``; it prints the
commits, pages a commit and a run, and per kind the pages by table and index.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import shutil
import sqlite3
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["main", "wal_commits"]

_TRACE_ENV = "COMMIT_PAGES_TRACE"


def _patched_serve(port_file: str, db_url: str, trace: str) -> None:
    """The server process: the daemon bench's, every store connection without autocheckpoint and
    its writes traced to ``trace``."""
    from bench import daemon_bench
    from thoughtgate.store import sqlite as sqlite_store
    from thoughtgate.store import sqlite_schema

    out = open(trace, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 -- lives with the process
    original = sqlite_schema.connect

    def traced(statement: str) -> None:
        head = statement.lstrip()[:6].upper()
        if head in ("INSERT", "UPDATE", "DELETE", "COMMIT", "BEGIN ", "REPLAC"):
            out.write(json.dumps(statement) + "\n")

    def connect(path: Path, **kwargs: Any) -> sqlite3.Connection:
        conn = original(path, **kwargs)
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        conn.set_trace_callback(traced)
        return conn

    sqlite_schema.connect = connect
    sqlite_store.connect = connect  # type: ignore[attr-defined]
    daemon_bench._serve(Path(port_file), db_url, None, None)


def wal_commits(wal: Path) -> list[list[int]]:
    """The pages of each committed transaction in ``wal`` (frames whose salts match its
    header's), in order."""
    data = wal.read_bytes()
    page_size = struct.unpack(">I", data[8:12])[0]
    salts = data[16:24]
    commits: list[list[int]] = []
    pages: list[int] = []
    at = 32
    while at + 24 + page_size <= len(data):
        page, size_after = struct.unpack(">II", data[at : at + 8])
        if data[at + 8 : at + 16] != salts:
            break
        pages.append(page)
        if size_after:
            commits.append(pages)
            pages = []
        at += 24 + page_size
    return commits


def _owners(db: Path) -> dict[int, str]:
    conn = sqlite3.connect(db)
    try:
        return {int(p): str(n) for n, p in conn.execute("SELECT name, pageno FROM dbstat")}
    finally:
        conn.close()


def _kinds(trace: Path) -> list[set[str]]:
    """Each traced transaction's kinds, in commit order."""
    kinds: list[set[str]] = []
    current: set[str] = set()
    for line in trace.read_text(encoding="utf-8").splitlines():
        statement = json.loads(line)
        upper = statement.upper()
        if upper.startswith("COMMIT"):
            kinds.append(current or {"other"})
            current = set()
        elif "INTO RUNS " in upper:
            current.add("admission")
        elif upper.startswith("UPDATE RUNS SET STATUS = ") and " AND STATUS = " in upper:
            current.add("task started")
        elif upper.startswith("UPDATE RUNS") and "CLOSED_AT = " in upper:
            current.add("terminal")
        elif "SET LEASE_EXPIRES_AT = " in upper:
            current.add("lease")
        elif "INTO EVENTS " in upper or upper.startswith("UPDATE RUNS SET LAST_SEQ"):
            current.add("deltas")
    return kinds


def _kind(kinds: set[str]) -> str:
    for name in ("admission", "terminal", "task started", "lease", "deltas"):
        if name in kinds:
            return name
    return "other"


async def _runs(url: str, key: str, concurrency: int, total: int) -> dict[str, Any]:
    from bench.daemon_bench import _phase

    return await _phase(url, key, concurrency, total, "fake:bench", lambda: 0.0)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--serve", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        _patched_serve(*args.serve)
        return {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        db, port_file, trace = tmp / "pages.db", tmp / "port.json", tmp / "trace.jsonl"
        serve = ("--serve", str(port_file), f"sqlite:///{db}", str(trace))
        proc = subprocess.Popen([sys.executable, "-m", "bench.commit_pages", *serve])
        try:
            deadline = time.monotonic() + 60
            while not port_file.exists() or not port_file.read_text():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the server did not start")
                time.sleep(0.05)
            time.sleep(0.1)
            info = json.loads(port_file.read_text())
            before = len(wal_commits(Path(f"{db}-wal")))
            stats = asyncio.run(_runs(info["url"], info["key"], args.concurrency, args.runs))
            time.sleep(0.5)  # the last runs' ends are committed before their streams close
            copy = tmp / "copy.db"
            shutil.copyfile(f"{db}-wal", f"{copy}-wal")
            shutil.copyfile(db, copy)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        commits = wal_commits(Path(f"{copy}-wal"))
        kinds = _kinds(trace)
        owners = _owners(copy)
    if len(kinds) != len(commits):
        raise RuntimeError(f"{len(commits)} WAL commits but {len(kinds)} traced")
    warm_runs = min(3, args.concurrency)  # _phase's warm-up runs (one a connection), measured too
    measured = list(zip(commits[before:], kinds[before:], strict=True))
    runs = stats["runs"] + warm_runs
    by_kind: dict[str, list[list[int]]] = collections.defaultdict(list)
    for pages, statement_kinds in measured:
        by_kind[_kind(statement_kinds)].append(pages)
    frames = sum(len(p) for p, _ in measured)
    result = {
        "runs": runs,
        "commits": len(measured),
        "pages": frames,
        "pages_per_commit": frames / max(1, len(measured)),
        "pages_per_run": frames / max(1, runs),
        "kinds": {},
    }
    print(
        f"{runs} runs at {args.concurrency}: {len(measured)} commits, {frames} pages, "
        f"{frames / max(1, len(measured)):.2f} a commit, {frames / max(1, runs):.2f} a run"
    )
    every: collections.Counter[str] = collections.Counter(
        owners.get(p, "page 1" if p == 1 else "(freed)") for pages, _ in measured for p in pages
    )
    result["owners_per_run"] = {name: n / max(1, runs) for name, n in every.items()}
    print(
        "  a run: "
        + ", ".join(f"{name} {n / max(1, runs):.2f}" for name, n in sorted(every.items()))
    )
    for kind, groups in sorted(by_kind.items()):
        owner_pages: collections.Counter[str] = collections.Counter()
        for pages in groups:
            owner_pages.update(owners.get(p, "page 1" if p == 1 else "(freed)") for p in pages)
        mean = sum(len(p) for p in groups) / len(groups)
        shown = ", ".join(
            f"{name} {n / len(groups):.2f}" for name, n in sorted(owner_pages.items())
        )
        result["kinds"][kind] = {"commits": len(groups), "pages": mean}
        print(f"  {kind}: {len(groups)} commits, {mean:.2f} pages: {shown}")
    return result


if __name__ == "__main__":
    main()
