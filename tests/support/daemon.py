"""Shared helpers for the daemon tests: fake scripts, daemon tools, a loopback server, SSE reading.

Its fake scripts (``fake:canary`` and friends) are in :data:`SCRIPTS`; ``support.fakes`` registers
them (conftest does, for the session; a ``thoughtgate serve`` subprocess through ``--tools
support.served:SERVER_TOOLS``).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from thoughtgate.access.keys import create_key
from thoughtgate.access.roles import ROLE_NAMES
from thoughtgate.engine.tools import ToolRegistry, tool
from thoughtgate.errors import ProviderError
from thoughtgate.providers.base import TurnRequest
from thoughtgate.providers.sse import SSEDecoder, SSEMessage
from thoughtgate.store.base import EventStore
from thoughtgate.testing.fake import ScriptFn, reasoning, text, tool_call
from thoughtgate.types import ContinuityBlock, ContinuityChunk, FinishChunk, UsageChunk

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"
TESTS = REPO / "tests"
ROLES = ROLE_NAMES
MODES = ("hidden", "surface", "telemetry_only")


# ----------------------------------------------------------------------------- fake scripts


def _token(request: TurnRequest) -> str:
    """The word after the script name in the prompt: ``"canary abc123"`` -> ``"abc123"``."""
    first = request.messages[0].text if request.messages else ""
    parts = first.split()
    return parts[1] if len(parts) > 1 else "x"


def markers(token: str) -> dict[str, str]:
    return {
        "reasoning": f"REASONING-{token}",
        "carrier": f"CARRIER-{token}",
        "tool": f"TOOLARG-{token}",
    }


def _canary(request: TurnRequest, turn: int) -> Iterator[Any]:
    mark = markers(_token(request))
    if turn == 0:
        yield reasoning("I should look this up: ")
        yield reasoning(mark["reasoning"])
        yield ContinuityChunk(
            ContinuityBlock(
                "anthropic.thinking",
                {
                    "type": "thinking",
                    "thinking": mark["carrier"],
                    "signature": "SIG-" + mark["carrier"],
                },
                provider="anthropic",
                model="fake",
            )
        )
        yield tool_call("lookup", {"query": mark["tool"]}, call_id="call_lookup")
    else:
        yield reasoning(f"Now I know. {mark['reasoning']} again.")
        yield text("The answer is 42.")


def tool_markers(token: str) -> dict[str, str]:
    """Tool inputs that come back in tool detail texts, not in tool inputs or outputs: a
    validation error (``input_value=...``), an exception quoting its input, a progress message."""
    return {
        "invalid": f"TOOLVALIDATION-{token}",
        "raised": f"TOOLEXCEPTION-{token}",
        "progress": f"TOOLPROGRESS-{token}",
    }


def _toolcanary(request: TurnRequest, turn: int) -> AsyncIterator[Any]:
    """``toolcanary TOKEN``: one tool call per turn, each carrying a marker into a tool detail
    text, a short pause before each turn (so a reader can follow it live), then an answer."""
    mark = tool_markers(_token(request))
    calls: list[tuple[str, dict[str, Any]]] = [
        ("lookup", {"query": {"nested": mark["invalid"]}}),
        ("explode", {"query": mark["raised"]}),
        ("progressive", {"query": mark["progress"]}),
    ]

    async def gen() -> AsyncIterator[Any]:
        await asyncio.sleep(0.15)
        yield reasoning(f"turn {turn}: using the tools")
        if turn < len(calls):
            name, arguments = calls[turn]
            yield tool_call(name, arguments, call_id=f"call_{name}")
        else:
            yield text("The tools have spoken.")

    return gen()


def _approval(request: TurnRequest, turn: int) -> Iterator[Any]:
    if turn == 0:
        yield reasoning("This needs a human.")
        yield tool_call("dangerous", {"target": "prod"}, call_id="call_danger")
    else:
        yield text("done after the approval step")


def _chatty(request: TurnRequest, turn: int) -> AsyncIterator[Any]:
    count = int(_token(request)) if _token(request).isdigit() else 200

    async def gen() -> AsyncIterator[Any]:
        for i in range(count):
            yield reasoning(f"r{i} ")
            yield text(f"t{i} ")
            if i % 10 == 0:
                await asyncio.sleep(0.002)

    return gen()


def _slow(request: TurnRequest, turn: int) -> AsyncIterator[Any]:
    async def gen() -> AsyncIterator[Any]:
        yield reasoning("thinking slowly")
        for _ in range(600):
            await asyncio.sleep(0.05)
        yield text("finally")

    return gen()


def _billedslow(request: TurnRequest, turn: int) -> AsyncIterator[Any]:
    """Calls ``lookup``, billed 12 in and 37 out (49 tokens), then thinks slowly, as
    ``fake:slow`` does: a run to stop after a billed turn (ADR 0131)."""
    asked = any(m.role == "tool" for m in request.messages)

    async def gen() -> AsyncIterator[Any]:
        if not asked:
            for chunk in tool_call("lookup", {"query": "q"}, call_id="call_1"):
                yield chunk
            yield UsageChunk(input_tokens=12, output_tokens=37)
            yield FinishChunk("tool_calls")
            return
        async for chunk in _slow(request, turn):
            yield chunk

    return gen()


BILLED_CANARY: dict[str, tuple[int, int]] = {
    "input_tokens": (7100001, 7200002),
    "output_tokens": (8100003, 8200004),
    "reasoning_tokens": (6100005, 6200006),
    "cache_read_tokens": (5100007, 5200008),
    "cache_write_tokens": (4100009, 4200010),
}
"""What ``fake:tokencanary`` bills its two turns: figures no other part of a run spells."""


def billed_canaries() -> set[str]:
    """Every billed count of a ``tokencanary`` run, as digits: each turn's, their totals, and the
    run's (and its task's) sums. None may reach a reader below developer (ADR 0163)."""
    counts = {n for pair in BILLED_CANARY.values() for n in pair}
    counts |= {sum(pair) for pair in BILLED_CANARY.values()}
    turns = [BILLED_CANARY["input_tokens"][i] + BILLED_CANARY["output_tokens"][i] for i in (0, 1)]
    counts |= {*turns, sum(turns)}
    return {str(n) for n in counts}


def _tokencanary(request: TurnRequest, turn: int) -> Iterator[Any]:
    """A tool loop billed as a provider bills reasoning: output tokens include the turn's
    reasoning, input tokens the signed thinking sent back (:data:`BILLED_CANARY`)."""
    n = 1 if any(m.role == "tool" for m in request.messages) else 0
    yield reasoning("Let me think about this for a while. " * (n + 1))
    if n == 0:
        yield from tool_call("lookup", {"query": "q"}, call_id="call_lookup")
    else:
        yield text("The answer is 42.")
    yield UsageChunk(**{name: pair[n] for name, pair in BILLED_CANARY.items()})
    yield FinishChunk("tool_calls" if n == 0 else "stop")


def _providerfail(request: TurnRequest, turn: int) -> Iterator[Any]:
    """Thinks, then fails as a provider does whose error body quotes the request's reasoning."""
    mark = markers(_token(request))["reasoning"]
    yield reasoning(mark)
    said = f"prompt is too long: {mark}"
    raise ProviderError(said, provider="fake", status=400, by_provider=True, detail=said)


SCRIPTS: dict[str, ScriptFn] = {
    "canary": _canary,
    "providerfail": _providerfail,
    "toolcanary": _toolcanary,
    "tokencanary": _tokencanary,
    "approval": _approval,
    "chatty": _chatty,
    "slow": _slow,
    "billedslow": _billedslow,
}
"""The daemon tests' fake scripts by name (``--model fake:NAME``), for ``support.fakes``."""


@tool
def lookup(query: str) -> str:
    """Look something up."""
    return f"result for {query}"


@tool(requires_approval=True)
def dangerous(target: str) -> str:
    """Change something that matters."""
    return f"changed {target}"


@tool
def explode(query: str) -> str:
    """Always fails, quoting its input (as real tools' exceptions do)."""
    raise ValueError(f"nothing found for {query}")


@tool
async def progressive(query: str, progress: Any = None) -> str:
    """Reports progress that quotes its input."""
    if progress is not None:
        await progress(f"scanning the archive for {query}")
    return "archived"


SERVER_TOOLS = [lookup, dangerous, explode, progressive]
TOOL_CANARY_TOOLS = ["lookup", "explode", "progressive"]


def server_tools() -> ToolRegistry:
    return ToolRegistry(SERVER_TOOLS)


# ----------------------------------------------------------------------------- keys


def seed_keys(store: EventStore) -> dict[str, str]:
    """One key per role, created before the server starts (on a throwaway loop)."""

    async def make() -> dict[str, str]:
        return {
            role: (await create_key(store, name=f"{role}-key", role=role)).key for role in ROLES
        }

    return asyncio.run(make())


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def agui_input(prompt: str = "hi", **thoughtgate: Any) -> dict[str, Any]:
    """An AG-UI ``RunAgentInput`` of one user message; ``thoughtgate``: its forwarded props
    (``model=...``)."""
    return {
        "threadId": "t-1",
        "runId": "r-1",
        "messages": [{"id": "u-1", "role": "user", "content": prompt}],
        "tools": [],
        "context": [],
        "state": {},
        "forwardedProps": {"thoughtgate": thoughtgate},
    }


# ----------------------------------------------------------------------------- servers


class ThreadServer:
    """uvicorn on 127.0.0.1 with a free port, in a thread (real sockets, real HTTP)."""

    def __init__(self, app: Any, **options: Any) -> None:
        """``options``: more of ``uvicorn.Config``'s (``http=`` a protocol class)."""
        import uvicorn  # here, not at the top: ``thoughtgate run`` subprocesses import this module

        config = uvicorn.Config(
            app, host="127.0.0.1", port=0, log_level="warning", lifespan="on", **options
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.base_url = ""

    def __enter__(self) -> ThreadServer:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.base_url = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)


@dataclass
class Daemon:
    base_url: str
    keys: dict[str, str]
    store: EventStore
    app: Any
    server: Any = None
    """The ``uvicorn.Server`` serving it (``server_state.connections``: its open ones)."""

    def client(self, role: str | None = None, **kw: Any) -> httpx.Client:
        headers = auth(self.keys[role]) if role else {}
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=10, **kw)

    def get(self, path: str, role: str | None = None, **kw: Any) -> httpx.Response:
        """One GET with a client that is closed right after."""
        with self.client(role) as c:
            return c.get(path, **kw)

    def start_run(self, body: dict[str, Any], role: str = "member") -> str:
        with self.client(role) as c:
            r = c.post("/v1/runs", json=body)
            assert r.status_code == 202, r.text
            return str(r.json()["run_id"])

    def wait_done(self, run_id: str, timeout: float = 10) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        with self.client("owner") as c:
            while True:
                run: dict[str, Any] = c.get(f"/v1/runs/{run_id}").json()
                if run["status"] not in ("pending", "running"):
                    return run
                if time.monotonic() > deadline:
                    raise TimeoutError(f"run {run_id} still {run['status']}")
                time.sleep(0.02)

    def awaiting_approval(self, timeout: float = 30) -> str:
        """A run (``fake:approval``, the ``dangerous`` tool) started as a member and waiting
        for its approval (``call_danger``) once this returns; ``timeout`` is hang-only."""
        run_id = self.start_run(
            {"prompt": "approval", "model": "fake:approval", "tools": ["dangerous"]}
        )
        deadline = time.monotonic() + timeout
        with self.client("owner") as c:
            while True:
                events = c.get(f"/v1/runs/{run_id}/events").json()["events"]
                if any(e["type"] == "tool.approval_required" for e in events):
                    return run_id
                if time.monotonic() > deadline:
                    raise TimeoutError(f"run {run_id} never asked for its approval")
                time.sleep(0.02)

    def ticket(self, run_id: str, role: str) -> str:
        with self.client(role) as c:
            r = c.post("/v1/tickets", json={"run_id": run_id})
            assert r.status_code == 200, r.text
            return str(r.json()["ticket"])


# ----------------------------------------------------------------------------- SSE


def read_sse(response: httpx.Response) -> tuple[list[SSEMessage], int]:
    """All messages of a (finite) SSE response, and how many comment lines came with them."""
    decoder = SSEDecoder()
    out: list[SSEMessage] = []
    for chunk in response.iter_bytes():
        out.extend(decoder.feed(chunk))
    out.extend(decoder.flush())
    return out, decoder.comments


def stream_all(daemon: Daemon, run_id: str, role: str) -> tuple[httpx.Response, str]:
    """The whole SSE body of a finished run for ``role`` (status and raw text)."""
    ticket = daemon.ticket(run_id, role)
    with (
        daemon.client() as c,
        c.stream("GET", f"/v1/runs/{run_id}/stream", params={"ticket": ticket}) as r,
    ):
        body = r.read().decode("utf-8")
    return r, body


def sse_events(body: str) -> list[dict[str, Any]]:
    decoder = SSEDecoder()
    messages = [*decoder.feed(body.encode("utf-8")), *decoder.flush()]
    return [json.loads(m.data) for m in messages if m.data and m.event in ("", "message")]


# ----------------------------------------------------------------------------- subprocesses

PG_START_S = 240.0
"""How long a durable daemon on a fresh PostgreSQL schema may take to listen: it sets up the
schema's workflows first (ADR 0062), and each of DBOS's ``CREATE INDEX CONCURRENTLY`` waits for
the database's older transactions -- among them every other DBOS process's background-job
transaction, each held about 4 s at a time (ADR 0057). Measured on a loaded 2-core machine: 13 to
31 s with no other daemon on the database, 88 s with four; 30 s more while another process holds
DBOS's database-wide migration lock (``test_durable_setup`` does, on purpose)."""

HANG_S = 120.0
"""How long a wait on a ``thoughtgate`` subprocess (to start, to print something, to exit) may
last before it counts as a hang: only a hang reaches it. A ``thoughtgate run`` starts (imports,
DBOS, the store) in about 3 s on an idle machine but took 20-28 s on a loaded 2-core one, so the
tighter bounds tests had failed runs that were merely slow."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def ctrl_c_reaches_children() -> Iterator[None]:
    """Processes started inside begin with Ctrl-C's default handling, however pytest began.

    A shell starts a background job of a script (``pytest ... &``, ``nohup``) with SIGINT
    ignored, and an ignored signal stays ignored across ``exec``: a ``thoughtgate`` child would
    then ignore the test's Ctrl-C, as it should (``cli.runs``), and the run it interrupts would
    complete. A handler, unlike "ignore", is reset to the default by ``exec``, so Python in the
    child installs its own. For the main thread (the only one that may set a handler); not
    ``preexec_fn``, which may deadlock a fork while other threads run (the tests' readers do)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        if previous is not None:  # None: set outside Python, nothing to put back
            signal.signal(signal.SIGINT, previous)


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("THOUGHTGATE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), str(TESTS)])
    env.update(extra)
    return env


def cli(*args: str, timeout: float = HANG_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "thoughtgate", *args],
        env=cli_env(),
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def process_stacks(pid: int) -> str:
    """Where every thread of process ``pid`` is (``py-spy dump``), for the message of a test
    that gave up waiting on it; a note instead when py-spy is missing or cannot attach."""
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if spy is None:
        return "\n(py-spy is not installed: no stacks of the waiting process)\n"
    try:
        dump = subprocess.run(
            [spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"\n(no stacks of the waiting process: {exc})\n"
    return f"\nwhere it waits (py-spy dump):\n{dump.stdout}{dump.stderr}"


class ServeProcess:
    """``python -m thoughtgate serve`` in a subprocess; reads its URL (and bootstrap key)."""

    def __init__(
        self, *args: str, open_files: int | None = None, env: dict[str, str] | None = None
    ) -> None:
        self.args = args
        self.open_files = open_files
        self.env = env or {}
        """Extra environment variables for the server process."""
        """``ulimit -n`` for the server process (soft and hard), when given."""
        self.proc: subprocess.Popen[str] | None = None
        self.base_url = ""
        self.bootstrap_key: str | None = None
        self.stderr_lines: list[str] = []
        self._stdout = tempfile.TemporaryFile()  # noqa: SIM115 - closed in stop()

    def stdout_text(self) -> str:
        """What the server wrote to stdout so far (uvicorn's access log goes there)."""
        self._stdout.seek(0)
        return self._stdout.read().decode("utf-8", errors="replace")

    def start(self, *, expect_key: bool = False, timeout: float = HANG_S) -> ServeProcess:
        """Start the server and wait for its URL; ``timeout`` only a hang reaches: a durable
        daemon (on PostgreSQL it sets up its workflow schema first) starts in a few seconds on
        an idle machine but took 50 s, nearly all of it imports, on a loaded 2-core one."""
        return self.spawn().ready(expect_key=expect_key, timeout=timeout)

    @staticmethod
    def start_all(*servers: ServeProcess, timeout: float = HANG_S) -> None:
        """Start several at once (each one's start is mostly imports, on another core) and wait
        until every one listens, ``timeout`` seconds at most for all of them together: one
        deadline, not one budget each in turn, so the wait cannot outlast the test's own timeout
        (which would end it showing nothing) and gives up with :meth:`ready`'s error -- what the
        one not listening printed, and where it waits. Every other one is stopped then too."""
        deadline = time.monotonic() + timeout
        for server in servers:
            server.spawn()
        try:
            for server in servers:
                server._listening_by(deadline, expect_key=False, budget_s=timeout)
        except BaseException:
            for server in servers:
                server.stop()
            raise

    def spawn(self) -> ServeProcess:
        """Start the process; :meth:`ready` waits until it listens."""
        self.proc = subprocess.Popen(
            self.command(),
            env=cli_env(**self.env),
            cwd=str(REPO),
            stdout=self._stdout,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=None if self.open_files is None else self._limit_files,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._reader.start()
        return self

    def command(self) -> list[str]:
        """What :meth:`spawn` runs."""
        return [sys.executable, "-m", "thoughtgate", "serve", "--port", "0", *self.args]

    def _read_stderr(self) -> None:
        """Every line the process writes to stderr, into ``stderr_lines`` and for :meth:`ready`
        (``None`` once it closes stderr): read here, so that ``ready`` can stop waiting at its
        deadline while the process prints nothing."""
        assert self.proc is not None and self.proc.stderr is not None
        with contextlib.suppress(ValueError, OSError):  # closed by stop()
            for line in self.proc.stderr:
                self.stderr_lines.append(line)
                self._lines.put(line)
        self._lines.put(None)

    def ready(self, *, expect_key: bool = False, timeout: float = HANG_S) -> ServeProcess:
        """Wait for the URL it listens on (and its bootstrap key when ``expect_key``), at most
        ``timeout`` seconds; a process that is still running then is shown with where it waits
        (its threads' stacks), so a hang names its cause."""
        return self._listening_by(
            time.monotonic() + timeout, expect_key=expect_key, budget_s=timeout
        )

    def _listening_by(self, deadline: float, *, expect_key: bool, budget_s: float) -> ServeProcess:
        """:meth:`ready`, until the monotonic ``deadline``; ``budget_s`` is the wait the error
        names. What the process printed before the deadline counts however late it is read: of
        servers started together, one that listens while the wait is for another is ready."""
        assert self.proc is not None
        key_next = False
        while True:
            left = deadline - time.monotonic()
            try:
                line = self._lines.get(timeout=left) if left > 0 else self._lines.get_nowait()
            except queue.Empty:
                break
            if line is None:  # it closed stderr: it is exiting
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=10)
                break
            if key_next:
                self.bootstrap_key = line.strip()
            elif "thoughtgate listening on " in line:
                self.base_url = line.split("listening on ")[1].split()[0]
            key_next = "created owner key" in line
            if self.base_url and (self.bootstrap_key or not expect_key):
                return self
        code = self.proc.poll()
        where = "" if code is not None else process_stacks(self.proc.pid)
        self.stop()
        if self.base_url:
            why = f"printed no key after {budget_s} s"
        else:
            why = f"exited with {code}" if code is not None else f"not listening after {budget_s} s"
        raise RuntimeError(f"serve did not start ({why}):\n" + "".join(self.stderr_lines) + where)

    def _limit_files(self) -> None:
        import resource

        assert self.open_files is not None
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.open_files, self.open_files))

    def kill(self) -> None:
        """``kill -9``: the process dies at once, writing nothing more."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
        reader = getattr(self, "_reader", None)
        if reader is not None:
            reader.join(timeout=5)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        self._stdout.close()


HAVE_SQLITE = importlib.util.find_spec("thoughtgate.store.sqlite") is not None


@contextlib.contextmanager
def running_daemon(
    *, sqlite_dir: Path | None = None, store: EventStore | None = None, **app_options: Any
) -> Iterator[Daemon]:
    """A daemon over a fresh store (memory, SQLite in ``sqlite_dir``, or the test's own
    ``store``) with one key per role, served on loopback."""
    from thoughtgate.config import Config
    from thoughtgate.server.app import create_app
    from thoughtgate.store.memory import MemoryStore
    from thoughtgate.store.urls import open_store

    config = app_options.pop("config", None) or Config.from_mapping(
        {"orchestration": {"approval_timeout_s": 5}}
    )
    if store is None:
        url = f"sqlite:///{sqlite_dir / 'daemon.db'}" if sqlite_dir is not None else None
        store = MemoryStore() if url is None else asyncio.run(open_store(url))
    keys = seed_keys(store)
    app = create_app(store, config, tools=server_tools(), **app_options)
    try:
        with ThreadServer(app) as server:
            yield Daemon(server.base_url, keys, store, app, server.server)
    finally:
        asyncio.run(store.close())


@contextlib.contextmanager
def ticketing_daemon(secret: str, *, keepalive_s: float) -> Iterator[Daemon]:
    """:func:`running_daemon` signing live-channel tickets with ``secret`` (valid 30 s), its
    idle streams sending a keep-alive every ``keepalive_s``: the live-stream tests' daemon."""
    from thoughtgate.config import Config

    config = Config.from_mapping(
        {"server": {"keepalive_s": keepalive_s, "secret": secret, "ticket_ttl_s": 30}}
    )
    with running_daemon(config=config, shutdown_grace_s=0.1) as daemon:
        yield daemon
