"""Where a run's first reasoning byte waits: monotonic stamps at every hand-off. Not a test.

``daemon_bench --trace DIR`` sets ``BENCH_TRACE`` for the server process, which then patches (in
that process only, never in the shipped code) the hops the first reasoning delta takes:

* the requests: ``arrived`` (uvicorn parsed the request's headers), ``app`` (the ASGI app got it),
  ``head`` (the response's start was sent), for ``create``, ``ticket`` and ``stream``;
* the delta: ``emit`` (the recorder got it from the agent loop), ``settled`` (the ``task.started``
  commit it waits for has resolved), ``append`` (the store's append began), ``commit_began`` and
  ``committed`` (the writer thread's commit of the group holding it began, returned), ``handed``
  (the loop ran the thread's hand-off), ``published`` (the store handed it to the run's
  listeners), ``written`` (its chunk reached the socket's transport, directly or through the
  response's ``send``);
* for the real adapters, the provider path before ``emit``: ``sent`` (the emulator's send stamp
  carried in the delta's text), ``arrived_p`` (the daemon's provider connection got the bytes,
  ``netio``'s ``data_received``), ``read_p`` (the network read returned them to the body reader),
  ``decoded_p`` (the SSE decoder completed the event), ``parsed_p`` (the adapter yielded the
  delta to the agent loop);

and the client side adds ``c_<request>_sent`` / ``c_<request>_done`` and ``c_first`` (the socket
read that completed the first reasoning frame). All stamps of one run go to one JSON line;
:func:`report` prints the median of each hop relative to the provider's send stamp.

The whole cycle of a run (:func:`cycle_report`, every run, three requests or one): where the
time between a client's ``POST`` and the same connection's next one goes, hop by hop; the paced
provider stream is ~49 ms of it. Server side: ``admit`` (the route's admission began), ``create
decided`` (the loop ran the admission's statements: the quota's verdict is known, ADR 0036),
``create committed`` / ``create handed`` (its ``COMMIT`` returned on the writer thread; the loop
ran the hand-off), ``admitted`` (the route has the run back), ``execute`` (the run's execution
task began), ``provider open`` / ``provider end`` (the provider's stream was asked for its first
item; it said it had no more), ``last emit`` (the recorder got the run's last delta),
``finish`` (the run's ending was asked of the store), ``finish decided`` / ``finish committed``
/ ``finish handed``, ``ended`` (the store returned the ending), ``terminal written`` (the chunk
holding the terminal event reached the socket), ``stream end`` (the stream's or the follow's
response sent its end: its last body, or the feed's direct write that ended it, ADR 0085). The client adds ``c_ticket_sent`` / ``c_stream_sent``,
``c_stream_done`` (the body's end was read) and ``c_next_sent`` (the connection's next
``POST``). Stamps of one run are keyed by its id (the one-request client takes it from its first
reasoning frame). A durable daemon's run stamps ``execute`` when its execution (with or without
a DBOS workflow) began.

For the real adapters the cycle also has (ADR 0044): ``request written`` (the request left in
its one write), ``response head``, ``provider terminal`` (the adapter yielded the turn's finish:
the terminal event was read), ``body end`` (the body's last read), ``response closing`` /
``response closed`` (the connection's release), ``emit_last`` / ``emit_last done`` and
``recorder close`` / ``recorder closed`` (the run's last events held, the recorder closed); and
the emulator's own schedule, which it writes to ``emulator-<pid>.jsonl`` (joined to the run by
the first delta's send stamp): ``e_start`` (its app got the request: the schedule's start),
``e_due_first`` (the first delta's slot), ``e_first_written`` (the write holding it returned),
``e_last_nonterminal``, ``e_terminal`` (the write holding ``[DONE]``, ``message_stop`` or
``response.completed``) and ``e_end`` (the body's end). The fake provider's first delta
carries its slot beside its stamp (``T12.3481 S12.3450``, ADR 0113), read back as its run's
``e_due_first`` when the recorder gets it (:func:`first_delta_stamps`), and
:func:`report` adds three per-run hops that say which wake-ups ``ttfb_added`` counts for each
(ADR 0110: the fake's stamp follows its wake-up in the daemon's loop; the emulator's precedes
the daemon's wake-up for its bytes).

Each server process's totals (:func:`counts_report`, ADR 0043): its store jobs by kind (and
whether the event loop queued them), the write groups the loop ran and those it sent to the
writer thread whole (the database locked by another connection, or a write raised: ADR 0036),
the SQL transactions, commits and statements of SQLAlchemy engines by thread (in the daemon, only
DBOS's system database uses SQLAlchemy), how many durable executions had no workflow (ADR 0031),
the cyclic garbage collector's collections once the first run was created, and each thread's CPU
over the process's life.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "client_stamp",
    "counts_report",
    "cycle_report",
    "dump_client",
    "first_delta_stamps",
    "install",
    "report",
    "wrapped_ms",
]

_STAMPED = re.compile(r'"text":\s*"T(\d\d\.\d{4})')
_RUN_ID = re.compile(r'"run_id":\s*"([^"]+)"')
_TERMINAL = re.compile(rb'"type":\s*"run\.(settlement\.completed|failed|error|interrupted)"')
_ACTION = re.compile(r"^(create|finish) run '([^']+)'")
"""A writer job that starts or ends a run (its action names the run)."""
_run_of_task: Any = None
"""``cycle:`` the run whose execution the current task serves (a ``ContextVar``)."""
_STAMPED_TEXT = re.compile(r"T(\d\d\.\d{4})(?: S(\d\d\.\d{4}))?")
"""A provider's stamp in a delta's text, and the fake provider's slot after it (ADR 0113)."""
_STAMP_BYTES = re.compile(rb"T(\d\d\.\d{4})")
_stamps: dict[str, dict[str, float]] = defaultdict(dict)
_by_stamp: dict[str, dict[str, float]] = defaultdict(dict)
"""Provider-path hops, keyed by the emulator's send stamp until ``emit`` names the run."""
_lock = threading.Lock()
_tracked_jobs: dict[int, str] = {}
"""Writer job id -> run id, for the queued write that holds a run's stamped first delta."""
_tracked_actions: dict[str, str] = {}
"""Writer-job action -> run id, for the append that holds a run's stamped first delta."""


def _note(run_id: str, what: str, when: float | None = None) -> None:
    with _lock:
        _stamps[run_id].setdefault(what, time.monotonic() if when is None else when)


def _note_last(run_id: str, what: str) -> None:
    """A hop that happens many times a run (a delta): its last time is kept."""
    with _lock:
        _stamps[run_id][what] = time.monotonic()


def _note_stamp(data: bytes | memoryview | str, what: str) -> None:
    """A provider-path hop of the bytes or text holding an emulator's send stamp."""
    if isinstance(data, str):
        found = _STAMPED_TEXT.search(data)
        key = found.group(1) if found else None
    else:
        found_b = _STAMP_BYTES.search(data)
        key = found_b.group(1).decode() if found_b else None
    if key is not None:
        with _lock:
            _by_stamp[key].setdefault(what, time.monotonic())


def _install_provider_hops() -> None:
    from thoughtgate.providers import netio, sse, wire

    received = netio._Protocol.data_received

    def data_received(self: Any, data: bytes | memoryview) -> None:
        _note_stamp(data, "arrived_p")
        received(self, data)

    netio._Protocol.data_received = data_received  # type: ignore[method-assign]

    read = netio._Stream.read

    async def traced_read(self: Any, max_bytes: int, timeout: float | None = None) -> bytes:
        data = await read(self, max_bytes, timeout)
        _note_stamp(data, "read_p")
        return data

    netio._Stream.read = traced_read  # type: ignore[method-assign]

    feed = sse.SSEDecoder.feed

    def traced_feed(self: Any, chunk: bytes) -> Any:
        out = feed(self, chunk)
        for message in out:
            _note_stamp(message.data, "decoded_p")
        return out

    sse.SSEDecoder.feed = traced_feed  # type: ignore[method-assign]

    stream = wire.HTTPProvider.stream

    async def traced_stream(self: Any, request: Any) -> Any:
        async for chunk in stream(self, request):
            text = getattr(chunk, "text", None)
            if isinstance(text, str) and text.startswith("T"):
                _note_stamp(text, "parsed_p")
            yield chunk

    wire.HTTPProvider.stream = traced_stream  # type: ignore[method-assign]


def _stamped(events: Sequence[Any]) -> bool:
    for event in events:
        if getattr(event, "type", None) == "reasoning.delta":
            text = event.payload.get("text")
            if isinstance(text, str) and text.startswith("T"):
                return True
    return False


def install(directory: str) -> None:
    """Patch the server's hops (this process only) and write the stamps at exit."""
    import uvicorn.protocols.http.httptools_impl as h
    from starlette.applications import Starlette

    from thoughtgate.orchestration.recorder import EventRecorder
    from thoughtgate.server import sse
    from thoughtgate.server.app import _App
    from thoughtgate.store import log as store_log
    from thoughtgate.store import sqlite as store_sqlite
    from thoughtgate.store import sqlite_thread

    headers_complete = h.HttpToolsProtocol.on_headers_complete

    def on_headers_complete(self: Any) -> None:
        self.scope["tb.arrived"] = time.monotonic()
        headers_complete(self)

    h.HttpToolsProtocol.on_headers_complete = on_headers_complete  # type: ignore[method-assign]
    _install_provider_hops()

    app_call = _App.__call__

    async def call(self: Any, scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await app_call(self, scope, receive, send)
            return
        path, method = scope["path"], scope["method"]
        kind = (
            "create"
            if (method, path) == ("POST", "/v1/runs")
            else "ticket"
            if path == "/v1/tickets"
            else "stream"
            if path.endswith("/stream")
            else "follow"
            if path == "/v1/runs/follow"
            else None
        )
        if kind is None:
            await app_call(self, scope, receive, send)
            return
        arrived, entered = scope.get("tb.arrived", 0.0), time.monotonic()
        run_id = path.split("/")[3] if kind == "stream" else None
        started: list[float] = []

        async def traced_send(message: Any) -> None:
            nonlocal run_id
            if message["type"] == "http.response.start":
                started.append(time.monotonic())
            elif message["type"] == "http.response.body":
                body = message.get("body", b"")
                if run_id is None and body:
                    found = _RUN_ID.search(body.decode("utf-8", "replace"))
                    if found:
                        run_id = found.group(1)
                        _note(run_id, f"{kind}_arrived", arrived)
                        _note(run_id, f"{kind}_app", entered)
                        _note(run_id, f"{kind}_head", started[0] if started else entered)
                _written(body)
                if kind in ("stream", "follow") and run_id and not message.get("more_body"):
                    _note(run_id, "stream end")
            await send(message)

        if run_id is not None:
            _note(run_id, f"{kind}_arrived", arrived)
            _note(run_id, f"{kind}_app", entered)
        try:
            # as ``_App`` does, with the server's own ``send`` in the scope: a live stream's
            # direct writes (ADR 0022) need it, and the tracing ``send`` must not turn them off
            scope[sse.SERVER_SEND] = send
            await Starlette.__call__(self, scope, receive, traced_send)
        finally:
            if run_id is not None and started:
                _note(run_id, f"{kind}_head", started[0])

    _App.__call__ = call  # type: ignore[method-assign]

    socket_writers = sse._socket_writers

    def traced_socket_writers(server_send: object, direct: sse.DirectWrites) -> None:
        socket_writers(server_send, direct)
        write, end = direct.write, direct.end
        if write is None or end is None:
            return

        def traced(chunk: bytes) -> bool:
            done = write(chunk)
            if done:
                _written(chunk)
            return done

        def traced_end(chunk: bytes) -> bool:  # the feed ended the response (ADR 0085)
            done = end(chunk)
            if done:
                _written(chunk)
                found = _RUN_ID.search(chunk.decode("utf-8", "replace"))
                if found:
                    _note(found.group(1), "stream end")
            return done

        direct.write, direct.end = traced, traced_end

    sse._socket_writers = traced_socket_writers

    emit_delta = EventRecorder.emit_delta

    async def traced_emit_delta(self: Any, event: Any) -> None:
        if _stamped([event]):
            _note(self.run_id, "emit")
            found = _STAMPED_TEXT.match(event.payload["text"])
            if found is not None:
                for what, when in first_delta_stamps(found, time.monotonic()).items():
                    _note(self.run_id, what, when)
                with _lock:
                    hops = _by_stamp.pop(found.group(1), {})
                for what, when in hops.items():
                    _note(self.run_id, what, when)
            self._tb_first = True
            try:
                await emit_delta(self, event)
            finally:
                self._tb_first = False
            return
        await emit_delta(self, event)

    EventRecorder.emit_delta = traced_emit_delta  # type: ignore[method-assign]

    settle = EventRecorder._settle

    async def traced_settle(self: Any) -> None:
        await settle(self)
        if getattr(self, "_tb_first", False):
            _note(self.run_id, "settled")

    EventRecorder._settle = traced_settle  # type: ignore[method-assign]

    # where an append's write is queued: ``_queue_append`` where it exists (ADR 0028), else
    # ``append``
    name = "_queue_append" if hasattr(store_sqlite.SQLiteStore, "_queue_append") else "append"
    queue = getattr(store_sqlite.SQLiteStore, name)

    def track(run_id: str, events: Any) -> None:
        if _stamped(events):
            _note(run_id, "append")
            _tracked_actions[f"append {len(events)} events to run {run_id!r}"] = run_id

    if name == "append":

        async def traced_append(self: Any, run_id: str, events: Any, **fenced: Any) -> Any:
            track(run_id, events)
            return await queue(self, run_id, events, **fenced)

        store_sqlite.SQLiteStore.append = traced_append  # type: ignore[method-assign]
    else:

        def traced_queue(self: Any, run_id: str, events: Any, after: Any, *held: Any) -> Any:
            job = queue(self, run_id, events, after, *held)  # (the execution, ADR 0090)
            if _stamped(events):  # by the job itself: task.started's has the same action
                _note(run_id, "append")
                _tracked_jobs[id(job)] = run_id
            return job

        setattr(store_sqlite.SQLiteStore, name, traced_queue)

    commit_group = sqlite_thread.SQLiteThread._commit_group

    def traced_commit_group(self: Any, jobs: list[Any]) -> Any:
        _parts.clear()
        kinds: dict[str, int] = {}
        for job in jobs:
            kind = _kind(job.action)
            kinds[kind] = kinds.get(kind, 0) + 1
            if getattr(job, "merge", None) is None and job.grouped:
                job.fn = _timed_write(job.fn, f"write {kind}")
        out, began, now, cpu = _clocked(commit_group, self, jobs)
        for job in jobs:
            run_id = _group_noted(job, jobs, began, cpu)
            if run_id is not None:
                _note(run_id, "committed", now)
                for part, ms in _parts.items():
                    _note(run_id, f"part {part}", ms)
                for kind, count in kinds.items():
                    _note(run_id, f"count {kind}", float(count))
                other = (now - began) * 1000 - sum(_parts.values())  # (parts do not nest)
                _note(run_id, "part other writes and BEGIN", other)
        return out

    def timed_part(method: Any, kind: Any) -> Any:
        def timed(self: Any, *args: Any) -> Any:
            start = time.monotonic()
            try:
                return method(self, *args)
            finally:
                part = kind(args)
                _parts[part] = _parts.get(part, 0.0) + (time.monotonic() - start) * 1000

        return timed

    thread_class = sqlite_thread.SQLiteThread
    for name, kind in (
        ("_run_merged", lambda args: "merged appends"),
        ("_commit", lambda args: "COMMIT"),
    ):
        if hasattr(thread_class, name):  # (a tree before ADR 0030 has none of them)
            setattr(thread_class, name, timed_part(getattr(thread_class, name), kind))

    sqlite_thread.SQLiteThread._commit_group = traced_commit_group  # type: ignore[method-assign]

    if hasattr(sqlite_thread.SQLiteThread, "_group_on_loop"):  # ADR 0036: loop, then thread
        on_loop = sqlite_thread.SQLiteThread._group_on_loop
        commit_handed = sqlite_thread.SQLiteThread._commit_handed

        def traced_on_loop(self: Any, jobs: list[Any]) -> Any:
            out, began, now, cpu = _clocked(on_loop, self, jobs)
            for job in jobs:
                run_id = _group_noted(job, jobs, began, cpu)
                if run_id is not None:
                    _note(run_id, "loop_ran", now)
            return out

        def traced_commit_handed(self: Any) -> Any:
            handed = self._handed
            out, began, now, cpu = _clocked(commit_handed, self)
            for outcome in [] if handed is None else handed.done:
                job = outcome.job
                run_id = _tracked_jobs.get(id(job)) or _tracked_actions.get(job.action)
                if run_id is not None:
                    _note(run_id, "thread_took", began)
                    _note(run_id, "committed", now)
                    _note(run_id, "part thread's COMMIT, wall", (now - began) * 1000)
                    _note(run_id, "part thread's COMMIT, CPU", cpu * 1000)
            return out

        sqlite_thread.SQLiteThread._group_on_loop = traced_on_loop  # type: ignore[method-assign]
        sqlite_thread.SQLiteThread._commit_handed = traced_commit_handed  # type: ignore[method-assign]

    settle_all = sqlite_thread._settle

    def traced_settle_all(outcomes: list[Any], then: Callable[[], None] | None = None) -> None:
        for outcome in outcomes:
            run_id = _tracked_jobs.pop(id(outcome.job), None) or _tracked_actions.pop(
                outcome.job.action, None
            )
            if run_id is not None:
                _note(run_id, "handed")
        settle_all(outcomes, then)

    sqlite_thread._settle = traced_settle_all

    publish = store_log.RunWakeups.publish

    def traced_publish(self: Any, run_id: str, events: Any) -> None:
        if _stamped(events):
            _note(run_id, "published")
        publish(self, run_id, events)

    store_log.RunWakeups.publish = traced_publish  # type: ignore[method-assign]

    for name in ("find_api_key", "get_api_key"):  # every request's key check: its whole wait
        setattr(
            store_sqlite.SQLiteStore, name, _timed(name, getattr(store_sqlite.SQLiteStore, name))
        )

    job_class = sqlite_thread._Job
    created: dict[int, float] = {}

    def stamped_job(action: str, *rest: Any, **named: Any) -> Any:
        job = job_class(action, *rest, **named)
        if action == "look up an API key":
            created[id(job)] = time.monotonic()
        return job

    sqlite_thread._Job = stamped_job  # type: ignore[assignment,misc]
    run_alone = sqlite_thread.SQLiteThread._run_alone

    def traced_run_alone(self: Any, job: Any) -> Any:
        queued = created.pop(id(job), None)
        if queued is None:
            return run_alone(self, job)
        began = time.monotonic()
        try:
            return run_alone(self, job)
        finally:
            _lookups["key job on its store thread: queued"].append((began - queued) * 1000)
            _lookups["key job on its store thread: ran"].append((time.monotonic() - began) * 1000)

    sqlite_thread.SQLiteThread._run_alone = traced_run_alone  # type: ignore[method-assign]

    _install_cycle_hops()
    _install_counts()
    path = Path(directory) / f"server-{os.getpid()}.jsonl"
    atexit.register(_dump, path)


def _install_cycle_hops() -> None:
    """The ``cycle:`` stamps (see the module's docstring), on top of the first byte's."""
    import contextvars

    from thoughtgate.orchestration.recorder import EventRecorder
    from thoughtgate.orchestration.runtime import Runtime
    from thoughtgate.providers import wire
    from thoughtgate.server.manager import RunManager
    from thoughtgate.store import sqlite as store_sqlite
    from thoughtgate.store import sqlite_thread
    from thoughtgate.testing.fake import FAKE_SCRIPTS

    global _run_of_task
    running: contextvars.ContextVar[str | None] = contextvars.ContextVar("tb_run", default=None)
    _run_of_task = running

    def jobs_noted(jobs: Any, what: str, when: float) -> None:
        for job in jobs:
            found = _ACTION.match(job.action)
            if found is not None:
                _note(found.group(2), f"{found.group(1)} {what}", when)

    admit = Runtime.admit

    async def traced_admit(self: Any, request: Any, **named: Any) -> Any:
        began = time.monotonic()
        run, rank = await admit(self, request, **named)
        _note(run.run_id, "admit", began)
        _note(run.run_id, "admitted")
        return run, rank

    Runtime.admit = traced_admit  # type: ignore[method-assign]

    execute = RunManager._execute

    async def traced_execute(self: Any, run_id: str) -> None:
        _note(run_id, "execute")
        running.set(run_id)
        await execute(self, run_id)

    RunManager._execute = traced_execute  # type: ignore[method-assign]

    def opened(what: str = "provider open") -> None:
        run_id = running.get()
        if run_id is not None:
            _note(run_id, what)

    stream = wire.HTTPProvider.stream

    async def traced_stream(self: Any, request: Any) -> Any:
        opened()
        async for chunk in stream(self, request):
            if type(chunk).__name__ == "FinishChunk":
                opened("provider terminal")
            yield chunk
        opened("provider end")

    wire.HTTPProvider.stream = traced_stream  # type: ignore[method-assign]
    from thoughtgate.providers import http as providers_http

    batches = providers_http.HTTPTransport.event_batches

    async def traced_batches(self: Any, response: Any, judge: Any = None) -> Any:
        async for batch in batches(self, response, judge):
            yield batch
        opened("body end")

    providers_http.HTTPTransport.event_batches = traced_batches  # type: ignore[method-assign]
    transport_open = providers_http.HTTPTransport.open

    @contextlib.asynccontextmanager
    async def traced_open(self: Any, *args: Any, **named: Any) -> Any:
        async with transport_open(self, *args, **named) as response:
            opened("response head")
            yield response
            opened("response closing")
        opened("response closed")

    providers_http.HTTPTransport.open = traced_open  # type: ignore[method-assign]
    from thoughtgate.providers import netio

    send_unsent = netio._Stream._send_unsent

    async def traced_send_unsent(self: Any) -> None:
        opened("request written")
        await send_unsent(self)

    netio._Stream._send_unsent = traced_send_unsent  # type: ignore[method-assign]
    script = FAKE_SCRIPTS.get("bench")
    if script is not None:

        def traced_script(request: Any, turn: int) -> Any:
            inner = script(request, turn)

            async def gen() -> Any:
                opened()
                async for item in inner:
                    yield item
                opened("provider end")

            return gen()

        FAKE_SCRIPTS["bench"] = traced_script

    emit_delta = EventRecorder.emit_delta

    async def traced_emit_delta(self: Any, event: Any) -> None:
        _note_last(self.run_id, "last emit")
        await emit_delta(self, event)

    EventRecorder.emit_delta = traced_emit_delta  # type: ignore[method-assign]
    extend_delta = EventRecorder.extend_delta

    def traced_extend_delta(self: Any, event: Any, text: str) -> bool:
        _note_last(self.run_id, "last emit")
        return extend_delta(self, event, text)

    EventRecorder.extend_delta = traced_extend_delta  # type: ignore[method-assign]
    emit_last = EventRecorder.emit_last

    async def traced_emit_last(self: Any, events: Any) -> None:
        _note(self.run_id, "emit_last")
        await emit_last(self, events)
        _note(self.run_id, "emit_last done")

    EventRecorder.emit_last = traced_emit_last  # type: ignore[method-assign]
    close = EventRecorder.close

    async def traced_close(self: Any) -> None:
        _note(self.run_id, "recorder close")
        await close(self)
        _note(self.run_id, "recorder closed")

    EventRecorder.close = traced_close  # type: ignore[method-assign]

    finish_run = store_sqlite.SQLiteStore.finish_run

    async def traced_finish_run(self: Any, run_id: str, events: Any, ending: Any) -> Any:
        _note(run_id, "finish")
        out = await finish_run(self, run_id, events, ending)
        _note(run_id, "ended")
        return out

    store_sqlite.SQLiteStore.finish_run = traced_finish_run  # type: ignore[method-assign]

    thread_class = sqlite_thread.SQLiteThread
    commit_group = thread_class._commit_group

    def traced_commit_group(self: Any, jobs: list[Any]) -> Any:
        began = time.monotonic()
        out = commit_group(self, jobs)
        jobs_noted(jobs, "decided", began)
        jobs_noted(jobs, "committed", time.monotonic())
        return out

    thread_class._commit_group = traced_commit_group  # type: ignore[method-assign]
    run_alone = thread_class._run_alone

    def traced_run_alone(self: Any, job: Any) -> Any:
        began = time.monotonic()
        out = run_alone(self, job)
        if job.grouped:
            jobs_noted([job], "decided", began)
            jobs_noted([job], "committed", time.monotonic())
        return out

    thread_class._run_alone = traced_run_alone  # type: ignore[method-assign]
    if hasattr(thread_class, "_group_on_loop"):
        on_loop = thread_class._group_on_loop
        commit_handed = thread_class._commit_handed

        def traced_on_loop(self: Any, jobs: list[Any]) -> Any:
            out = on_loop(self, jobs)
            jobs_noted(jobs, "decided", time.monotonic())
            return out

        def traced_commit_handed(self: Any) -> Any:
            handed = self._handed
            out = commit_handed(self)
            if handed is not None:
                jobs_noted([o.job for o in handed.done], "committed", time.monotonic())
            return out

        thread_class._group_on_loop = traced_on_loop  # type: ignore[method-assign]
        thread_class._commit_handed = traced_commit_handed  # type: ignore[method-assign]
    settle_all = sqlite_thread._settle

    def traced_settle_all(outcomes: list[Any], then: Callable[[], None] | None = None) -> None:
        jobs_noted([o.job for o in outcomes], "handed", time.monotonic())
        settle_all(outcomes, then)

    sqlite_thread._settle = traced_settle_all


_counts: dict[str, float] = defaultdict(float)
"""``counts:`` what the server did in all, by kind (see :func:`_install_counts`)."""
_thread_cpu: dict[int, tuple[str, float]] = {}
"""Native thread id -> (its name, its CPU seconds when last looked at)."""
_collector: Any = None
"""The garbage collector's passes since the first run was created (``process_stats.GcClock``)."""


def _counting_collections() -> None:
    import gc

    from bench.process_stats import GcClock

    global _collector
    _collector = GcClock()
    _counts["gc objects frozen at start-up (gc.freeze; not per run)"] = gc.get_freeze_count()


def _install_counts() -> None:
    """The process's totals (see the module's docstring): what a durable daemon adds to a run is
    counted, not guessed (ADR 0043 found DBOS writing nothing per run where lock contention with
    the event log had been suspected)."""
    from thoughtgate.orchestration.runtime import Runtime
    from thoughtgate.store import sqlite_thread

    job_class = sqlite_thread._Job

    def counted_job(action: str, *rest: Any, **named: Any) -> Any:
        job = job_class(action, *rest, **named)
        where = "loop" if threading.current_thread() is threading.main_thread() else "thread"
        kind = "write" if job.grouped else "call"
        _counts[f"store {kind} {_kind(action)} ({where})"] += 1
        if _collector is None and kind == "write" and action.startswith("create run"):
            _counting_collections()  # from the first run on, not the start-up's
        return job

    sqlite_thread._Job = counted_job  # type: ignore[assignment,misc]
    thread_class = sqlite_thread.SQLiteThread
    if hasattr(thread_class, "_group_on_loop"):
        on_loop = thread_class._group_on_loop

        def counted_on_loop(self: Any, jobs: list[Any]) -> Any:
            queued = self._queued
            out = on_loop(self, jobs)
            if len(jobs) >= 2:
                sent = self._queued - queued
                _counts["store groups of 2+ the loop ran"] += 1
                if sent >= 2:
                    _counts["store groups of 2+ sent to the thread whole"] += 1
            return out

        thread_class._group_on_loop = counted_on_loop  # type: ignore[method-assign]

    if hasattr(thread_class, "_commit"):  # (a tree before ADR 0030 has none)
        commit = thread_class._commit

        def counted_commit(self: Any, conn: Any, failed: list[Any], done: list[Any]) -> Any:
            before = self.commits
            out = commit(self, conn, failed, done)
            if self.commits > before:  # writes per commit: the store writes over this count
                _counts["store commits (each one fsync)"] += 1
            return out

        thread_class._commit = counted_commit  # type: ignore[method-assign]

    try:
        from sqlalchemy import event
        from sqlalchemy.engine import Engine
    except ImportError:  # (no SQLAlchemy: nothing of DBOS to count)
        pass
    else:

        def on(what: str) -> Any:
            def counted(*_: Any, **__: Any) -> None:
                _counts[f"sqlalchemy {what} ({threading.current_thread().name})"] += 1

            return counted

        event.listen(Engine, "begin", on("transactions"))
        event.listen(Engine, "commit", on("commits"))
        event.listen(Engine, "before_cursor_execute", on("statements"))

    workflow = Runtime.execute_workflow

    async def traced_workflow(self: Any, run_id: str, **named: Any) -> Any:
        _note(run_id, "execute")
        if _run_of_task is not None:
            _run_of_task.set(run_id)
        _counts["durable executions" + (" (unwritten)" if named.get("unwritten") else "")] += 1
        return await workflow(self, run_id, **named)

    Runtime.execute_workflow = traced_workflow  # type: ignore[method-assign]

    def sample() -> None:
        while True:
            for thread in threading.enumerate():
                native = thread.native_id
                if native is None:
                    continue
                try:
                    fields = Path(f"/proc/self/task/{native}/stat").read_text()
                except OSError:
                    continue
                ticks = fields.rsplit(")", 1)[1].split()
                cpu = (int(ticks[11]) + int(ticks[12])) / os.sysconf("SC_CLK_TCK")
                with _lock:
                    _thread_cpu[native] = (thread.name, cpu)
            time.sleep(0.2)

    threading.Thread(target=sample, name="trace-cpu-sampler", daemon=True).start()


_lookups: dict[str, list[float]] = defaultdict(list)
"""What a key lookup waited for -> each lookup's wait, ms."""
_parts: dict[str, float] = {}
"""The writer's time in each part of the group being committed, ms (writer thread only)."""
_GROUP_FIGURES = {
    "group_cpu": "writer CPU of that commit, ms (the thread's; the loop's for a group it ran)",
    "group_merged": "appends in that group (made together when more than one, ADR 0030)",
}


def _clocked(fn: Any, *args: Any) -> tuple[Any, float, float, float]:
    """``fn(*args)``, when it began and ended (monotonic) and this thread's CPU for it (s)."""
    began, cpu = time.monotonic(), time.thread_time()
    out = fn(*args)
    return out, began, time.monotonic(), time.thread_time() - cpu


def _group_noted(job: Any, jobs: list[Any], began: float, cpu: float) -> str | None:
    """For a job holding a traced run's first delta: its run, with when its group began, the
    group's size, CPU (s) and merged appends noted."""
    run_id = _tracked_jobs.get(id(job)) or _tracked_actions.get(job.action)
    if run_id is not None:
        _note(run_id, "commit_began", began)
        _note(run_id, "group", float(len(jobs)))
        _note(run_id, "group_cpu", cpu * 1000)
        merged = sum(getattr(j, "merge", None) is not None for j in jobs)
        _note(run_id, "group_merged", float(merged))
    return run_id


def _kind(action: str) -> str:
    """What a writer job does, without its run: "append", "finish run", "save task", ..."""
    words = action.split()
    return "append" if words[0] == "append" else " ".join(w for w in words[:2] if "'" not in w)


def _timed_write(fn: Any, part: str) -> Any:
    """A write done alone (not merged), its time counted in ``part`` of the group."""

    def timed(conn: Any) -> Any:
        start = time.monotonic()
        try:
            return fn(conn)
        finally:
            _parts[part] = _parts.get(part, 0.0) + (time.monotonic() - start) * 1000

    return timed


def _timed(name: str, lookup: Any) -> Any:
    async def timed(self: Any, *args: Any) -> Any:
        start = time.monotonic()
        try:
            return await lookup(self, *args)
        finally:
            _lookups[f"{name} call→answer"].append((time.monotonic() - start) * 1000)

    return timed


def _written(chunk: bytes) -> None:
    if _TERMINAL.search(chunk):
        found_end = _RUN_ID.search(chunk.decode("utf-8", "replace"))
        if found_end:
            _note(found_end.group(1), "terminal written")
    if b'"reasoning.delta"' not in chunk:
        return
    text = chunk.decode("utf-8", "replace")
    if _STAMPED.search(text):
        found = _RUN_ID.search(text)
        if found:
            _note(found.group(1), "written")


def _dump(path: Path) -> None:
    with _lock, path.open("a") as out:
        for run_id, stamps in _stamps.items():
            out.write(json.dumps({"run_id": run_id, **stamps}) + "\n")
    if _lookups:
        path.with_name(f"keys-{os.getpid()}.json").write_text(json.dumps(_lookups))
    if _collector is not None:
        for generation, (passes, seconds) in enumerate(
            zip(_collector.passes, _collector.seconds, strict=True)
        ):
            _counts[f"gc passes of generation {generation}"] = passes
            _counts[f"gc CPU ms in generation {generation}"] = seconds * 1000
    with _lock:
        cpu: dict[str, float] = defaultdict(float)
        for name, seconds in _thread_cpu.values():
            cpu[re.sub(r"[-_ ]?\d+(?=\b|$)", "", name) or name] += seconds
        counted = {"counts": dict(_counts), "thread_cpu_s": dict(cpu)}
    path.with_name(f"counts-{os.getpid()}.json").write_text(json.dumps(counted))


_client: list[dict[str, Any]] = []


def client_stamp(record: dict[str, Any]) -> None:
    """One run's client-side stamps (``run_id`` and ``c_*``)."""
    _client.append(record)


def dump_client(directory: str, label: str) -> None:
    path = Path(directory) / f"client-{label}.jsonl"
    with path.open("a") as out:
        for record in _client:
            out.write(json.dumps(record) + "\n")
    _client.clear()


def _server_stamps(directory: str) -> dict[str, dict[str, float]]:
    """Every run's server-side stamps, by run id (the server processes' files in ``directory``)."""
    server: dict[str, dict[str, float]] = {}
    for path in Path(directory).glob("server-*.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            server.setdefault(record.pop("run_id"), {}).update(record)
    emulated: dict[float, dict[str, float]] = {}
    for path in Path(directory).glob("emulator-*.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            emulated[round(float(record.pop("key")), 4)] = record
    if emulated:  # the emulator's pacing, joined by the first delta's send stamp
        for stamps in server.values():
            sent = stamps.get("sent")
            record = emulated.get(round(sent % 100, 4)) if sent is not None else None
            if record is not None:
                stamps.update(record)
    return server


_COUNTED_HOPS = {
    "the first delta's slot to its stamp (not in ttfb_added)": ("e_due_first", "sent"),
    "the emulator's stamp to its write returned (in ttfb_added)": ("sent", "e_first_written"),
    "that write to the daemon's read of it (in ttfb_added)": ("e_first_written", "read_p"),
    "  that write to the daemon's socket read (the loop's I/O phase)": (
        "e_first_written",
        "arrived_p",
    ),
    "  that socket read to the body read (the loop's ready queue)": ("arrived_p", "read_p"),
    "the delta's emit to its frame written (commit, publish, frame; in both)": ("emit", "written"),
}
"""Per-run hops that say which wake-ups ``ttfb_added`` counts (ADR 0110). The fake provider
stamps its first delta after its timer and its task have woken in the daemon's loop, so that
loop's lateness is outside its figure; the emulator stamps just before its write, so the
daemon's wake-ups for the socket and for the reading task are inside the adapters' figure. The
write's wait is split in two (ADR 0130): until the daemon's loop polls the socket and its
provider connection gets the bytes, then until that loop's ready queue reaches the task that
reads them; a run whose stamp was split across two socket reads has no ``arrived_p`` and is left
out of those two. The last hop is the same path after the provider for both kinds of provider:
the wait for the delta's group commit and its hand-back, the fan-out and the frame's write."""


def wrapped_ms(first: float, then: float) -> float:
    """ms from ``first`` to ``then``, seconds known only modulo 100 s (a stamp, ``T12.3456``), so
    signed and within ±50 s. ``sent`` is rebuilt from a stamp of 0.1 ms modulo 100 s: rounded up
    past the moment it was read back (the fake emits within microseconds of it), it lands 100 s
    early, so the difference is taken modulo 100 s too; two stamps on either side of the clock's
    wrap (``T99.9990``, then ``T00.0020``) are 3 ms apart, not -99,997. ``daemon_bench`` takes the
    fake provider's lateness to its first slot this way (``ttfb_added_from_slot``)."""
    return ((then - first + 50) % 100 - 50) * 1000


def first_delta_stamps(found: re.Match[str], now: float) -> dict[str, float]:
    """The ``time.monotonic()`` stamps a run's first reasoning delta's text carries, read back at
    ``now`` (just after it was emitted): ``sent``, the provider's stamp (``T12.3481``), and for
    the fake provider the slot its schedule had it due (``S12.3450``, ADR 0113) as
    ``e_due_first``, the name the emulator's own trace gives its slot, so :data:`_COUNTED_HOPS`
    takes the fake's lateness to its slot from the delta itself. Each is known modulo 100 s to
    0.1 ms: ``sent`` is the latest time at or before ``now`` that reads so (as ADR 0110 had it),
    the slot the nearest to ``now``; the hops between them are taken with :func:`wrapped_ms`."""
    stamps = {"sent": now - ((now % 100 - float(found.group(1))) % 100)}
    if found.group(2) is not None:
        stamps["e_due_first"] = now + wrapped_ms(now % 100, float(found.group(2))) / 1000
    return stamps


def report(directory: str, label: str) -> str:
    """Median of each stamp relative to the provider's send stamp (``emit``), per run."""
    server, path = _server_stamps(directory), Path(directory) / f"client-{label}.jsonl"
    if not path.exists():
        return f"{label}: no client stamps"
    offsets: dict[str, list[float]] = defaultdict(list)
    groups: list[float] = []
    extras: dict[str, list[float]] = defaultdict(list)
    hops: dict[str, list[float]] = defaultdict(list)
    for line in path.read_text().splitlines():
        client = json.loads(line)
        stamps = {**server.get(client["run_id"], {}), **client}
        base = stamps.get("emit")
        if base is None:
            continue
        for name, (first, then) in _COUNTED_HOPS.items():
            if first in stamps and then in stamps:
                hops[name].append(wrapped_ms(stamps[first], stamps[then]))
        if "group" in stamps:
            groups.append(stamps.pop("group"))
        counted = [n for n in stamps if n.startswith(("part ", "count "))]
        for name in [*_GROUP_FIGURES, *counted]:
            if name in stamps:
                extras[name].append(stamps.pop(name))
        for name, value in stamps.items():
            if isinstance(value, float):
                offsets[name].append((value - base) * 1000)
    rows = sorted(offsets.items(), key=lambda item: statistics.median(item[1]))
    lines = [f"{label}: median ms from the provider's first reasoning delta (n={len(groups)})"]
    lines += [f"  {name:<18} {statistics.median(values):+9.3f}" for name, values in rows]
    lines += [
        f"  {name}: median {statistics.median(values):.2f} ms (per run)"
        for name, values in hops.items()
    ]
    if groups:
        lines.append(f"  writer group size of that commit: median {statistics.median(groups):.0f}")
    for name, text in _GROUP_FIGURES.items():
        if extras[name]:
            lines.append(f"  {text}: median {statistics.median(extras[name]):.2f}")
    for name in sorted(n for n in extras if n.startswith("count ")):
        values = extras[name]
        counts = sorted(values + [0.0] * (len(groups) - len(values)))
        lines.append(
            f"  {name[6:]} writes in that group: median {statistics.median(counts):.0f}, "
            f"mean {statistics.fmean(counts):.1f}"
        )
    for name in sorted(n for n in extras if n.startswith("part ")):
        values = extras[name]  # a part missing from a group counts as 0 there
        spent = sorted(values + [0.0] * (len(groups) - len(values)))
        lines.append(
            f"  writer's {name[5:]} in that commit: median {statistics.median(spent):.2f} ms, "
            f"mean {statistics.fmean(spent):.2f} ms"
        )
    waits: dict[str, list[float]] = defaultdict(list)
    for keys in Path(directory).glob("keys-*.json"):
        for name, values in json.loads(keys.read_text()).items():
            waits[name] += values
    for name, values in sorted(waits.items()):
        q = statistics.quantiles(values, n=10) if len(values) > 1 else values * 9
        lines.append(
            f"  {name}: median {statistics.median(values):.1f} ms, "
            f"p90 {q[-1]:.1f} ms (n={len(values)})"
        )
    return "\n".join(lines)


_CYCLE_ORIGIN = "c_create_sent"


def cycle_report(directory: str, label: str) -> str:
    """Each ``cycle:`` stamp's median, in ms after the client's ``POST`` of its run, in the order
    of those medians, with the median hop from the stamp before it (per run, both present):
    where a run's whole cycle goes, from one ``POST`` to the connection's next."""
    server, path = _server_stamps(directory), Path(directory) / f"client-{label}.jsonl"
    if not path.exists():
        return f"{label}: no client stamps"
    offsets: dict[str, list[float]] = defaultdict(list)
    runs: list[dict[str, float]] = []
    for line in path.read_text().splitlines():
        client = json.loads(line)
        stamps = {**server.get(client["run_id"], {}), **client}
        origin = stamps.get(_CYCLE_ORIGIN)
        if origin is None:
            continue
        times = {
            n: (v - origin) * 1000
            for n, v in stamps.items()
            if isinstance(v, float) and not n.startswith(("part ", "count ", "group"))
        }
        runs.append(times)
        for name, value in times.items():
            offsets[name].append(value)
    order = sorted(offsets, key=lambda name: statistics.median(offsets[name]))
    lines = [
        f"{label}: the run's cycle, median ms after the client's POST (n={len(runs)}), "
        "and the median hop from the line before"
    ]
    previous: str | None = None
    for name in order:
        hops = [r[name] - r[previous] for r in runs if previous and name in r and previous in r]
        hop = f"{statistics.median(hops):+8.2f}" if hops else " " * 8
        lines.append(
            f"  {name:<22} {statistics.median(offsets[name]):9.2f}  {hop}  (n={len(offsets[name])})"
        )
        previous = name
    return "\n".join(lines)


def counts_report(directory: str) -> str:
    """Each server process's totals (:func:`_install_counts`), per run started (its store's
    ``create run`` writes) and in all, and its threads' CPU."""
    lines: list[str] = []
    for path in sorted(Path(directory).glob("counts-*.json")):
        found = json.loads(path.read_text())
        counts: dict[str, float] = found["counts"]
        durable = any(name.startswith("durable executions") for name in counts)
        runs = sum(v for n, v in counts.items() if n.startswith("store write create run"))
        lines.append(
            f"{'durable' if durable else 'plain'} server ({path.stem}): totals over its "
            f"{runs:.0f} runs, and per run"
        )
        for name, value in sorted(counts.items()):
            lines.append(f"  {name:<64} {value:8.0f}  {value / max(1.0, runs):8.2f}")
        cpu = sorted(found["thread_cpu_s"].items(), key=lambda item: -item[1])
        lines.append("  threads' CPU, s: " + ", ".join(f"{n} {s:.2f}" for n, s in cpu if s))
    return "\n".join(lines) or "no counts"
