"""Daemon overhead: a fake provider and the real adapters over HTTP, to HTTP clients. Not a test.

Run ``PYTHONPATH=src python -m bench.daemon_bench`` (``--quick`` for a short pass, ``--store
memory`` to leave durability out, ``--flush-interval S`` for a what-if on the recorder's delta
batching window, ``--variant fake|adapters``, ``--formats anthropic,chat`` and ``--levels 1=60``
to run part of it, ``--rounds R`` to measure every phase in R rounds (below; default 3, 1 with
``--quick``), ``--repeat N`` to run each phase N times in a row against the same daemon and print
each repetition's figures with the server's state (RSS, collections, live objects, database and
WAL sizes: :mod:`bench.process_stats`), ``--age RUNS`` to age each daemon first, ``--profile
DIR`` to sample the server with py-spy in every phase and print where its CPU went, ``--trace
DIR`` to stamp the first reasoning delta's hops and the client's requests, server and client
side, and every run's whole cycle from its ``POST`` to the connection's next, and print each
hop's median per phase, then each server's totals -- store jobs, DBOS's SQL transactions by
thread, threads' CPU: :mod:`bench.first_byte_trace`), ``--pin`` to start the servers on one CPU
and leave the others to this client and the emulator (ADR 0055: on the two shared cores, where
the OS put the daemon's threads moved the adapters' first byte at 10 runs by 2×).
``main()`` returns ``{name, value, unit, target, ok}`` dicts for a bench runner, with ``spread``
and ``rounds`` for a figure measured in rounds (plus plot series for ``bench.run``).

Rounds (ADR 0049): on the shared two-core machine the same phase of the same code moves 2-4×
between minutes (ADR 0042: added first byte 3.8-20.4 ms over 40 repetitions of one phase), so a
single sample per figure decided "met" or "missed" by the minute it fell on, for thoughtgate and
for the LiteLLM baseline alike. Every phase is therefore measured in ``--rounds`` rounds (3 in
``make bench``; 1 with ``--quick``, ``--trace`` or ``--profile`` unless asked). A round starts
fresh servers (their own database files) and goes through every phase once, in the order a
single-round bench did, so each round is what the bench measured before; beside each server, with
no server up, it runs that server's in-process baselines (below), before the server in odd rounds
and after it in even ones (ADR 0116). LiteLLM's proxy starts once and stays up (idle, it takes
~0.01 s of CPU over a thoughtgate round); its phases run before thoughtgate's in odd rounds and
after them in even ones, so a noisy minute falls on both sides of a comparison. A published figure
is the median of its rounds' figures, its ``spread`` their least and greatest
(:mod:`bench.repetitions`): for a p50 the median of the rounds' p50s, likewise a p99, a rate, CPU
per delta, an in-process baseline; a ratio is the median of the rounds' ratios, both sides from the
same round (the adapters' CPU over the fake provider's, the daemon's over the in-process
baseline's). LiteLLM's added TTFB is taken per round (through the proxy minus direct, in that
round), then its median; the targets derive from LiteLLM's medians and the verdict is the median's.
Rounds' samples are not pooled: one slow round's hundreds of first bytes would outvote two good
rounds. ``--repeat`` (ADR 0042) serves another purpose and keeps it: within each round, each phase
N times in a row against that round's daemon, to watch it as it lives; a round's rows are its first
repetition's.

Warm-up (ADR 0126): before its timed runs a phase makes three runs in turn, then one on each
of its connections at once, so every phase starts with the daemon's provider connections open,
one per concurrent stream, as a daemon that has served a while has them. A daemon's first 100-run
phase used to open them inside its first timed wave, whose connects wait in the loop behind that
wave's burst of requests; the provider's first delta then went out later and less of the backlog
fell after its stamp, so ``ttfb_added`` of that phase read lower than of any phase after it on
the same daemon (ADR 0119 / 0124's "second phase ~1.4-1.8x slower"), while the client's wait for
the byte was the same.

The host (ADR 0050): every measured phase, thoughtgate's and LiteLLM's, is bracketed by two
reads of ``/proc/stat`` (:mod:`bench.host_steal`), and its console line gives the share of all
CPU time the host stole from the VM, left idle, or spent outside the bench's processes (client,
emulator, server, proxy). A round pools its phases; ``host_steal_median`` (with the rounds'
spread), ``host_steal_max``, ``host_idle_median`` and ``host_other_load_median`` say under what
load the figures were taken (no target): the added first byte rises with steal (ADR 0048).

Set-up: ``thoughtgate`` serves in a subprocess (uvicorn, one worker, on the daemon's event loop:
uvloop where installed, as ``thoughtgate serve`` runs) with durable recording (a
SQLite file when ``thoughtgate.store.sqlite`` exists, else the memory store; the choice is
printed) and the output filter on (clients read as ``developer`` on ``surface`` runs, so every
reasoning delta goes through the filter and out). Its runs use one of two providers, in turn:

* ``fake:bench`` (rows without a prefix), in the server process: after 10 ms, 20 reasoning deltas
  then 20 text deltas, 1 ms apart, no parsing, no network. The first reasoning delta carries the
  provider's clock (``time.monotonic()``, system-wide, so client and server compare it directly).
* the real adapters (rows prefixed ``anthropic_``, ``chat_`` (OpenAI-compatible Chat
  Completions), ``openrouter_``, ``responses_``), talking HTTP to the provider emulator in its own
  process (:mod:`bench.emulator_process`): the same stream in each wire format, paced the same
  way (its deltas on their slots, a format's framing events written with them, so every
  format's stream ends as fake:bench's does, ADR 0150), its first reasoning delta stamped with
  the emulator's send time. The emulator stands in
  for a remote provider, whose CPU is not the daemon's machine's, so it is a lean HTTP/1.1 server
  (:mod:`bench.lean_emulator`, ADR 0133) that writes ``thoughtgate.testing.emulator``'s answers
  byte for byte, each distinct request rendered once: 0.2 ms of CPU a run at 100 concurrent
  runs and 0.4 at 10, where uvicorn and Starlette took 0.7-1.0 and 1.0-1.3 ms on the same cores
  (``BENCH_EMULATOR=asgi`` serves through them again). The daemon's provider
  clients are the process's (one per endpoint), as in production. Anthropic and Chat Completions
  run at every concurrency, the other two at 10.

Both providers pace their deltas on an absolute schedule, as a remote provider does: delta k is
due ``10 ms + k × 1 ms`` after the stream opened, a late one goes out as soon as it can and is
never skipped (``bench.emulator_pace.Pace``). With relative sleeps each sleep overshoots when
the machine is busy, so the provider's clock would slow down with our own load (a run of 40
paced deltas took ~90 ms instead of 50 at 10 concurrent runs) and runs/s would measure the
provider's slowdown rather than the daemon.

``thoughtgate serve`` runs durably by default (ADR 0013: DBOS's workflows in a file beside the
store's, ``<store>.workflows``; a run of one model task without tools writes none, in a daemon,
ADR 0031, or in process, ADR 0046); the ``durable_`` rows (fake provider, three requests) are
that configuration, on a second server process with the durable engine attached, measured after
the first; the other rows leave the engine out, as ``thoughtgate serve`` does with
``durability.enabled = false``. Their in-process baseline is durable too (the same engine in the
bench process), so ``durable_cpu_per_delta_vs_in_process`` compares like with like, and
``durable_cpu_per_delta_vs_fake`` is what durability adds to the daemon's CPU per delta.

Each run is what a client does: ``POST /v1/runs``, ``POST /v1/tickets``, then
``GET /v1/runs/{id}/stream`` until the terminal event; the ``one_request_`` rows (fake provider)
do it in one request, ``POST /v1/runs/follow``. At 1, 10 and 100 concurrent runs:

* ``ttfb_added``: first reasoning delta received by the client minus its emission by the provider
  (for the adapters: the provider's HTTP hop, parse, record, batch, tail, filter, encode, send):
  the daemon's added time to first reasoning byte. "Received" is when the socket read holding
  the frame's last byte came in (noted in the client protocol's ``data_received``), not when the
  client got round to parsing it, so the client's own wake-up and parsing are not counted; the
  LiteLLM figures are read the same way. The stamp has 0.1 ms resolution (rounded, so it
  shifts no percentile by more than 0.05 ms). Every delta is committed before a reader gets it,
  so this includes one durable commit. :mod:`bench.commit_floor` measures it as one run meets it
  (ADR 0058), ``sqlite_append_after_idle_p50/p99``: one reasoning delta appended through the
  daemon's store, awaited on its kind of event loop, after the fake provider's 10 ms wait, 200
  times, before the phases and after them, the lesser kept (the floor under ``ttfb_added`` at one
  run, which the "Bounds" note sets beside the c1 target); ``sqlite_durable_commit_p50`` is a
  bare commit in a tight loop before the phases, the least a commit costs on this disk, not what
  a run meets (about a third of the after-idle append in ADR 0058's runs).
* ``ttfb_added_from_slot`` (the fake provider's variants only, ADR 0113): the same first byte
  measured the adapters' way, from the fake's first delta's slot (when its schedule had it due;
  its stamp if that came first) instead of its stamp. The emulator stamps its delta in its own
  process before the daemon wakes for the bytes, so the adapters' and LiteLLM's figures count
  the daemon's (or the proxy's) wake-up; the fake runs in the daemon and stamps only after the
  daemon's loop has run its timer and its task, so ``ttfb_added`` leaves that wake-up out
  (ADR 0110), which under load is the larger part at 100 runs. The first delta carries its slot
  beside its stamp (``T12.3481 S12.3450``), so the figure is taken in every run, not only under
  ``--trace``. Its p50 is set beside the target as information, not judged: which of the two
  the target judges is the planners' call. The first slot is a whole 10 ms after the schedule
  is made and asked for at once, so :class:`~bench.emulator_pace.Pace`'s rounding up to the
  millisecond adds ~1 µs to it (a later slot's up to 1 ms); on an idle loop the fake's timer
  and task still run 0.1-0.2 ms after the slot (the kernel's timer slack, the wake-up, the
  task's turn), which this figure counts and a socket's wake-up has only in part.
* ``ttfb_client``: from the client's ``POST /v1/runs`` to that first reasoning byte (three HTTP
  round trips on loopback plus the above).
* ``runs_per_s``: completed runs per second (a run is one created-and-fully-streamed request,
  what LiteLLM's ~40 requests/s counts); ``http_per_s`` counts every HTTP request. Its target
  (10× LiteLLM's requests/s) is at 10 and 100 concurrent runs, as issue 16 sets it; at 1 the
  figure is measured without one (one run at a time cannot beat the paced stream's own ~50 ms).
* ``cpu_per_event``: server CPU time (user+sys from /proc) per event delivered to clients.
* ``cpu_per_delta``: server CPU time per streamed provider delta (runs × 40); ``in_process_cpu_
  per_delta``: the same runs through a Runtime in the bench process (same store kind, config,
  model and mode, 100 runs 10 at a time, timed from a full collection of the bench's heap, ADR
  0089), in every round beside the server that runs its kind (ADR 0116); ``_vs_in_process`` is
  their ratio, taken in each round (target ≤ 2 at 10 and 100 concurrent runs, issue 16), and
  ``<format>_cpu_per_delta_vs_fake`` the adapters' figure over the fake provider's at the same
  concurrency (target ≤ 2).

LiteLLM, live (issues 5 and 9): its proxy (``litellm[proxy]==1.79.*``) pins uvicorn<0.30 and
cannot share thoughtgate's venv, so the bench creates ``bench/.litellm-venv`` on first use and
runs ``litellm --config`` there (one worker, loopback, no DB, telemetry or callbacks) in front of
the same emulator (Chat Completions). At each concurrency, streamed completions go straight to
the emulator, then through the proxy: ``litellm_ttfb_added_p50/p99`` is the first content byte
through the proxy minus the first byte direct (percentile minus percentile), and
``litellm_requests_per_s`` counts completed streamed requests through the proxy. Targets: ≤ 1/20
of LiteLLM's added TTFB, ≥ 10× its requests/s, from these measured figures; when the proxy cannot
be installed or started (or ``--no-litellm``), from its published reference (~10/66/960 ms added
p50 TTFB at 1/10/100 streams, ~40 requests/s), and the bench says so.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import functools
import gc
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

from bench.atomic import write_json
from bench.commit_floor import AppendFloor, append_floor, bare_commit_ms, least
from bench.emulator_pace import DELTAS, GAP_S, PROVIDER_TTFB_S, Pace, added_s, stamp, written
from bench.emulator_process import emulator_process, stop
from bench.environment import LOOPBACK, REPO, child_env, free_port
from bench.first_byte_trace import (
    client_stamp,
    counts_report,
    cycle_report,
    dump_client,
    report,
    wrapped_ms,
)
from bench.host_steal import HostShare, pooled, round_rows, sample, share_text, since
from bench.process_stats import GcClock, file_sizes, rss_mb, snapshot
from bench.profile_summary import record, summary
from bench.repetitions import info_verdict, judge, median_rows, spread_text
from thoughtgate.providers.sse import SSEDecoder

__all__ = ["main"]

LITELLM_TTFB_MS = {1: 10.0, 10: 66.0, 100: 960.0}
LITELLM_RPS = 40.0
TRACE: str | None = None
"""``--trace DIR``: where the first byte's hop stamps go (``bench.first_byte_trace``)."""
SERVER_CPU: int | None = None
"""``--pin``: the one CPU the servers (thoughtgate's, LiteLLM's proxy) run on; the bench's client
and the emulator get the others (ADR 0055)."""
NOTES: list[str] = []  # filled by main(): measured or reference LiteLLM figures
PROVIDER_DELTAS = 2 * DELTAS  # reasoning + text deltas the provider streams per run
FAKE_MODEL = "fake:bench"
#: wire format -> (model, config section, base URL path): the real adapters against the emulator
FORMATS = {
    "anthropic": ("anthropic:claude-sonnet-4-5", "anthropic", ""),
    "chat": ("openai-compatible:deepseek-reasoner", "openai_compatible", "/v1"),
    "openrouter": ("openrouter:qwen/qwen3-235b-a22b-thinking-2507", "openrouter", "/v1"),
    "responses": ("openai:gpt-5", "openai", "/v1"),
}
ALL_LEVELS = ("anthropic", "chat")
"""Formats measured at 1, 10 and 100 concurrent runs; the others at 10 only."""
ONE_REQUEST = "one_request_"
"""Row prefix of the fake provider's runs started and followed with one request each."""
DURABLE = "durable_"
"""Row prefix of the fake provider's runs on a durable daemon (``thoughtgate serve``'s default)."""
FULL_LEVELS = {1: 20, 10: 100, 100: 300}
"""Runs per concurrency of the full bench. ``--quick`` keeps the same at 10 and 100: at 100 runs
its former 100 were one run per connection, a single synchronized burst, and at 10 its former 40
(four per connection) gave ~20% less CPU per delta than 100 on the same daemon (ADR 0042), so
quick and full figures were not comparable. Only the one-run level (nothing there to fall into
step) is shorter with ``--quick``."""
IN_PROCESS_RATIO = 2.0
RATIO_LEVELS = (10, 100)
"""Issue 16: server CPU per delta ≤ 2× the in-process run's, at 10 and 100 concurrent runs."""
FULL_ROUNDS = 3
"""Rounds of every phase in the full bench (``make bench``); ``--quick`` runs one (ADR 0049)."""
Phase = tuple[dict[str, Any], float]
"""A phase's client-side stats and the server's CPU seconds in it."""
IN_PROCESS_RUNS = 100
"""Timed runs of one in-process baseline (10 at a time, after 3 untimed): ~1 s of wall time
for a kind, ~1.5 s for the durable one, ~6.5 s for the six kinds of a full round."""
IN_PROCESS, SERVER = "in process", "server"
"""A round's steps (:func:`_round_steps`)."""
RPS_LEVELS = (10, 100)
"""Issue 16: completed runs/s ≥ 10× LiteLLM's requests/s at 10 and 100 concurrent runs (at 1,
one paced ~50 ms stream at a time bounds any proxy far below that: measured, no target)."""


def _round_steps(number: int, servers: list[bool]) -> list[tuple[str, bool]]:
    """Round ``number``'s steps, in order: each server (``True``: the durable one) with the
    in-process baseline of its kinds beside it, before it in odd rounds and after it in even
    ones (ADR 0116), so a baseline and the phases it divides share their minutes, and a host
    that speeds up or slows down over a round leans the ratio one way in one round and the other
    way in the next, as LiteLLM's phases alternate with thoughtgate's (ADR 0049)."""
    pair = [IN_PROCESS, SERVER] if number % 2 else [SERVER, IN_PROCESS]
    return [(step, on) for on in servers for step in pair]


def _adapter_order(number: int, formats: list[str], start: int = 0) -> list[str]:
    """Round ``number``'s order of the real adapters' phases: ``formats`` rotated left by
    ``start`` in round 1, then by one more each round, so over as many rounds as formats each
    runs in every position once, and a format's median is not always measured in the same place
    after the same phases (ADR 0124: whichever format's 100-run phase ran second was ~1.44x
    slower to its first byte, ADR 0119). With fewer rounds than formats some format never runs
    first in a pass, whatever the order; ``start`` (:func:`_order_start`) moves which one from
    pass to pass (ADR 0150)."""
    if not formats:
        return []
    shift = (start + number - 1) % len(formats)
    return formats[shift:] + formats[:shift]


def _order_start(formats: list[str], hour: int) -> int:
    """A pass's ``start`` for :func:`_adapter_order`: the UTC hour it began at, modulo the
    formats. Three rounds of four formats leave one format out of first place in a pass; a start
    fixed at 0 left out the same one in every pass (Responses, ADR 0139), so its figures alone
    never had the first place's share of the order's effect; passes begun at different hours
    leave out different formats."""
    return hour % len(formats) if formats else 0


# ----------------------------------------------------------------------------- server side


def _bench_script(request: Any, turn: int) -> AsyncIterator[Any]:
    """Emulator-like, on the same absolute schedule (:class:`~bench.emulator_pace.Pace`):
    the first delta ``PROVIDER_TTFB_S`` after the stream opens, then one every ``GAP_S``."""
    from thoughtgate.testing.fake import reasoning, text

    async def gen() -> AsyncIterator[Any]:
        pace = Pace(PROVIDER_TTFB_S, GAP_S)
        due = pace.due
        await pace.next()
        yield reasoning(slotted(stamp(), due))
        for i in range(1, DELTAS):
            await pace.next()
            yield reasoning(f"step {i} ")
        for i in range(DELTAS):
            await pace.next()
            yield text(f"word{i} ")

    return gen()


_SLOTTED = re.compile(r"T(\d\d\.\d{4}) S(\d\d\.\d{4})")
"""The fake provider's first delta: its stamp (when it was taken) and its slot (when it was
due), each as :func:`~bench.emulator_pace.stamp` writes a time."""


def slotted(sent: str, due: float) -> str:
    """The fake provider's first delta's text: its stamp, then its slot (``due``, a
    ``time.monotonic()``) written the same way (``T12.3481 S12.3450``). The slot is a number the
    schedule already holds; writing it costs one format a run and 9 bytes in that one delta."""
    return f"{sent} S{written(due)}"


def from_slot_s(text: str, added: float) -> float | None:
    """The first byte's added time measured the adapters' way (ADR 0113): ``added`` (from the
    fake provider's stamp) plus how late that stamp was to its slot, for a delta that carries its
    slot (the fake provider's; ``None`` for any other).

    The emulator stamps its delta before the daemon wakes for it, so the adapters' figure counts
    the daemon's wake-up for the provider's bytes; the fake provider runs in the daemon and
    stamps only once the daemon's loop has run its timer and its task, so its figure leaves that
    wake-up out (ADR 0110). Counted from the slot it is in. A stamp taken before its slot (a timer
    fired early, or the two roundings of 0.1 ms) counts from the stamp: never less than
    ``added``. The lateness is taken modulo 100 s, as the trace's hops are
    (:func:`~bench.first_byte_trace.wrapped_ms`): slot and stamp can fall either side of the
    clock's wrap."""
    found = _SLOTTED.search(text)
    if found is None:
        return None
    late_ms = wrapped_ms(float(found.group(2)), float(found.group(1)))
    return added + max(0.0, late_ms) / 1000


_NO_QUOTAS = {
    "max_open_runs_per_key": 1_000_000,
    "max_starts_per_minute_per_key": 1_000_000,
    "max_live_streams_per_key": 1_000_000,
}
"""The bench's one key starts ~1,500 runs in two minutes: far past the per-key quotas a daemon
has by default (600 starts a minute, 512 live streams), which are a policy, not a cost, and would
answer 429."""


def _config(emulator_url: str | None) -> Any:
    """The daemon's (and the in-process run's) config: every provider at the emulator, no
    per-key quotas."""
    from thoughtgate.config import Config

    mapping: dict[str, Any] = {"quotas": _NO_QUOTAS}
    if os.environ.get("BENCH_GC_YOUNG_THRESHOLD"):  # A/B of the daemon's collector (ADR 0045)
        mapping["server"] = {"gc_young_threshold": int(os.environ["BENCH_GC_YOUNG_THRESHOLD"])}
    if emulator_url is not None:
        mapping["providers"] = {
            section: {"base_url": emulator_url + path, "api_key": "bench"}
            for _, section, path in FORMATS.values()
        }
    return Config.from_mapping(mapping)


def _serve(
    port_file: Path,
    db_url: str,
    flush_interval: float | None,
    emulator_url: str | None,
    durable: bool = False,
) -> None:
    """The server process: register ``fake:bench``, open the store, serve on a free port;
    ``durable``: with the durable engine attached, as ``thoughtgate serve`` does by default."""
    import logging

    from thoughtgate.access.keys import create_key
    from thoughtgate.orchestration.durability import make_durable
    from thoughtgate.orchestration.runtime import Runtime
    from thoughtgate.server.app import create_app
    from thoughtgate.server.serve import daemon_runner, serve_app
    from thoughtgate.store.urls import open_store
    from thoughtgate.testing.fake import FAKE_SCRIPTS

    FAKE_SCRIPTS["bench"] = _bench_script
    logging.basicConfig(level=logging.WARNING)
    if os.environ.get("BENCH_TRACE"):  # --trace: stamp the first byte's hops in this process
        from bench.first_byte_trace import install

        install(os.environ["BENCH_TRACE"])
    if flush_interval is not None:  # what-if: a shorter delta batching window in the recorder
        from thoughtgate.orchestration.recorder import EventRecorder

        defaults = EventRecorder.__init__.__kwdefaults__
        assert defaults is not None
        defaults["flush_interval"] = flush_interval

    async def run() -> None:
        store = await open_store(db_url)
        key = (await create_key(store, name="bench", role="developer")).key
        config = _config(emulator_url)
        runtime = Runtime(store, config)
        if durable and make_durable(runtime) is None:
            raise RuntimeError(f"{db_url}: this store cannot run durably")
        app = create_app(runtime, config)
        if os.environ.get("BENCH_STATS"):  # --repeat: snapshots of the server between phases
            from bench.process_stats import install as install_stats

            install_stats(os.environ["BENCH_STATS"])

        def ready(host: str, port: int) -> None:
            write_json(port_file, {"url": f"http://{host}:{port}", "key": key})

        try:
            await serve_app(app, host=LOOPBACK, port=0, log_level="warning", on_ready=ready)
        finally:
            await store.close()

    daemon_runner()(run())  # the daemon's own event loop (uvloop where installed)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ----------------------------------------------------------------------------- client side


class _Connection:
    """A minimal keep-alive HTTP/1.1 client on asyncio streams.

    httpx costs more CPU per request than the daemon does on this kind of machine, and client and
    server share the cores, so a heavy client would measure itself. This one only writes requests
    and reads ``Content-Length`` or chunked bodies.
    """

    def __init__(self, host: str, port: int, key: str) -> None:
        self.host, self.port, self.key = host, port, key
        self.reader: _StampedReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.traced: dict[str, Any] | None = None
        """``--trace``: the stamps of this connection's last run, until its next ``POST``."""

    async def open(self) -> _Connection:
        loop = asyncio.get_running_loop()
        self.reader = reader = _StampedReader()
        protocol = asyncio.StreamReaderProtocol(reader)
        transport, _ = await loop.create_connection(lambda: protocol, self.host, self.port)
        self.writer = asyncio.StreamWriter(transport, protocol, reader, loop)
        return self

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(OSError):
                await self.writer.wait_closed()

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        on_chunk: Callable[[bytes, float], None] | None = None,
        headers: str = "",
    ) -> tuple[int, bytes]:
        """``on_chunk`` gets each chunk of a chunked body with the moment its last byte arrived
        from the socket; ``headers``: more header lines (each ending in CRLF)."""
        assert self.reader is not None and self.writer is not None
        data = json.dumps(body).encode() if body is not None else b""
        self.writer.write(
            f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {self.key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n{headers}\r\n".encode()
            + data
        )
        status = int((await self.reader.readline()).split()[1])
        length = None
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            if name.lower() == "content-length":
                length = int(value)
        if length is not None:
            return status, await self.reader.readexactly(length)
        parts = []
        while size := int((await self.reader.readline()).strip(), 16):
            chunk = await self.reader.readexactly(size)
            await self.reader.readline()
            if on_chunk is not None:
                on_chunk(chunk, self.reader.arrived())
            parts.append(chunk)
        await self.reader.readline()
        return status, b"".join(parts)


class _StampedReader(asyncio.StreamReader):
    """A stream reader that notes when each socket read's bytes arrived.

    ``feed_data`` runs in the protocol's ``data_received``, as the bytes come off the socket, so
    the time noted there is their arrival: a frame's arrival is that of the read holding its last
    byte, however long the client then takes to wake up, read the chunk framing and parse what
    came before (that is the client's cost, not the daemon's, and the added TTFB leaves it out).
    """

    def __init__(self) -> None:
        super().__init__(limit=2**16)
        self.fed = 0
        self.taken = 0
        self._reads: collections.deque[tuple[int, float]] = collections.deque()
        """(stream offset just past a read's bytes, its arrival) of the reads not yet taken."""

    def feed_data(self, data: bytes) -> None:  # type: ignore[override]  # asyncio feeds bytes
        self.fed += len(data)
        self._reads.append((self.fed, time.monotonic()))
        super().feed_data(data)

    async def readline(self) -> bytes:
        line = await super().readline()
        self.taken += len(line)
        return line

    async def readexactly(self, n: int) -> bytes:
        data = await super().readexactly(n)
        self.taken += n
        return data

    def arrived(self) -> float:
        """When the last byte taken so far arrived from the socket."""
        reads = self._reads
        while reads[0][0] < self.taken:
            reads.popleft()
        return reads[0][1]


class _Frames:
    """What the bench client reads of an SSE body: frames are decoded only until ``first`` (given
    a frame's data and the moment its chunk's last byte arrived from the socket) returns true,
    then only counted.

    The client shares the cores with the server, so it stays light: after the first frame it
    looks for, decoding the ~40 others of a run would be CPU taken from the server under test.
    Counting ``data:`` fields counts the same frames the decoder yields (one data line each;
    pings carry none); the switch happens at a chunk that ends a frame, so no frame is half
    decoded. LiteLLM's client reads the same way.
    """

    def __init__(self, first: Callable[[str, float], bool]) -> None:
        self.first = first
        self.count = 0
        self._decoder: SSEDecoder | None = SSEDecoder()
        self._found = False
        self._tail = b""

    def feed(self, chunk: bytes, arrived: float) -> None:
        if self._decoder is None:
            # the last 4 bytes before: a ``data:`` split across two chunks still counts once
            joined = self._tail + chunk
            self.count += joined.count(b"data:")
            self._tail = joined[-4:]
            return
        for message in self._decoder.feed(chunk):
            self.count += 1
            self._found = self._found or self.first(message.data, arrived)
        if self._found and chunk.endswith((b"\n\n", b"\r\n\r\n")):
            self._decoder = None


async def _one_run(
    conn: _Connection, model: str, single: bool
) -> tuple[float, float, float | None, int]:
    """(client TTFB s, added TTFB s, added TTFB from the provider's slot s or ``None``, events
    received) for one run, streamed to the end: three requests (create, ticket, stream), or with
    ``single`` one (``POST /v1/runs/follow``). The slot is known for the fake provider only
    (:func:`from_slot_s`)."""
    started = time.monotonic()
    if conn.traced is not None:  # --trace: the previous run's cycle ends with this POST
        conn.traced["c_next_sent"] = started
        conn.traced = None
    body = {"prompt": "bench", "model": model, "chain_of_thought": "surface"}
    first = {"client": -1.0, "added": -1.0}
    from_slot: float | None = None
    stamps: dict[str, Any] = {"c_create_sent": started}

    def first_reasoning(data: str, now: float) -> bool:
        nonlocal from_slot
        if '"reasoning.delta"' not in data:
            return False
        frame = json.loads(data)
        added = added_s(frame["payload"]["text"], now)
        assert added is not None, f"no send-time stamp in {data[:200]}"
        first["client"], first["added"] = now - started, added
        from_slot = from_slot_s(frame["payload"]["text"], added)
        stamps.setdefault("run_id", frame.get("run_id"))
        return True

    frames = _Frames(first_reasoning)
    on_chunk = frames.feed

    if single:
        status, _ = await conn.request("POST", "/v1/runs/follow", body, on_chunk=on_chunk)
        run_id = stamps.get("run_id") or "(one request)"
    else:
        _, created = await conn.request("POST", "/v1/runs", body)
        stamps["c_create_done"] = time.monotonic()
        run_id = json.loads(created)["run_id"]
        stamps["c_ticket_sent"] = time.monotonic()
        _, ticket = await conn.request("POST", "/v1/tickets", {"run_id": run_id})
        stamps["c_ticket_done"] = time.monotonic()
        path = f"/v1/runs/{run_id}/stream?ticket={json.loads(ticket)['ticket']}"
        stamps["c_stream_sent"] = time.monotonic()
        status, _ = await conn.request("GET", path, on_chunk=on_chunk)
    stamps["c_stream_done"] = time.monotonic()
    assert status == 200, status
    assert first["added"] >= 0, f"run {run_id} ({model}) streamed no reasoning"
    if TRACE is not None:
        conn.traced = {**stamps, "run_id": run_id, "c_first": started + first["client"]}
        client_stamp(conn.traced)
    return first["client"], first["added"], from_slot, frames.count


async def _warm_up(conns: list[_Connection], one: Callable[[_Connection], Awaitable[Any]]) -> None:
    """A phase's warm-up: ``one`` run on each of the first three connections in turn (first-time
    costs: imports, caches), then one on every connection at once (ADR 0126).

    The wave leaves the server as the phase will find it whatever ran before: one keep-alive
    connection to the provider per concurrent stream. Without it, a daemon's first phase at 100
    runs opened its provider connections inside its first timed wave (100 runs started at
    once), where each connect waited in the daemon's loop behind the wave's requests; the
    provider's first delta went out later and less of the backlog fell after its stamp, so that
    wave's ``ttfb_added`` read ~6.6x lower than a later phase's on the same daemon, for the same
    client wait from ``POST`` to byte. LiteLLM's phases warm up the same way."""
    for conn in conns[:3]:
        await one(conn)
    if len(conns) > 1:
        await asyncio.gather(*(one(conn) for conn in conns))


async def _phase(
    base_url: str,
    key: str,
    concurrency: int,
    total: int,
    model: str,
    cpu: Callable[[], float],
    single: bool = False,
) -> dict[str, Any]:
    """``total`` runs, ``concurrency`` at a time, after a warm-up (:func:`_warm_up`); ``cpu()``
    (the server's CPU seconds) is read around the timed runs only, so warm-ups and one-time
    costs stay out. ``first_wave``: the added first byte of each connection's first timed run
    (the synchronized wave the phase starts with), which ``--repeat`` prints beside the p50."""
    host, port = base_url.removeprefix("http://").split(":")
    conns = [await _Connection(host, int(port), key).open() for _ in range(concurrency)]
    try:
        await _warm_up(conns, functools.partial(_one_run, model=model, single=single))
        remaining = [total]
        results: list[tuple[float, float, float | None, int]] = []
        first_wave: list[float] = []

        async def worker(conn: _Connection) -> None:
            first = True
            while remaining[0] > 0:
                remaining[0] -= 1
                results.append(await _one_run(conn, model, single))
                if first:
                    first_wave.append(results[-1][1])
                    first = False

        cpu_before = cpu()
        started = time.monotonic()
        await asyncio.gather(*(worker(c) for c in conns))
        elapsed = time.monotonic() - started
        cpu_used = cpu() - cpu_before
    finally:
        for conn in conns:
            await conn.close()
    return {
        "elapsed": elapsed,
        "cpu": cpu_used,
        "client": sorted(r[0] for r in results),
        "added": sorted(r[1] for r in results),
        "from_slot": sorted(r[2] for r in results if r[2] is not None),
        "first_wave": sorted(first_wave),
        "events": sum(r[3] for r in results),
        "runs": len(results),
    }


# ----------------------------------------------------------------------------- in process


async def _in_process(
    model: str,
    db_url: str,
    emulator_url: str | None,
    runs: int,
    concurrency: int,
    durable: bool = False,
) -> float:
    """Bench-process CPU µs per provider delta of the same runs without the daemon.

    A :class:`~thoughtgate.orchestration.runtime.Runtime` on the same kind of store, with the
    same config, model and mode (``surface``), ``concurrency`` runs at a time: what the work costs
    before HTTP, tickets, SSE and the per-reader filter are added. ``durable``: with the durable
    engine attached and launched, as ``thoughtgate run`` runs on a SQLite store by default.
    """
    from thoughtgate.orchestration.durability import make_durable
    from thoughtgate.orchestration.runtime import RunRequest, Runtime
    from thoughtgate.store.urls import open_store
    from thoughtgate.testing.fake import FAKE_SCRIPTS

    FAKE_SCRIPTS["bench"] = _bench_script
    store = await open_store(db_url)
    try:
        async with Runtime(store, _config(emulator_url)) as runtime:
            engine = make_durable(runtime) if durable else None
            if durable and engine is None:
                raise RuntimeError(f"{db_url}: this store cannot run durably")
            if engine is not None:
                await engine.launch()

            async def one() -> None:
                request = RunRequest("bench", model=model)
                run = await runtime.run(request, chain_of_thought="surface")
                assert run.status == "completed", run.error

            for _ in range(3):  # warm-up: imports, connections, caches
                await one()
            remaining = [runs]

            async def worker() -> None:
                while remaining[0] > 0:
                    remaining[0] -= 1
                    await one()

            # The collector's debt is the bench process's, not these runs' (ADR 0089): the
            # objects that survived since its last full pass -- this kind's imports, another
            # kind's (DBOS and SQLAlchemy, which only the durable kind imports), the HTTP
            # client's from the phases -- would make the next full pass (~80 ms, ~20 µs a
            # delta) fall in whichever kind's window came next. Paid off here, as the daemon
            # does before it serves (``server.gc_policy``); passes these runs cause still count.
            gc.collect()
            started = time.process_time()
            try:
                await asyncio.gather(*(worker() for _ in range(concurrency)))
            finally:
                cpu = time.process_time() - started
                if engine is not None:
                    await engine.close()
    finally:
        await store.close()
    return cpu / (runs * PROVIDER_DELTAS) * 1e6


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def _result(
    name: str, value: float, unit: str, target: float | None, higher: bool
) -> dict[str, Any]:
    row = {"name": name, "value": round(value, 3), "unit": unit, "target": target, "higher": higher}
    return judge(row)


def _series(
    rows: list[dict[str, Any]], litellm: dict[int, dict[str, float]] | None
) -> list[dict[str, Any]]:
    """Plot rows for ``bench.run``: ours (each variant measured at every level) against
    LiteLLM's (measured, else reference) figures."""
    by_name = {r["name"]: r["value"] for r in rows}
    levels = sorted(LITELLM_TTFB_MS)
    if litellm is not None and not all(c in litellm for c in levels):
        return []  # a partial run (``--levels``): no line to draw against
    how = "measured" if litellm else "reference"
    ll_ttfb = {c: litellm[c]["ttfb_p50"] if litellm else LITELLM_TTFB_MS[c] for c in levels}
    ll_rps = {c: litellm[c]["rps"] if litellm else LITELLM_RPS for c in levels}
    common = {"xlabel": "concurrent runs", "logx": True}
    variants = {
        "": "fake provider",
        ONE_REQUEST: "fake provider, one request",
        DURABLE: "fake provider, durable daemon",
        **{f"{f}_": f"{f} adapter" for f in ALL_LEVELS},
    }
    measured = {
        prefix: label
        for prefix, label in variants.items()
        if all(f"{prefix}runs_per_s_c{c}" in by_name for c in levels)
    }
    out: list[dict[str, Any]] = []
    for prefix, label in measured.items():
        out.append(
            {
                "series": "daemon-ttfb",
                "label": f"thoughtgate added TTFB p50 ({label})",
                "points": [[c, by_name[f"{prefix}ttfb_added_p50_c{c}"]] for c in levels],
                "ylabel": "ms",
                "title": "Added time to first reasoning byte",
                "logy": True,
                **common,
            }
        )
    out.append(
        {
            "series": "daemon-ttfb",
            "label": f"LiteLLM added TTFB p50 ({how})",
            "points": [[c, ll_ttfb[c]] for c in levels],
            "ylabel": "ms",
            "title": "Added time to first reasoning byte",
            "logy": True,
            **common,
        }
    )
    for prefix, label in measured.items():
        out.append(
            {
                "series": "daemon-throughput",
                "label": f"thoughtgate runs/s ({label})",
                "points": [[c, by_name[f"{prefix}runs_per_s_c{c}"]] for c in levels],
                "ylabel": "streamed runs per second",
                "title": "Throughput",
                **common,
            }
        )
    out.append(
        {
            "series": "daemon-throughput",
            "label": f"LiteLLM requests/s ({how})",
            "points": [[c, ll_rps[c]] for c in levels],
            "ylabel": "per second",
            "title": "Throughput",
            **common,
        }
    )
    return out


# ----------------------------------------------------------------------------- LiteLLM, live

LITELLM_SPEC = "litellm[proxy]==1.79.*"
LITELLM_VENV = REPO / "bench" / ".litellm-venv"
CHAT_BODY = {
    "model": "bench",
    "messages": [{"role": "user", "content": "bench"}],
    "stream": True,
}


def _litellm_venv() -> Path | None:
    """The proxy's own venv (``bench/.litellm-venv``), created on first use; ``None`` if not."""
    stamp = LITELLM_VENV / ".installed"
    exe = LITELLM_VENV / "bin" / "litellm"
    if stamp.exists() and stamp.read_text().strip() == LITELLM_SPEC and exe.exists():
        return LITELLM_VENV
    print(f"litellm: creating {LITELLM_VENV.relative_to(REPO)} and installing {LITELLM_SPEC} …")
    started = time.monotonic()
    try:
        subprocess.run(
            [sys.executable, "-m", "venv", "--clear", str(LITELLM_VENV)],
            check=True,
            timeout=120,
        )
        with (LITELLM_VENV / "pip.log").open("wb") as log:  # pip's warnings, off the console
            subprocess.run(
                [str(LITELLM_VENV / "bin" / "pip"), "install", "-q", LITELLM_SPEC],
                check=True,
                timeout=900,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
    except (OSError, subprocess.SubprocessError) as exc:
        print(
            f"litellm: install failed ({exc}; see {LITELLM_VENV / 'pip.log'}); "
            "falling back to the reference figures"
        )
        return None
    stamp.write_text(LITELLM_SPEC + "\n")
    print(f"litellm: installed in {time.monotonic() - started:.0f} s")
    return LITELLM_VENV


def _on_server_cpu() -> dict[str, Any]:
    """``Popen`` arguments that start a server on :data:`SERVER_CPU` (with ``--pin``): set in the
    child before it runs anything, so every thread it starts inherits it."""
    cpu = SERVER_CPU
    if cpu is None:
        return {}
    return {"preexec_fn": lambda: os.sched_setaffinity(0, {cpu})}


def _start_litellm(venv: Path, emulator_url: str, tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    """``litellm --config`` on loopback, one worker, no DB, telemetry or callbacks."""

    config = tmp / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        "  - model_name: bench\n"
        "    litellm_params:\n"
        "      model: openai/bench\n"
        f"      api_base: {emulator_url}/v1\n"
        "      api_key: dummy\n"
        "litellm_settings:\n"
        "  telemetry: false\n"
        "  callbacks: []\n"
        "  success_callback: []\n"
        "  failure_callback: []\n"
        "  set_verbose: false\n"
        "general_settings:\n"
        "  disable_spend_logs: true\n"
        "  disable_error_logs: true\n"
    )
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "LITELLM_"))}
    env.update(
        LITELLM_LOCAL_MODEL_COST_MAP="True",  # no fetch of the cost map from GitHub
        LITELLM_TELEMETRY="False",
        LITELLM_LOG="ERROR",
        NO_DOCS="True",
        PYTHONPATH="",
    )
    log = (tmp / "litellm.log").open("wb")
    proc = subprocess.Popen(
        [
            *(str(venv / "bin" / "litellm"), "--config", str(config), "--host", LOOPBACK),
            *("--port", str(port), "--num_workers", "1", "--telemetry", "False"),
        ],
        env=env,
        cwd=str(tmp),
        stdout=log,
        stderr=subprocess.STDOUT,
        **_on_server_cpu(),
    )
    url = f"http://{LOOPBACK}:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        with contextlib.suppress(OSError, ValueError, IndexError):
            status, _ = asyncio.run(_get(url, "/health/liveliness"))
            if status == 200:
                return proc, url
        time.sleep(0.25)
    stop(proc)
    tail = (tmp / "litellm.log").read_text(errors="replace")[-2000:]
    raise RuntimeError(f"litellm proxy did not start:\n{tail}")


async def _get(url: str, path: str) -> tuple[int, bytes]:
    host, port = url.removeprefix("http://").split(":")
    conn = await _Connection(host, int(port), "dummy").open()
    try:
        return await asyncio.wait_for(conn.request("GET", path), 5)
    finally:
        await conn.close()


async def _one_chat(conn: _Connection) -> tuple[float, int]:
    """(TTFB s to the first reasoning or text content, chunks) for one streamed completion."""
    started = time.monotonic()
    first = -1.0

    def first_content(data: str, now: float) -> bool:
        nonlocal first
        if data == "[DONE]":
            return False
        for choice in json.loads(data).get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("reasoning_content") or delta.get("content"):
                first = now - started
                return True
        return False

    frames = _Frames(first_content)
    status, _ = await conn.request("POST", "/v1/chat/completions", CHAT_BODY, on_chunk=frames.feed)
    assert status == 200 and first >= 0, (status, first)
    return first, frames.count


async def _chat_phase(url: str, concurrency: int, total: int) -> dict[str, Any]:
    host, port = url.removeprefix("http://").split(":")
    conns = [await _Connection(host, int(port), "dummy").open() for _ in range(concurrency)]
    try:
        await _warm_up(conns, _one_chat)
        remaining = [total]
        results: list[tuple[float, int]] = []

        async def worker(conn: _Connection) -> None:
            while remaining[0] > 0:
                remaining[0] -= 1
                results.append(await _one_chat(conn))

        started = time.monotonic()
        await asyncio.gather(*(worker(c) for c in conns))
        elapsed = time.monotonic() - started
    finally:
        for conn in conns:
            await conn.close()
    return {"elapsed": elapsed, "ttfb": sorted(r[0] for r in results), "runs": len(results)}


@contextlib.contextmanager
def _litellm_proxy(tmp: Path, emulator_url: str) -> Iterator[tuple[str, int] | None]:
    """LiteLLM's proxy against the emulator for the whole bench; yields its URL and process id,
    or ``None`` when it cannot be installed or started (the bench then says so and uses the
    reference figures).

    Started once: its start takes longer than a round of its phases, and its rounds alternate
    with thoughtgate's (:func:`main`). Idle between them, it used no measurable CPU (ADR 0049)."""
    venv = _litellm_venv()
    if venv is None:
        yield None
        return
    print("litellm: starting the proxy against the emulator …")
    try:
        proxy, proxy_url = _start_litellm(venv, emulator_url, tmp)
    except (OSError, RuntimeError) as exc:
        print(f"litellm: the proxy did not start ({exc}); falling back to the reference figures")
        yield None
        return
    try:
        version = subprocess.run(
            [
                str(venv / "bin" / "python"),
                "-c",
                "from importlib.metadata import version; print(version('litellm'), end='')",
            ],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        print(f"litellm: proxy {version or '1.79.x'} up at {proxy_url}")
        yield proxy_url, proxy.pid
    finally:
        stop(proxy)


def _litellm_round(
    proxy_url: str, emulator_url: str, levels: dict[int, int], pids: list[int]
) -> tuple[dict[int, dict[str, float]], list[HostShare | None]]:
    """One round of LiteLLM's figures, per concurrency: added TTFB p50/p99 and requests/s; and
    the host's share of each level's phases (:mod:`bench.host_steal`, ``pids`` the bench's
    processes).

    Added TTFB is the first content byte through the proxy minus the first byte straight from
    the emulator, at the same concurrency, in the same round (percentile minus percentile).
    """
    measured: dict[int, dict[str, float]] = {}
    hosts: list[HostShare | None] = []
    for concurrency, total in levels.items():
        before = sample(pids)
        direct = asyncio.run(_chat_phase(emulator_url, concurrency, total))
        via = asyncio.run(_chat_phase(proxy_url, concurrency, total))
        hosts.append(since(before))
        measured[concurrency] = {
            "ttfb_p50": (_pct(via["ttfb"], 0.5) - _pct(direct["ttfb"], 0.5)) * 1000,
            "ttfb_p99": (_pct(via["ttfb"], 0.99) - _pct(direct["ttfb"], 0.99)) * 1000,
            "rps": via["runs"] / via["elapsed"],
            "direct_rps": direct["runs"] / direct["elapsed"],
        }
        figures = ", ".join(f"{k} {v:.1f}" for k, v in measured[concurrency].items())
        print(f"litellm: c{concurrency} {figures}; {share_text(hosts[-1])}", flush=True)
    return measured, hosts


def _litellm_medians(
    rounds: list[dict[int, dict[str, float]]],
) -> dict[int, dict[str, float]] | None:
    """Each LiteLLM figure's median over the rounds (the targets derive from these)."""
    if not rounds:
        return None
    return {
        concurrency: {
            key: statistics.median(r[concurrency][key] for r in rounds) for key in figures
        }
        for concurrency, figures in rounds[0].items()
    }


def _litellm_rows(measured: dict[int, dict[str, float]]) -> list[dict[str, Any]]:
    rows = []
    for concurrency, m in sorted(measured.items()):
        tag = f"c{concurrency}"
        rows += [
            _result(f"litellm_ttfb_added_p50_{tag}", m["ttfb_p50"], "ms", None, False),
            _result(f"litellm_ttfb_added_p99_{tag}", m["ttfb_p99"], "ms", None, False),
            _result(f"litellm_requests_per_s_{tag}", m["rps"], "requests/s", None, True),
            _result(f"emulator_requests_per_s_{tag}", m["direct_rps"], "requests/s", None, True),
        ]
    return rows


def _variants_note(formats: list[str], rounds: int, start: int = 0) -> str:
    adapters = ", ".join(f"{name} = {FORMATS[name][0]}" for name in formats) or "not run"
    orders = [_adapter_order(n, formats, start) for n in range(1, rounds + 1)]
    never_first = [f for f in formats if all(order[0] != f for order in orders)]
    how = (
        f"Every phase ran in {rounds} rounds (each round a fresh pair of servers going through "
        "every phase once; LiteLLM's phases before thoughtgate's in odd rounds, after them in even "
        "ones; the real adapters' phases in the order given, rotated by one format a round and "
        "round 1's by the UTC hour the pass began modulo the formats (--adapter-order-start; "
        f"round 1 here: {', '.join(orders[0]) or 'none'}), so a format's phases do not always "
        "follow the same others, ADR 0124"
        + (
            f"; with {rounds} rounds for {len(formats)} formats, {', '.join(never_first)} never "
            "ran first in this pass (a pass begun at another hour leaves out another; "
            f"--rounds {len(formats)} puts each first once, ADR 0126, ADR 0150)"
            if never_first and rounds > 1
            else ""
        )
        + "); "
        "each figure is the median of its rounds' figures (of their p50s, rates, CPU per "
        "delta; a ratio the median of the rounds' ratios, both sides from the same round), the "
        "spread their least and greatest (ADR 0049). "
        if rounds > 1
        else "Every phase ran once (one round): a figure may be 2-4× off its median (ADR 0049). "
    )
    return how + (
        "Every phase warms up with three runs in turn, then one run on each of its connections "
        "at once, so it starts with a provider connection open per stream whatever phase ran "
        "before on the same server (ADR 0126: a daemon's first 100-run phase opened them in its "
        "first timed wave and measured its added first byte from a later provider stamp). "
        f"Two daemon variants on one server process: fake:bench (the in-process fake provider, "
        f"rows without a prefix; rows prefixed {ONE_REQUEST} start and follow each run with one "
        "request, POST /v1/runs/follow, instead of three) and the real adapters talking HTTP to "
        f"the emulator ({adapters}; rows prefixed by the format; the emulator is a lean server in "
        "its own process writing thoughtgate.testing.emulator's answers byte for byte, ADR 0133, "
        f"as a remote provider takes no CPU from the daemon's cores). Both stream {DELTAS} reasoning "
        f"+ {DELTAS} text deltas "
        f"per run, the first after {PROVIDER_TTFB_S * 1000:g} ms, then one every "
        f"{GAP_S * 1000:g} ms, on an absolute schedule (delta k due at open + "
        f"{PROVIDER_TTFB_S * 1000:g} ms + k × {GAP_S * 1000:g} ms; a late delta goes out at once, "
        "none is skipped), so the provider's pace does not slow down with the machine's load. "
        "cpu_per_delta = server CPU / (runs × provider deltas); "
        "in_process_cpu_per_delta = the same runs through a Runtime in the bench process (asyncio, "
        "as `thoughtgate run`; same store kind, config and mode, 100 runs 10 at a time), "
        + (
            "measured in every round beside the server that runs its kind (before it in odd "
            "rounds, after it in even ones, no server up), so each _vs_in_process ratio divides "
            "figures of the same round and is published as the median of the rounds' ratios "
            "(ADR 0116)"
            if rounds > 1
            else "measured once, before the server that runs its kind (no server up)"
        )
        + "; the _vs_ rows are ratios of these. The "
        "emulator paces its deltas like fake:bench, for LiteLLM's proxy too; a format's framing "
        "events (message_start, content_block_stop, response.created, [DONE], ...) take no slot "
        "of their own: they go with the head, with the next delta, or (after the last) with it, "
        f"so in every format a stream is {2 * DELTAS} paced writes, one delta each, and ends "
        f"{(PROVIDER_TTFB_S + (PROVIDER_DELTAS - 1) * GAP_S) * 1000:g} ms after its request, as "
        "fake:bench's does (ADR 0150; before it, each framing event took a slot and the formats' "
        "streams lasted 52-58 ms, ADR 0139). runs_per_s has its "
        "target (10× LiteLLM's requests/s) at 10 and 100 concurrent runs; at 1 it is measured "
        "only. Rows prefixed "
        f"{DURABLE} are fake:bench on a second server with the durable engine attached (DBOS's "
        "workflows in a file beside the store's, `thoughtgate serve`'s default), against runs in "
        "process with the "
        "engine attached too; durable_cpu_per_delta_vs_fake is the durable daemon's CPU per delta "
        "over the non-durable one's."
    )


def _litellm_note(measured: dict[int, dict[str, float]] | None, why: str, rounds: int) -> str:
    if measured:
        figures = ", ".join(
            f"c{c}: +{m['ttfb_p50']:.1f} ms p50 TTFB, {m['rps']:.0f} requests/s"
            for c, m in sorted(measured.items())
        )
        return (
            f"LiteLLM figures are measured live in the same run: its proxy ({LITELLM_SPEC}, own "
            "venv bench/.litellm-venv, one worker, no DB/telemetry/callbacks) in front of "
            "thoughtgate's emulator, added TTFB = first content byte via the proxy minus direct "
            f"from the emulator (the median of {rounds} round{'s' if rounds > 1 else ''}: "
            f"{figures}). Targets derive from these. Server and client share "
            "the machine's cores."
        )
    return (
        f"LiteLLM figures are the issue's published reference (TTFB added ~10/66/960 ms at "
        f"1/10/100 streams, ~40 requests/s): no live proxy run ({why}). Server and client share "
        "the machine's cores."
    )


def _bounds_note(
    litellm: dict[int, dict[str, float]] | None,
    commit_ms: float,
    floor: AppendFloor,
    durable: bool = True,
) -> str:
    """What bounds the runs/s and first-byte targets on this bench, from this run's figures
    (``durable``: the daemons record in a SQLite file, not in memory)."""
    c1 = litellm.get(1) if litellm else None
    ll_c1, whose = (
        (c1["ttfb_p50"], "LiteLLM's") if c1 is not None else (LITELLM_TTFB_MS[1], "the reference")
    )
    target = ll_c1 / 20
    left = target - floor.after_idle_p50
    parts = [
        (
            "Bounds, from this run: a delta is committed (SQLite, WAL, synchronous=FULL) before "
            "any reader sees it, so every ttfb_added includes one durable commit; "
            if durable
            else "Bounds, from this run: its daemons record in memory, so its ttfb_added "
            "includes no commit (with a SQLite store, WAL, synchronous=FULL, a delta is "
            "committed before any reader sees it); "
        )
        + "at one run that commit follows "
        f"an idle gap: one reasoning delta appended through the daemon's store "
        f"{PROVIDER_TTFB_S * 1000:.0f} ms after the last (the fake provider's wait before its "
        f"first delta) takes {floor.after_idle_p50:.2f} ms p50, {floor.after_idle_p99:.2f} ms "
        f"p99 ({floor.tight_p50:.2f} ms back to back; a bare commit in a tight loop "
        f"{commit_ms:.2f} ms, the least a commit costs on this disk, not what a run meets; the "
        "append measured before and after the phases, the lesser kept); the c1 target is "
        f"{target:.2f} ms (1/20 of {whose} {ll_c1:.1f} ms): "
        + (
            f"{left:.2f} ms are left after that append"
            if left > 0
            else f"below that append alone by {-left:.2f} ms"
        )
    ]
    if litellm:
        ceilings = ", ".join(
            (f"c{c}: target {m['rps'] * 10:.0f} runs/s" if c in RPS_LEVELS else f"c{c}: no target")
            + f", emulator alone {m['direct_rps']:.0f} requests/s"
            for c, m in sorted(litellm.items())
        )
        parts.append(
            "a daemon cannot complete runs faster than the emulator, alone, serves the same "
            "paced streams at the same concurrency, so a runs/s target above the emulator's own "
            f"rate is out of reach for any proxy ({ceilings})"
        )
    stream_s = PROVIDER_TTFB_S + (PROVIDER_DELTAS - 1) * GAP_S
    parts.append(
        f"one paced stream lasts {stream_s * 1000:.0f} ms (fake:bench's and the emulator's in "
        "every wire format alike: its last delta's slot, the framing taking none, ADR 0150), so c "
        "concurrent runs complete at most "
        f"c / {stream_s:.3f} s runs/s ("
        + ", ".join(f"c{c}: {c / stream_s:.0f}" for c in sorted(LITELLM_TTFB_MS))
        + "); hence no runs/s target at c1"
    )
    return "; ".join(parts) + "."


def _measure(
    proc: subprocess.Popen[bytes],
    info: dict[str, str],
    concurrency: int,
    total: int,
    model: str,
    profile: Path | None = None,
    single: bool = False,
) -> tuple[dict[str, Any], float]:
    """One phase against the server; returns its stats and the server's CPU seconds in it.

    With ``profile``, py-spy samples the server during the phase into that file (the sampler's
    own cost then shows in the figures: profile and measure in separate runs).
    """
    stop = record(proc.pid, profile) if profile is not None else None
    try:
        stats = asyncio.run(
            _phase(
                info["url"],
                info["key"],
                concurrency,
                total,
                model,
                functools.partial(_cpu_seconds, proc.pid),
                single,
            )
        )
    finally:
        if stop is not None:
            stop()
    if profile is not None and profile.exists():
        print(f"profile {profile.name}:\n{summary(profile)}")
    return stats, float(stats["cpu"])


class _Watch:
    """``--repeat``: one line per repetition of a phase, its figures next to the state of the
    server (:mod:`bench.process_stats`) and of the emulator, and what changed since the last."""

    def __init__(self, pid: int, stats_dir: Path, emulator_pid: int, db_path: Path | None) -> None:
        self.pid, self.stats_dir, self.emulator_pid, self.db_path = (
            pid,
            stats_dir,
            emulator_pid,
            db_path,
        )
        self.taken = 0
        self.client_gc = GcClock()  # the bench process's own collections, client side
        self.last_client = (0, 0.0)
        self.last = self._state()
        self.last_emulator_cpu = _cpu_seconds(emulator_pid)

    def _state(self) -> dict[str, Any]:
        self.taken += 1
        state = snapshot(self.pid, self.stats_dir, self.taken)
        if self.db_path is not None:
            state.update(file_sizes(self.db_path))
        return state

    def report(self, phase: str, repetition: int, stats: dict[str, Any], cpu: float) -> None:
        emulator_cpu = _cpu_seconds(self.emulator_pid)
        state, last = self._state(), self.last
        passes = "/".join(
            str(now - then) for now, then in zip(state["gc_passes"], last["gc_passes"], strict=True)
        )
        gc_ms = sum(state["gc_ms"]) - sum(last["gc_ms"])
        freed = "/".join(
            str(now - then)
            for now, then in zip(state["gc_collected"], last["gc_collected"], strict=True)
        )
        files = (
            f" db {state['db_mb']:.1f} MB wal {state['wal_mb']:.1f} MB" if "db_mb" in state else ""
        )
        runs = max(1, stats["runs"])
        print(
            f"repeat {phase} #{repetition}: ttfb_added_p50 {_pct(stats['added'], 0.5) * 1000:.2f}"
            f" ms (first wave {_pct(stats['first_wave'], 0.5) * 1000:.2f}), runs/s "
            f"{stats['runs'] / stats['elapsed']:.1f}, cpu_per_delta "
            f"{cpu / (runs * PROVIDER_DELTAS) * 1e6:.0f} µs | server rss {state['rss_mb']:.0f} MB,"
            f" objects {state['objects']} ({state['objects'] - last['objects']:+d}), tasks "
            f"{state['tasks']}, gc passes {passes} ({gc_ms:.0f} ms CPU, of which gen2 "
            f"{state['gc_ms'][2] - last['gc_ms'][2]:.0f}; freed {freed}, threshold "
            f"{state['gc_threshold'][0]}){files} | emulator rss "
            f"{rss_mb(self.emulator_pid):.0f} MB, cpu/run "
            f"{(emulator_cpu - self.last_emulator_cpu) / runs * 1e6:.0f} µs | client gc passes "
            f"{sum(self.client_gc.passes) - self.last_client[0]} "
            f"({(sum(self.client_gc.seconds) - self.last_client[1]) * 1000:.0f} ms), objects "
            f"{len(gc.get_objects())}, threads {threading.active_count()}, rss "
            f"{rss_mb(os.getpid()):.0f} MB",
            flush=True,
        )
        grown = collections.Counter(state["types"])
        grown.subtract(last["types"])
        growing = [(name, n) for name, n in grown.most_common(6) if n > 0]
        if growing:
            print(f"    grown: {', '.join(f'{name} +{n}' for name, n in growing)}")
        self.last, self.last_emulator_cpu = state, emulator_cpu
        self.last_client = (sum(self.client_gc.passes), sum(self.client_gc.seconds))


def _phase_rows(
    prefix: str,
    concurrency: int,
    stats: dict[str, Any],
    cpu: float,
    *,
    full: bool,
    requests: int = 3,
) -> list[dict[str, Any]]:
    """Rows of one phase; ``full`` adds the client-side TTFB, HTTP rate and per-event CPU.

    The first-byte p50 and the runs/s (at :data:`RPS_LEVELS`) carry a ``goal``, their target's
    kind: the target derives from LiteLLM's figures, known only once every round has run
    (:func:`_with_goal`). The fake provider's phases add, beside the first-byte p50, its
    ``ttfb_added_from_slot_p50`` (:func:`from_slot_s`), set beside the same target as
    information only (``goal`` ``ttfb_info``): which of the two the target judges is the
    planners' call (ADR 0113)."""
    tag = f"c{concurrency}"
    rps = stats["runs"] / stats["elapsed"]
    added, client = stats["added"], stats["client"]
    rows = [
        _result(f"{prefix}ttfb_added_p50_{tag}", _pct(added, 0.5) * 1000, "ms", None, False),
        _result(f"{prefix}ttfb_added_p99_{tag}", _pct(added, 0.99) * 1000, "ms", None, False),
    ]
    rows[0].update(goal="ttfb", level=concurrency)
    if stats["from_slot"]:  # the fake provider's: its first delta carries its slot
        slot_p50 = _pct(stats["from_slot"], 0.5) * 1000
        rows.insert(
            1, _result(f"{prefix}ttfb_added_from_slot_p50_{tag}", slot_p50, "ms", None, False)
        )
        rows[1].update(goal="ttfb_info", level=concurrency)
    if full:
        rows += [
            _result(f"{prefix}ttfb_client_p50_{tag}", _pct(client, 0.5) * 1000, "ms", None, False),
            _result(f"{prefix}ttfb_client_p99_{tag}", _pct(client, 0.99) * 1000, "ms", None, False),
        ]
    rows.append(_result(f"{prefix}runs_per_s_{tag}", rps, "runs/s", None, True))
    if concurrency in RPS_LEVELS:
        rows[-1].update(goal="rps", level=concurrency)
    if full:
        rows += [
            _result(f"{prefix}http_per_s_{tag}", rps * requests, "requests/s", None, True),
            _result(
                f"{prefix}cpu_per_event_{tag}",
                cpu / max(1, stats["events"]) * 1e6,
                "µs/event",
                None,
                False,
            ),
        ]
    per_delta = _per_delta(stats, cpu)
    rows.append(_result(f"{prefix}cpu_per_delta_{tag}", per_delta, "µs/delta", None, False))
    return rows


def _ratio(name: str, value: float, target: float | None = None) -> dict[str, Any]:
    return _result(name, value, "x", target, higher=False)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer runs at 1 concurrent run")
    parser.add_argument(
        "--flush-interval",
        type=float,
        default=None,
        help="what-if: the recorder's delta batching window in seconds (default: the shipped one)",
    )
    parser.add_argument(
        "--store",
        choices=("auto", "memory", "sqlite"),
        default="auto",
        help="auto: a SQLite file when thoughtgate.store.sqlite exists, else memory",
    )
    parser.add_argument(
        "--no-litellm",
        action="store_true",
        help="skip the live LiteLLM proxy run; compare with its published reference figures",
    )
    parser.add_argument(
        "--variant",
        choices=("all", "fake", "adapters"),
        default="all",
        help="fake: the zero-cost fake provider; adapters: the real adapters over HTTP",
    )
    parser.add_argument(
        "--formats",
        default=",".join(FORMATS),
        help=f"wire formats of the adapters variant, comma-separated ({', '.join(FORMATS)})",
    )
    parser.add_argument(
        "--profile",
        metavar="DIR",
        type=Path,
        default=None,
        help="sample the server with py-spy in every phase into DIR/<variant>_c<N>.txt "
        "(raw stacks) and print a summary of each; figures of a profiled run are not clean",
    )
    parser.add_argument(
        "--no-durable",
        action="store_true",
        help="skip the durable_ rows (the daemon with the durable engine, its default)",
    )
    parser.add_argument(
        "--levels",
        default=None,
        help="concurrencies to run, comma-separated, each C or C=RUNS (default 1,10,100 with "
        "20/100/300 runs, 10/100/300 with --quick); e.g. 1=60 to measure first-byte latency "
        "alone; a level run with another count than the full bench's is flagged (ADR 0042)",
    )
    parser.add_argument(
        "--trace",
        metavar="DIR",
        default=None,
        help="stamp the first reasoning delta's hops and every run's whole cycle (server and "
        "client) into DIR and print the median of each per phase (figures of a traced run are "
        "not clean)",
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help="the servers on one CPU, this client and the emulator on the others (Linux; a "
        "remote provider and client would not share the server's cores: ADR 0055)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=None,
        metavar="N",
        help="run each phase N times in a row against the same daemon and print each "
        "repetition's figures with the server's and the emulator's state (RSS, collections, live "
        "objects, SQLite file and WAL sizes); each round keeps its first repetition's rows",
    )
    parser.add_argument(
        "--age",
        type=int,
        default=0,
        metavar="RUNS",
        help="before the phases, age each daemon with RUNS untimed fake:bench runs, 10 at a time",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        metavar="R",
        help=f"measure every phase (thoughtgate's and LiteLLM's) in R rounds, alternated, and "
        f"report each figure's median with the rounds' min-max (default {FULL_ROUNDS}; 1 with "
        "--quick, --trace or --profile)",
    )
    parser.add_argument(
        "--adapter-order-start",
        type=int,
        default=None,
        metavar="K",
        help="round 1 runs the real adapters' phases from the K-th format given (0-based), each "
        "round after from the next (default: the UTC hour modulo the formats, ADR 0150)",
    )
    parser.add_argument("--serve", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--serve-durable", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args([] if argv is None else argv)
    if args.serve:  # PORT_FILE DB_URL [EMULATOR_URL]
        emulator = args.serve[2] if len(args.serve) > 2 else None
        _serve(
            Path(args.serve[0]), args.serve[1], args.flush_interval, emulator, args.serve_durable
        )
        return []
    global TRACE, SERVER_CPU
    if args.pin:
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        if len(cpus) < 2:
            parser.error("--pin needs Linux and at least two CPUs")
        SERVER_CPU = cpus[0]
        os.sched_setaffinity(0, cpus[1:])  # this client, and the emulator it starts
    if args.trace:
        TRACE = str(Path(args.trace).resolve())
        Path(TRACE).mkdir(parents=True, exist_ok=True)
        os.environ["BENCH_TRACE"] = TRACE
    formats = [f for f in args.formats.split(",") if f]
    unknown = sorted(set(formats) - set(FORMATS))
    if unknown:
        parser.error(f"unknown formats {unknown}; known: {', '.join(FORMATS)}")
    fake = args.variant in ("all", "fake")
    if args.variant == "fake":
        formats = []

    have_sqlite = importlib.util.find_spec("thoughtgate.store.sqlite") is not None
    durable = args.store == "sqlite" or (args.store == "auto" and have_sqlite)
    levels = dict(FULL_LEVELS) if not args.quick else {**FULL_LEVELS, 1: 10}
    if args.levels:
        chosen = [level.partition("=") for level in args.levels.split(",") if level]
        levels = {
            int(c): int(runs) if runs else levels.get(int(c), 10 * int(c)) for c, _, runs in chosen
        }
    for concurrency, total in levels.items():
        full = FULL_LEVELS.get(concurrency)
        if concurrency > 1 and total != full:
            print(
                f"note: c{concurrency} with {total} runs (the full bench: {full}): a phase's runs/s "
                "and CPU per delta depend on its runs per connection (fewer: more of the phase is "
                "its synchronized first wave, which batches better than a steady load; ADR 0042), "
                "so compare these figures only with phases of the same length"
            )
    rounds = args.rounds
    if rounds is None:
        rounds = 1 if args.quick or args.trace or args.profile else FULL_ROUNDS
    if rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.trace and rounds > 1:
        parser.error("--trace measures one round (each server writes its stamps on exit)")
    start = (
        _order_start(formats, time.gmtime().tm_hour)
        if args.adapter_order_start is None
        else args.adapter_order_start % max(1, len(formats))
    )
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp, emulator_process(Path(tmp)) as emulator_url:

        def db(name: str) -> str:
            return f"sqlite:///{Path(tmp) / name}.db" if durable else "memory://"

        emulator_pid = int(json.loads((Path(tmp) / "emulator.json").read_text())["pid"])

        def where(variant: str, concurrency: int, number: int) -> Path | None:
            if args.profile is None or number > 1:  # the first round only: one file a phase
                return None
            args.profile.mkdir(parents=True, exist_ok=True)
            return Path(args.profile) / f"{variant}_c{concurrency}.txt"

        why = "asked for" if args.store != "auto" else "no SQLite store here"
        print(f"store: {'SQLite file (durable)' if durable else f'memory ({why})'}")
        print(f"rounds: {rounds} (each figure is the median of its rounds' figures)")
        if formats:
            print(
                "the real adapters' order: "
                + "; ".join(
                    f"round {n}: {', '.join(_adapter_order(n, formats, start))}"
                    for n in range(1, rounds + 1)
                )
            )
        at = sample([os.getpid(), emulator_pid])
        commit_ms = bare_commit_ms(Path(tmp))
        floor = append_floor(Path(tmp), idle_s=PROVIDER_TTFB_S)
        print(
            f"commit floor, before the phases: {floor.text()}; bare commit {commit_ms:.3f} ms; "
            + share_text(since(at))
        )
        # (row prefix, model, one request per run, durable daemon)
        variants = (
            [("", FAKE_MODEL, False, False), (ONE_REQUEST, FAKE_MODEL, True, False)] if fake else []
        ) + [(f"{f}_", FORMATS[f][0], False, False) for f in formats]
        if fake and durable and not args.no_durable:
            variants.append((DURABLE, FAKE_MODEL, False, True))
        kinds = list(dict.fromkeys((model, on) for _, model, _, on in variants))
        adapters = {f"{f}_": f for f in formats}

        def _in_round_order(
            given: list[tuple[str, str, bool, bool]], number: int
        ) -> list[tuple[str, str, bool, bool]]:
            """The variants with the adapters' phases in round ``number``'s order
            (:func:`_adapter_order`); the fake provider's and the durable daemon's in place."""
            order = iter(f"{f}_" for f in _adapter_order(number, formats, start))
            by_prefix = {v[0]: v for v in given}
            return [by_prefix[next(order)] if v[0] in adapters else v for v in given]

        def measure_in_process(number: int, on: bool) -> dict[tuple[str, bool], float]:
            """Round ``number``'s in-process baseline of the kinds the durable (``on``) or the
            other server runs, while no server is up (ADR 0116)."""
            measured: dict[tuple[str, bool], float] = {}
            for i, (model, durable_kind) in enumerate(kinds):
                if durable_kind != on:
                    continue
                at = sample([os.getpid(), emulator_pid])
                name = db(f"in-process-r{number}-{i}")
                value = asyncio.run(
                    _in_process(model, name, emulator_url, IN_PROCESS_RUNS, 10, durable=on)
                )
                measured[(model, on)] = value
                print(
                    f"round {number}/{rounds} in process: {value:.1f} µs per provider delta, "
                    f"{share_text(since(at))}: {model}{' (durable)' if on else ''}"
                )
            return measured

        traced: list[str] = []
        # The bench's own processes (each server and the proxy join them): the rest of the busy
        # time is another's load. Round -> the host's share of each of its phases, thoughtgate's
        # and LiteLLM's (CPU steal: a slow figure on a busy host is not a regression, ADR 0050).
        ours = [os.getpid(), emulator_pid]
        hosts: dict[int, list[HostShare | None]] = collections.defaultdict(list)

        def thoughtgate_round(
            number: int,
        ) -> tuple[dict[tuple[str, str], dict[int, Phase]], dict[tuple[str, bool], float]]:
            """Every variant's phases, each server fresh (its own database file), the durable
            daemon second: what a single-round bench measured, once; and beside each server, the
            in-process baseline of its kinds, before it in odd rounds, after it in even ones
            (:func:`_round_steps`)."""
            # (row prefix, model) -> concurrency -> the phase's stats and server CPU seconds
            phases: dict[tuple[str, str], dict[int, Phase]] = {}
            baselines: dict[tuple[str, bool], float] = {}
            for step, on in _round_steps(number, sorted({on for *_, on in variants})):
                if step == IN_PROCESS:
                    baselines.update(measure_in_process(number, on))
                    continue
                name = f"bench{'-durable' if on else ''}-r{number}"
                port_file = Path(tmp) / f"port-{name}.json"
                env = child_env()
                stats_dir = Path(tmp) / f"stats-{name}"
                if args.repeat:
                    stats_dir.mkdir()
                    env["BENCH_STATS"] = str(stats_dir)
                proc = subprocess.Popen(
                    [
                        *(sys.executable, "-m", "bench.daemon_bench", "--serve", str(port_file)),
                        *(db(name), emulator_url),
                        *(["--serve-durable"] if on else []),
                        *(
                            ["--flush-interval", str(args.flush_interval)]
                            if args.flush_interval
                            else []
                        ),
                    ],
                    env=env,
                    cwd=str(REPO),
                    **_on_server_cpu(),
                )
                try:
                    deadline = time.monotonic() + 60
                    while not port_file.exists() and time.monotonic() < deadline:
                        time.sleep(0.05)
                    info = json.loads(port_file.read_text())
                    db_file = Path(tmp) / f"{name}.db" if durable else None
                    watch = (
                        _Watch(proc.pid, stats_dir, emulator_pid, db_file) if args.repeat else None
                    )
                    if args.age:
                        _measure(proc, info, 10, args.age, FAKE_MODEL)
                        print(f"aged the daemon with {args.age} fake:bench runs")
                    for prefix, model, single, durable_server in _in_round_order(variants, number):
                        if durable_server != on:
                            continue
                        label = prefix.rstrip("_") or "fake"
                        for concurrency, total in levels.items():
                            if (
                                not model.startswith("fake:")
                                and concurrency != 10
                                and label not in ALL_LEVELS
                            ):
                                continue
                            profile = where(label, concurrency, number)
                            before = sample([*ours, proc.pid])
                            stats, cpu = _measure(
                                proc, info, concurrency, total, model, profile, single
                            )
                            hosts[number].append(since(before))
                            phase = f"{label}_c{concurrency}"
                            print(
                                f"round {number}/{rounds} {_figures(stats, cpu)}, "
                                f"{share_text(hosts[number][-1])}: {phase}"
                            )
                            if watch is not None:
                                watch.report(phase, 1, stats, cpu)
                                for repetition in range(2, (args.repeat or 1) + 1):
                                    again_stats, again_cpu = _measure(
                                        proc, info, concurrency, total, model, None, single
                                    )
                                    watch.report(phase, repetition, again_stats, again_cpu)
                            if TRACE is not None:
                                dump_client(TRACE, phase)
                                traced.append(phase)
                            phases.setdefault((prefix, model), {})[concurrency] = (stats, cpu)
                finally:
                    stop(proc)
            return phases, baselines

        round_phases: list[dict[tuple[str, str], dict[int, Phase]]] = []
        round_baselines: list[dict[tuple[str, bool], float]] = []
        litellm_rounds: list[dict[int, dict[str, float]]] = []
        why = "--no-litellm"
        with contextlib.ExitStack() as stack:
            proxy = None
            if not args.no_litellm:
                proxy = stack.enter_context(_litellm_proxy(Path(tmp), emulator_url))
                why = "the proxy could not be installed or run"
                if proxy:
                    ours.append(proxy[1])
            for number in range(1, rounds + 1):
                # LiteLLM first in odd rounds, second in even ones: a noisy minute falls on
                # both sides of the comparison, not always on the same one.
                order = ["litellm", "thoughtgate"] if number % 2 else ["thoughtgate", "litellm"]
                for side in order:
                    if side == "thoughtgate":
                        idle = _cpu_seconds(proxy[1]) if proxy else 0.0
                        round_started = time.monotonic()
                        phases, baselines = thoughtgate_round(number)
                        round_phases.append(phases)
                        round_baselines.append(baselines)
                        if proxy:  # what the idle proxy took from thoughtgate's round
                            print(
                                f"litellm: the idle proxy used {_cpu_seconds(proxy[1]) - idle:.2f}"
                                f" s CPU during thoughtgate's {time.monotonic() - round_started:.0f} s"
                            )
                        continue
                    if proxy is None:
                        continue
                    try:
                        measured, phase_hosts = _litellm_round(proxy[0], emulator_url, levels, ours)
                        litellm_rounds.append(measured)
                        hosts[number] += phase_hosts
                    except (OSError, RuntimeError, AssertionError, ValueError) as exc:
                        print(f"litellm: live measurement failed ({exc}); using the reference")
                        proxy, litellm_rounds = None, []
                        why = "the proxy failed during the bench"
        for label in traced:  # the servers have written their stamps on exit
            assert TRACE is not None
            print(report(TRACE, label))
            print(cycle_report(TRACE, label))
        if TRACE is not None:
            print(counts_report(TRACE))
        at = sample([os.getpid(), emulator_pid])
        later = append_floor(Path(tmp), "append-floor-after.db", idle_s=PROVIDER_TTFB_S)
        print(f"commit floor, after the phases: {later.text()}; {share_text(since(at))}")
        floor = least(floor, later)
    print(f"daemon_bench: {rounds} round(s) took {time.monotonic() - started:.0f} s")
    litellm = _litellm_medians(litellm_rounds)
    per_round = [
        (_litellm_rows(litellm_rounds[i]) if litellm else [])
        + _round_rows(phases, round_baselines[i])
        for i, phases in enumerate(round_phases)
    ]
    results = [
        _result("sqlite_durable_commit_p50", commit_ms, "ms", None, False),
        _result("sqlite_append_after_idle_p50", floor.after_idle_p50, "ms", None, False),
        _result("sqlite_append_after_idle_p99", floor.after_idle_p99, "ms", None, False),
    ]
    results += [_with_goal(row, litellm) for row in median_rows(per_round)]
    round_hosts = [pooled(hosts[number]) for number in range(1, rounds + 1)]
    for number, share in enumerate(round_hosts, 1):
        print(f"host, round {number}/{rounds}: {share_text(share)}")
    results += round_rows(round_hosts)
    NOTES[:] = [
        _litellm_note(litellm, why, len(litellm_rounds)),
        _variants_note(formats, rounds, start),
        _bounds_note(litellm, commit_ms, floor, durable),
    ]
    print(NOTES[0])
    print(NOTES[2])
    results += _series(results, litellm)
    rows = [r for r in results if "series" not in r]
    width = max(len(r["name"]) for r in rows)
    heading, spread = ("median", "min–max of rounds") if rounds > 1 else ("value", "")
    print(f"{'figure':<{width}}  {heading:>10} {'unit':<11} {spread:<17} {'target':<16}")
    for r in rows:
        verdict = "" if r["ok"] is None else ("ok" if r["ok"] else "MISS")
        target = "" if r["target"] is None else f"target {r['target']:g}"
        if "info_target" in r:  # information, not a verdict (ADR 0113)
            target = f"(target {r['info_target']:g})"
            verdict = info_verdict(r)
        shown = f"{r['value']:>10.3f}" if isinstance(r["value"], float) else f"{r['value']:>10}"
        print(
            f"{r['name']:<{width}}  {shown} {r['unit']:<11} {spread_text(r):<17} "
            f"{target:<16} {verdict}"
        )
    source = "measured LiteLLM proxy figures above" if litellm else "LiteLLM's reference"
    print(
        f"targets: ≤ 1/20 of LiteLLM's added TTFB and ≥ 10× its requests/s ({source}; reference: "
        "~10/66/960 ms at 1/10/100 streams, ~40 requests/s); the real adapters' CPU per provider "
        "delta ≤ 2× the fake provider's at the same concurrency; server CPU per delta ≤ 2× the "
        "in-process run's at 10 and 100 concurrent runs"
    )
    return results


def _per_delta(stats: dict[str, Any], cpu: float) -> float:
    """Server CPU µs per streamed provider delta of a phase."""
    return cpu / max(1, int(stats["runs"]) * PROVIDER_DELTAS) * 1e6


def _figures(stats: dict[str, Any], cpu: float) -> str:
    """A phase's headline figures, for the console line of each round."""
    slot = (
        f" (from its slot {_pct(stats['from_slot'], 0.5) * 1000:6.2f})"
        if stats["from_slot"]
        else ""
    )
    return (
        f"ttfb_added_p50 {_pct(stats['added'], 0.5) * 1000:6.2f} ms{slot}, runs/s "
        f"{stats['runs'] / stats['elapsed']:6.1f}, cpu_per_delta {_per_delta(stats, cpu):4.0f} µs"
    )


def _round_rows(
    phases: dict[tuple[str, str], dict[int, Phase]], in_process: dict[tuple[str, bool], float]
) -> list[dict[str, Any]]:
    """One round's rows: each phase's, the in-process baseline of its kind (``in_process``, by
    model and durable engine: measured in the same round, ADR 0116), each phase's ratio to it,
    and, for the adapters and the durable daemon, its ratio to the fake provider's phase at the
    same concurrency in the same round: both sides of every ratio share the round's minutes.
    :func:`~bench.repetitions.median_rows` then publishes each row's median over the rounds, a
    ratio's as the median of the rounds' ratios."""

    fake_per_delta = {
        c: _per_delta(stats, cpu) for c, (stats, cpu) in phases.get(("", FAKE_MODEL), {}).items()
    }
    out: list[dict[str, Any]] = []
    for (prefix, model), by_level in phases.items():
        base = in_process[(model, prefix == DURABLE)]
        out.append(_result(f"{prefix}in_process_cpu_per_delta", base, "µs/delta", None, False))
        for concurrency, (stats, cpu) in by_level.items():
            requests = 1 if prefix == ONE_REQUEST else 3
            full = model == FAKE_MODEL
            rows = _phase_rows(prefix, concurrency, stats, cpu, full=full, requests=requests)
            per_delta = _per_delta(stats, cpu)
            tag = f"c{concurrency}"
            out += rows
            out.append(
                _ratio(
                    f"{prefix}cpu_per_delta_vs_in_process_{tag}",
                    per_delta / base,
                    target=IN_PROCESS_RATIO if concurrency in RATIO_LEVELS else None,
                )
            )
            if concurrency in fake_per_delta and (prefix == DURABLE or model != FAKE_MODEL):
                # durable: what durability adds to the daemon's CPU per delta (no target)
                out.append(
                    _ratio(
                        f"{prefix}cpu_per_delta_vs_fake_{tag}",
                        per_delta / fake_per_delta[concurrency],
                        target=None if prefix == DURABLE else 2.0,
                    )
                )
    return out


def _with_goal(row: dict[str, Any], litellm: dict[int, dict[str, float]] | None) -> dict[str, Any]:
    """``row`` judged against its ``goal``'s target, from LiteLLM's figures (measured: their
    medians over the rounds; else the published reference): ≤ 1/20 of its added TTFB p50, ≥ 10×
    its requests/s; the bench's own keys (goal, level, higher) dropped."""
    row = dict(row)
    goal, level = row.pop("goal", None), row.pop("level", None)
    if goal in ("ttfb", "ttfb_info"):
        ll_ttfb = litellm[level]["ttfb_p50"] if litellm else LITELLM_TTFB_MS[level]
        if goal == "ttfb":
            row["target"] = round(ll_ttfb / 20, 3)
        else:  # the same target, beside the figure as information (no verdict: ADR 0113)
            row["info_target"] = round(ll_ttfb / 20, 3)
            row["info_ok"] = row["value"] <= row["info_target"]
    elif goal == "rps":
        row["target"] = round((litellm[level]["rps"] if litellm else LITELLM_RPS) * 10, 1)
    row = judge(row)
    row.pop("higher", None)
    return row


if __name__ == "__main__":
    main(sys.argv[1:])
