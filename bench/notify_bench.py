"""PostgreSQL appends from N concurrent connections, with and without the wake-up NOTIFY (ADR 0132).

Not a test. ``PYTHONPATH=src:. python -m bench.notify_bench --code A=SRC_DIR --code B=SRC_DIR``
runs every arm in a fresh process on a fresh throwaway schema, alternating the codes (and the
variant ``none``, the first code with no NOTIFY at all) within each repetition:

- ``throughput``: N connections of one ``PostgresStore`` (``pool_size = N``) each ``append_one``
  to a run of its own for ``--seconds``; optionally a second process ``LISTEN``s on the store's
  channel and reads every notification. Server CPU is ``/proc`` user + system time of every
  backend of the store (pool, notifier) and of the listener, counted again after the run so
  connections opened meanwhile count too.
- ``runs`` (ADR 0134): as ``throughput``, but each connection creates a run and ends it
  (``create_run``, ``finish_run`` with one terminal event), over and over: the run list's
  change number and its ``NOTIFY`` in both transactions. Variant ``nolist`` is the first code with
  no run-list ``NOTIFY`` (``_NEXT_CHANGE`` without ``pg_notify``): the most that moving it out of
  the transaction could gain.
- ``latency``: one store appends one event every 20 ms; a second store (another replica, in the
  same process) follows the run's tail with its safety poll at 60 s, so only a NOTIFY delivers.
  Latency: from before the append's call to the reader's receipt.

Prints one JSON line per arm and a summary: medians (least-greatest) and per-repetition ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.environment import PG_URL, REPO, drop_schemas, throwaway_schema

__all__ = ["main"]

TICK = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


async def _backends(store: Any, schema: str) -> list[int]:
    async with store._conn("bench") as conn:
        cur = await conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name LIKE %s",
            (f"%{schema}"[:63],),
        )
        return [int(r[0]) for r in await cur.fetchall()]


def _no_run_list_notify(store: Any) -> None:
    """The run list's changes without their ``NOTIFY``: before ADR 0140 the change number's
    ``pg_notify`` (its parameters kept), after it the notifier's wake-up after the commit."""
    from thoughtgate.store import postgres

    if "pg_notify" in postgres._NEXT_CHANGE:
        postgres._NEXT_CHANGE = (
            "UPDATE run_changes SET last_change = last_change + 1 "
            "RETURNING last_change, %s::text, %s::text"
        )
    else:
        store._notifier.wake = lambda payload: None


def _no_notify(store: Any) -> None:
    """No NOTIFY at all: not in the append's statement, not after it."""
    from thoughtgate.store import postgres

    for key, statement in postgres._STATEMENTS.items():
        postgres._STATEMENTS[key] = re.sub(r"pg_notify\(%\(channel\)s, [^\n]*\)", "NULL", statement)
    notifier = getattr(store, "_notifier", None)
    if notifier is not None:
        notifier.committed = lambda *_: None


async def _throughput(
    schema: str,
    n: int,
    seconds: float,
    variant: str,
    *,
    runs_mode: bool = False,
    sample: bool = False,
) -> dict[str, Any]:
    from thoughtgate.events.schema import EventType, NewEvent
    from thoughtgate.store.base import RunEnding
    from thoughtgate.store.postgres import PostgresStore
    from thoughtgate.store.records import RunRecord

    store = await PostgresStore.open(PG_URL, schema=schema, pool_size=n)
    if variant == "none":
        _no_notify(store)
    elif variant == "nolist":
        _no_run_list_notify(store)
    elif variant.startswith("window="):
        store._notifier.window_s = float(variant.removeprefix("window="))
    runs = [f"run_bench_{i}" for i in range(n)]
    for run_id in runs:
        await store.create_run(RunRecord(run_id, "p"))
    event = NewEvent("message.delta", {"text": "a word"})
    await asyncio.gather(*(store.append_one(r, event) for r in runs))  # opens the connections
    await asyncio.sleep(0.2)
    pids = await _backends(store, schema)
    cpu0 = {p: _cpu_s(p) for p in pids}
    stop = time.perf_counter() + seconds
    counts = [0] * n

    ended = [NewEvent(EventType.RUN_SETTLEMENT_COMPLETED, {"status": "completed"})]

    async def worker(i: int) -> None:
        while time.perf_counter() < stop:
            if runs_mode:  # one run made and ended: two run-list changes
                run_id = f"{runs[i]}_{counts[i]}"
                await store.create_run(RunRecord(run_id, "p", status="running"))
                await store.finish_run(run_id, ended, RunEnding("completed"))
            else:
                await store.append_one(runs[i], event)
            counts[i] += 1

    waits: dict[str, int] = {}
    sampler = asyncio.create_task(_sample_waits(schema, stop, waits)) if sample else None
    started = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(n)))
    elapsed = time.perf_counter() - started
    if sampler is not None:
        await sampler
    pids = await _backends(store, schema)
    server = sum(_cpu_s(p) - cpu0.get(p, 0.0) for p in pids)
    sends = getattr(getattr(store, "_notifier", None), "sends", None)
    await store.close()
    total = sum(counts)
    row: dict[str, Any] = {"server_us": server / total * 1e6, "sends": sends}
    row["runs_s" if runs_mode else "events_s"] = total / elapsed
    if waits:
        seen = sum(waits.values())
        row["waits"] = {
            k: round(v / seen, 3) for k, v in sorted(waits.items(), key=lambda kv: -kv[1])
        }
    return row


async def _sample_waits(schema: str, stop: float, waits: dict[str, int]) -> None:
    """Every 5 ms until ``stop``: what each of the store's backends is doing (``--sample``),
    counted by ``wait_event_type:wait_event`` (``CPU`` when it waits for nothing)."""
    import psycopg

    query = (
        "SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU') FROM pg_stat_activity "
        "WHERE application_name = %s AND state = 'active'"
    )
    async with await psycopg.AsyncConnection.connect(PG_URL, autocommit=True) as conn:
        while time.perf_counter() < stop:
            for (what,) in await (
                await conn.execute(query, (f"thoughtgate:{schema}"[:63],))
            ).fetchall():
                waits[what] = waits.get(what, 0) + 1
            await asyncio.sleep(0.005)


async def _latency(schema: str, events: int) -> dict[str, Any]:
    from thoughtgate.events.schema import EventType, NewEvent
    from thoughtgate.store.postgres import PostgresStore
    from thoughtgate.store.records import RunRecord

    writer = await PostgresStore.open(PG_URL, schema=schema, pool_size=2)
    reader = await PostgresStore.open(PG_URL, schema=schema, pool_size=2)
    reader.safety_poll = reader.poll_interval = 60.0
    await writer.create_run(RunRecord("run_lat", "p"))
    sent: dict[int, float] = {}
    got: dict[int, float] = {}

    async def follow() -> None:
        async for e in reader.tail("run_lat"):
            got[e.seq] = time.perf_counter()

    tail = asyncio.create_task(follow())
    for _ in range(1000):
        if reader._listener.healthy:
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)
    for i in range(events):
        t = time.perf_counter()
        out = await writer.append_one("run_lat", NewEvent("message.delta", {"i": i}))
        sent[out.seq] = t
        await asyncio.sleep(0.02)
    await writer.append_one("run_lat", NewEvent(EventType.RUN_FAILED))
    await asyncio.wait_for(tail, 30)
    ms = sorted((got[s] - sent[s]) * 1000 for s in sent)
    await writer.close()
    await reader.close()
    return {"p50_ms": ms[len(ms) // 2], "p99_ms": ms[int(len(ms) * 0.99) - 1], "max_ms": ms[-1]}


_LISTENER = """
import sys, psycopg
conn = psycopg.connect(sys.argv[1], autocommit=True, application_name="bench-listen:" + sys.argv[3])
conn.execute('LISTEN "' + sys.argv[2] + '"')
print("ready", flush=True)
for _ in conn.notifies():
    pass
"""


def _arm(src: str, args: list[str]) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": f"{src}:{REPO}"}
    out = subprocess.run(
        [sys.executable, "-m", "bench.notify_bench", "--arm", *args],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _one(
    src: str, mode: str, n: int, listener: bool, seconds: float, variant: str
) -> dict[str, Any]:
    schema = throwaway_schema("notify")
    proc = None
    try:
        if listener:
            from thoughtgate.store.postgres import channel_name

            proc = subprocess.Popen(
                [sys.executable, "-c", _LISTENER, PG_URL, channel_name(schema), schema],
                stdout=subprocess.PIPE,
                text=True,
            )
            assert proc.stdout is not None
            proc.stdout.readline()
        args = [mode, schema, str(n), str(seconds), variant]  # latency: seconds = events
        return _arm(src, args)  # the listener's backend counts: its name ends with the schema
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait()
        drop_schemas(schema)


def _summary(rows: list[dict[str, Any]]) -> None:
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["mode"], r["n"], r["listener"], r["arm"]), []).append(r)
    for key, rs in sorted(groups.items(), key=lambda kv: str(kv[0])):
        for field in ("events_s", "runs_s", "server_us", "p50_ms", "p99_ms", "sends"):
            vals = [r[field] for r in rs if r.get(field) is not None]
            if vals:
                print(
                    key,
                    field,
                    f"{statistics.median(vals):.1f} ({min(vals):.1f}-{max(vals):.1f})",
                    flush=True,
                )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arm", nargs=5, help=argparse.SUPPRESS)
    parser.add_argument("--code", action="append", default=[], help="LABEL=SRC_DIR")
    parser.add_argument("--mode", choices=("throughput", "runs", "latency"), default="throughput")
    parser.add_argument("--n", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--listener", choices=("no", "yes", "both"), default="both")
    parser.add_argument(
        "--seconds", type=float, default=3.0, help="a throughput arm's length; latency: events"
    )
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        help="LABEL=window=SECONDS or LABEL=nolist, with the first code",
    )
    parser.add_argument("--no-none", action="store_true", help="leave out the variant `none`")
    parser.add_argument(
        "--sample",
        action="store_true",
        help="sample the store's backends' wait events every 5 ms (slows every arm)",
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.arm:
        mode, schema, n, seconds, variant = args.arm
        if mode == "latency":
            row = asyncio.run(_latency(schema, int(float(seconds))))
        else:
            work = _throughput(
                schema,
                int(n),
                float(seconds),
                variant.removesuffix("+sample"),
                runs_mode=mode == "runs",
                sample=variant.endswith("+sample"),
            )
            row = asyncio.run(work)
        print(json.dumps(row))
        return
    codes = [c.split("=", 1) for c in args.code] or [["here", str(REPO / "src")]]
    arms = [(label, src, "as-built") for label, src in codes]
    arms += [(label, codes[0][1], v) for label, v in (x.split("=", 1) for x in args.variant)]
    if not args.no_none and args.mode == "throughput":
        arms.append(("none", codes[0][1], "none"))
    listeners = {"no": [False], "yes": [True], "both": [False, True]}[args.listener]
    rows: list[dict[str, Any]] = []
    for rep in range(args.reps):
        for n in args.n:
            for listener in listeners:
                order = arms if rep % 2 == 0 else arms[::-1]
                for label, src, variant in order:
                    sampled = f"{variant}+sample" if args.sample else variant
                    row = _one(src, args.mode, n, listener, args.seconds, sampled)
                    row.update(rep=rep, n=n, listener=listener, arm=label, mode=args.mode)
                    row["load"] = os.getloadavg()[0]
                    print(json.dumps(row), flush=True)
                    rows.append(row)
                    if args.out:
                        args.out.write_text(json.dumps(rows, indent=1))
    _summary(rows)


if __name__ == "__main__":
    main()
