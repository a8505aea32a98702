"""CPU of the log lines ``thoughtgate serve`` writes at its default level. Not a test.

* a provider turn (the Anthropic adapter over a recorded answer served from memory, as
  :mod:`bench.turn_bench` does) with the root logger at INFO writing to a file, as the daemon's
  stderr: httpx at INFO (its ``HTTP Request: ...`` line a turn, the old default) against httpx at
  WARNING (:func:`thoughtgate.server.logs.configure_logging`), batches alternated in one process;
* one uvicorn access-log line (its formatter, to a file), with and without the ticket redaction.

``time.thread_time()`` per turn or line; the medians, and in how many pairs of batches the new
default was ahead. ``python -m bench.log_bench``
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.emulator_process import emulator_process
from bench.request_bench import memory_backend
from bench.turn_bench import MODELS, _as_paced, _record, _request, _settings

BATCHES = 9
PER_BATCH = 40
LINES = 20_000


def _handler() -> logging.Handler:
    """The daemon's stderr handler, writing to a file (as a service manager's log does)."""
    from thoughtgate.server.logs import LOG_FORMAT

    handler = logging.StreamHandler(open(os.devnull, "w"))  # noqa: SIM115 - for the process
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    return handler


async def _turns(url: str, batches: int, per_batch: int) -> dict[str, list[float]]:
    from thoughtgate.engine.turn import stream_llm_turn
    from thoughtgate.providers import clients
    from thoughtgate.providers.base import create_provider
    from thoughtgate.server.gc_policy import daemon_gc
    from thoughtgate.server.logs import QUIET_LIBRARIES

    model = MODELS["anthropic"]
    reads = _as_paced(await _record(url, model))
    clients.AsyncioBackend = memory_backend(lambda: reads)  # type: ignore[attr-defined]
    settings, request = _settings(url, model), _request()
    root = logging.getLogger()
    root.handlers[:] = [_handler()]
    root.setLevel(logging.INFO)
    levels = {"info": logging.NOTSET, "default": logging.WARNING}
    figures: dict[str, list[float]] = {arm: [] for arm in levels}
    lines: dict[str, int] = dict.fromkeys(levels, 0)

    class Count(logging.Filter):
        arm = "info"

        def filter(self, record: logging.LogRecord) -> bool:
            lines[self.arm] += 1
            return True

    count = Count()
    root.handlers[0].addFilter(count)

    async def turns(arm: str) -> None:
        count.arm = arm
        for name in QUIET_LIBRARIES:
            logging.getLogger(name).setLevel(levels[arm])
        for _ in range(per_batch):
            await stream_llm_turn(create_provider(model, settings), request)

    async with clients.shared_clients().lease():
        for arm in levels:  # warm
            await turns(arm)
        lines = dict.fromkeys(levels, 0)
        with daemon_gc(10_000):
            for _ in range(batches):
                for arm in levels:
                    began = time.thread_time()
                    await turns(arm)
                    figures[arm].append((time.thread_time() - began) / per_batch * 1e6)
    for arm in levels:
        print(f"  {arm}: {lines[arm] / (batches * per_batch):.2f} log lines a turn")
    return figures


def _httpx_lines(count: int) -> dict[str, float]:
    """µs of CPU per httpx request line as httpx logs it, with httpx at INFO and at WARNING."""
    httpx_log = logging.getLogger("httpx")
    url = "https://api.anthropic.com/v1/messages"
    result: dict[str, list[float]] = {"info": [], "warning": []}
    for _ in range(3):
        for arm, level in (("info", logging.NOTSET), ("warning", logging.WARNING)):
            httpx_log.setLevel(level)
            began = time.thread_time()
            for _ in range(count):
                httpx_log.info('HTTP Request: %s %s "%s %d %s"', "POST", url, "HTTP/1.1", 200, "OK")
            result[arm].append((time.thread_time() - began) / count * 1e6)
    return {arm: statistics.median(values) for arm, values in result.items()}


def _access_lines(count: int) -> dict[str, float]:
    """µs of CPU per uvicorn access-log line, plain and through the ticket redaction."""
    from uvicorn.logging import AccessFormatter

    from thoughtgate.server.logs import RedactTickets

    access = logging.getLogger("uvicorn.access")
    access.propagate = False
    access.setLevel(logging.INFO)
    handler = _handler()
    handler.setFormatter(
        AccessFormatter('%(levelprefix)s %(client_addr)s - "%(request_line)s" %(status_code)s')
    )
    access.handlers[:] = [handler]
    path = "/v1/runs/run_0123456789abcdef0123456789abcdef/stream?ticket=v1.abc.def"
    args = ("127.0.0.1:50000", "GET", path, "1.1", 200)
    fmt = '%s - "%s %s HTTP/%s" %d'
    result: dict[str, float] = {}
    redact = RedactTickets()
    for arm in ("plain", "redacted", "plain", "redacted"):
        if arm == "redacted":
            access.addFilter(redact)
        began = time.thread_time()
        for _ in range(count):
            access.info(fmt, *args)
        result[arm] = (time.thread_time() - began) / count * 1e6
        access.removeFilter(redact)
    return result


def _safe_records(count: int, rounds: int = 3) -> dict[str, dict[str, list[float]]]:
    """µs of CPU per line with the records made safe (``log_records.install()``, ADR 0104) and
    without, alternated ``rounds`` times: a record made (the factory alone), an access-log line
    (no exception: the factory's check alone), a warning quoting an exception (``"... %s", exc``) and a ``log.exception``
    traceback (a third as many: each is ~100 µs)."""
    from thoughtgate import log_records

    log = logging.getLogger("thoughtgate.bench")
    log.propagate = False
    log.setLevel(logging.INFO)
    log.handlers[:] = [_handler()]
    access = logging.getLogger("uvicorn.access")
    access.propagate = False
    access.setLevel(logging.INFO)
    access.handlers[:] = [_handler()]
    said = 'new row violates check constraint "c"\nDETAIL:  Failing row contains (x, y).'
    failure = ValueError(said)

    def access_line() -> None:
        access.info('%s - "%s %s HTTP/%s" %d', "127.0.0.1:5", "GET", "/v1/runs", "1.1", 200)

    def warning_line() -> None:
        log.warning("could not close run %s: %s", "run_0123", failure)

    def traceback_line() -> None:
        try:
            raise ValueError(said)  # a new one: a raised exception's traceback grows
        except ValueError:
            log.exception("an observer of run %s failed", "run_0123")

    access_args = ("127.0.0.1:5", "GET", "/v1/runs", "1.1", 200)

    def record_made() -> None:  # the factory alone: what every record created pays
        logging.getLogRecordFactory()(
            "uvicorn.access", 20, "h.py", 1, '%s - "%s %s HTTP/%s" %d', access_args, None
        )

    lines = {"record": (record_made, count * 10), "access": (access_line, count)}
    lines["warning"] = (warning_line, count)
    lines["traceback"] = (traceback_line, max(1, count // 3))
    before = logging.getLogRecordFactory()
    result: dict[str, dict[str, list[float]]] = {n: {"plain": [], "safe": []} for n in lines}
    try:
        for _ in range(rounds):
            for arm in ("plain", "safe"):
                if arm == "safe":
                    log_records.install()
                else:
                    logging.setLogRecordFactory(before)
                for name, (line, n) in lines.items():
                    began = time.thread_time()
                    for _ in range(n):
                        line()
                    result[name][arm].append((time.thread_time() - began) / n * 1e6)
    finally:
        logging.setLogRecordFactory(before)
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    import uvloop

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=BATCHES)
    parser.add_argument("--per-batch", type=int, default=PER_BATCH)
    parser.add_argument(
        "--records-only", action="store_true", help="only the safe records' cost (ADR 0104)"
    )
    args = parser.parse_args(argv)
    records = _safe_records(LINES)
    for name, arms in records.items():
        plain = ", ".join(f"{v:.1f}" for v in arms["plain"])
        safe = ", ".join(f"{v:.1f}" for v in arms["safe"])
        print(f"a {name} line, µs: plain {plain}; safe records {safe}")
    if args.records_only:
        return {"records": records}
    with tempfile.TemporaryDirectory() as tmp, emulator_process(Path(tmp)) as url:
        figures = uvloop.run(_turns(url, args.batches, args.per_batch))
    info, default = statistics.median(figures["info"]), statistics.median(figures["default"])
    ahead = sum(d < i for i, d in zip(figures["info"], figures["default"], strict=True))
    print(
        f"a turn: httpx at INFO {info:.0f} µs, at WARNING {default:.0f} µs "
        f"(-{info - default:.0f} µs; the new default ahead in {ahead} of {len(figures['info'])})"
    )
    lines = _httpx_lines(LINES)
    print(
        f"an httpx request line: {lines['info']:.1f} µs at INFO, {lines['warning']:.2f} µs at "
        "WARNING"
    )
    access = _access_lines(LINES)
    print(
        f"an access-log line: {access['plain']:.1f} µs, "
        f"{access['redacted']:.1f} µs with the ticket redaction"
    )
    return {
        "info": figures["info"],
        "default": figures["default"],
        "httpx": lines,
        "access": access,
        "records": records,
    }


if __name__ == "__main__":
    main()
