"""Runs end honestly, as a user and a shell script see them: the exit code is the outcome, every
outcome is on every surface, and nothing reads ``running`` forever -- whether the run was cut
by a provider outage, Ctrl-C, SIGTERM, or a ``kill -9`` of the process executing it.

Real subprocesses (``python -m thoughtgate``), the provider emulator on loopback, a real SQLite
file (and PostgreSQL for the live-daemon sweep).
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from psycopg import sql
from support.daemon import HANG_S, ServeProcess, auth, cli_env, ctrl_c_reaches_children, sse_events
from support.pg import PG_URL, schema_name
from support.ticker import ticker_prompt

from thoughtgate.cli.runs import EMPTY_PROMPT
from thoughtgate.events.schema import EventType
from thoughtgate.store.leases import EXPIRED
from thoughtgate.store.urls import open_store
from thoughtgate.testing.emulator import Emulator, EmulatorServer, serve_emulator
from thoughtgate.testing.emulator.scenarios import builtin_scenarios

REPO = Path(__file__).resolve().parents[1]
SLOW = ("--model", "fake:slow", "--tools", "support.served:SERVER_TOOLS", "--cot", "surface")


@pytest.fixture(scope="module")
def emulator() -> Iterator[EmulatorServer]:
    emu = Emulator()
    for scenario in builtin_scenarios().values():
        emu.add(scenario)
    emu.default = "think-and-answer"
    with serve_emulator(emu) as server:
        yield server


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'tg.db'}"


def tg(
    *args: str, env: dict[str, str] | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "thoughtgate", *args],
        env={**cli_env(), **(env or {})},
        cwd=str(REPO),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


def emulated(server: EmulatorServer) -> dict[str, str]:
    """The emulator walkthrough's environment; no retries, so an outage is reported at once."""
    return {
        "ANTHROPIC_BASE_URL": server.url,
        "ANTHROPIC_API_KEY": "any",
        "THOUGHTGATE_PROVIDERS__ANTHROPIC__MAX_RETRIES": "0",
    }


def read_store(db: str, *, sweep: bool = True) -> tuple[Any, list[Any]]:
    """The one run in the store and its events (opening the store sweeps it, as any process
    does, unless ``sweep`` is false)."""

    async def go() -> tuple[Any, list[Any]]:
        store = await open_store(db, sweep=sweep)
        try:
            (run,) = await store.list_runs()
            return run, await store.read(run.run_id)
        finally:
            await store.close()

    return asyncio.run(go())


# --------------------------------------------------------------------------- exit codes


@pytest.mark.parametrize(
    ("scenario", "code", "status", "output"),
    [
        ("think-and-answer", 0, "completed", "The sky looks blue"),
        ("overloaded", 1, "failed", ""),
        ("stream-error", 1, "failed", ""),
        ("cut", 3, "partial", "Partial ans"),
    ],
)
def test_the_exit_code_is_the_outcome_and_json_still_prints_the_run(
    emulator: EmulatorServer, db: str, scenario: str, code: int, status: str, output: str
) -> None:
    proc = tg(
        "run", "Why?", "--model", f"anthropic:{scenario}", "--db", db, "--json",
        env=emulated(emulator),
    )  # fmt: skip
    assert proc.returncode == code, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["status"] == status and doc["tasks"][0]["status"] == status
    assert doc["tasks"][0]["output"].startswith(output)
    if status == "completed":
        assert doc["error"] is None
    else:
        assert doc["error"] and doc["tasks"][0]["error"] == doc["error"]
    run, events = read_store(db)
    assert run.status == status
    terminal = EventType.RUN_FAILED if status == "failed" else EventType.RUN_SETTLEMENT_COMPLETED
    assert events[-1].type == terminal and events[-1].payload["status"] == status


def test_an_outage_is_shown_as_a_failure_in_the_final_panel_and_in_status(
    emulator: EmulatorServer, db: str
) -> None:
    proc = tg("run", "Why?", "--model", "anthropic:overloaded", "--db", db, env=emulated(emulator))
    assert proc.returncode == 1
    out = proc.stdout
    assert "failed" in out and "overloaded_error" in out and "529" in out
    run, _ = read_store(db)
    shown = tg("status", run.run_id[4:12], "--db", db)  # any unique start of the id
    assert shown.returncode == 0, shown.stderr
    assert "failed" in shown.stdout and "overloaded_error" in shown.stdout


def test_a_missing_key_is_a_usage_error_and_no_run_is_created(
    emulator: EmulatorServer, db: str
) -> None:
    env = {"ANTHROPIC_BASE_URL": emulator.url, "ANTHROPIC_API_KEY": ""}
    proc = tg("run", "Why?", "--model", "anthropic:claude-sonnet-4-5", "--db", db, env=env)
    assert proc.returncode == 2
    assert "ANTHROPIC_API_KEY" in proc.stderr and "= None" not in proc.stderr
    assert "Traceback" not in proc.stderr
    assert json.loads(tg("runs", "--db", db, "--json").stdout) == []


# --------------------------------------------------------------------------- signals and kill -9


class Watched:
    """A ``thoughtgate`` subprocess whose stdout is read on a thread; ``wait_for`` blocks until a
    text appears (a signal from the process, not a clock). Start one with the ``watch`` fixture,
    which kills it when its test ends, passed or not."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        with ctrl_c_reaches_children():  # the tests send it Ctrl-C however pytest was started
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "thoughtgate", *args],
                env={**cli_env(PYTHONUNBUFFERED="1"), **(env or {})},
                cwd=str(REPO),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        self.out: list[str] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for chunk in iter(lambda: self.proc.stdout.read(1), ""):  # type: ignore[union-attr]
            with self._changed:
                self.out.append(chunk)
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def wait_for(self, text: str, timeout: float = HANG_S) -> None:
        with self._changed:
            ok = self._changed.wait_for(
                lambda: text in "".join(self.out) or self.proc.poll() is not None, timeout
            )
        assert ok and text in "".join(self.out), f"never printed {text!r}: {''.join(self.out)}"

    def finish(self, timeout: float = HANG_S) -> tuple[int, str, str]:
        """Wait for the end: the exit code and the output, with the pipes closed."""
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=timeout)  # it reads what is left in the pipe
        assert self.proc.stdout is not None and self.proc.stderr is not None
        err = self.proc.stderr.read()
        self.proc.stdout.close()
        self.proc.stderr.close()
        return code, "".join(self.out), err

    def close(self) -> None:
        """Kill it if it still runs (a finalizer: nothing outlives its test)."""
        if self.proc.poll() is None:
            self.proc.kill()
        if self.proc.stderr is not None and not self.proc.stderr.closed:
            self.finish()


@pytest.fixture
def watch(request: pytest.FixtureRequest) -> Callable[..., Watched]:
    """Start a :class:`Watched` process that is killed and reaped when the test ends, even when it
    fails (a process left running is a ``ResourceWarning``, an error in whichever test the
    garbage collector happens to run in)."""

    def start(*args: str, env: dict[str, str] | None = None) -> Watched:
        watched = Watched(*args, env=env)
        request.addfinalizer(watched.close)
        return watched

    return start


NOT_DURABLE = {"THOUGHTGATE_DURABILITY__ENABLED": "false"}
"""A process without durable runs (ADR 0009's path): its orphaned runs are closed, not resumed."""


@pytest.mark.parametrize("env", [None, NOT_DURABLE], ids=["durable", "not-durable"])
@pytest.mark.parametrize(
    ("sig", "reason"),
    [
        (signal.SIGINT, "Ctrl-C"),
        (signal.SIGTERM, "SIGTERM"),
        (signal.SIGHUP, "SIGHUP: its terminal was closed"),
    ],
    ids=["ctrl-c", "sigterm", "sighup"],
)
def test_a_signal_interrupts_the_run_and_its_tasks_before_the_cli_exits(
    db: str, watch: Callable[..., Watched], sig: int, reason: str, env: dict[str, str] | None
) -> None:
    """SIGHUP (the terminal closed) too, since ADR 0165: it killed the process (exit 129) and
    left the run open, closed later by whichever process opened the store next with the generic
    "its process stopped", or suspended for a resume nobody would ask for."""
    run = watch("run", "slow", *SLOW, "--db", db, env=env)
    run.wait_for("thinking slowly")
    run.proc.send_signal(sig)
    code, out, err = run.finish()
    assert code == 130, err
    assert "interrupted" in out and reason in out
    stored, events = read_store(db)
    assert stored.status == "interrupted" and reason in (stored.error or "")
    assert [t.status for t in stored.tasks] == ["interrupted"]
    types = [e.type for e in events]
    assert types[-2:] == [EventType.TASK_COMPLETED, EventType.RUN_INTERRUPTED]
    assert types.count(EventType.RUN_INTERRUPTED) == 1


def _runs_in(db: str) -> list[Any]:
    """Every run the store holds, read without a sweep (which would close an open one)."""

    async def go() -> list[Any]:
        store = await open_store(db, sweep=False)
        try:
            return list(await store.list_runs())
        finally:
            await store.close()

    return asyncio.run(go())


STARTING = ("--model", "fake:echo", "--tools", "support.startup_hold:TOOLS")
"""A run whose process holds still at a point of its start (``support.startup_hold``)."""


@pytest.mark.parametrize("env", [None, NOT_DURABLE], ids=["durable", "not-durable"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["sigterm", "sighup"])
def test_a_signal_while_the_command_starts_leaves_no_run_or_ends_the_one_it_admits(
    tmp_path: Path,
    db: str,
    watch: Callable[..., Watched],
    sig: signal.Signals,
    env: dict[str, str] | None,
) -> None:
    """ADR 0170. Before the runtime exists (its store open, its ``--tools`` loading) the
    signal's default action kills the process (exit 128 + N to a shell): nothing of a run was
    stored, and the store opens as it was. Once its handlers are installed, a signal that
    lands in the run's admission closed the run ``interrupted`` (ADR 0072) but the command
    crashed on the cancel, a traceback and exit 1, the run never shown; now it is shown, as
    any run stopped so, and the command exits 130."""
    hold = tmp_path / "hold"
    for point in ("tools", "provider"):
        hold.touch()
        at = {**(env or {}), "THOUGHTGATE_TEST_HOLD": str(hold), "THOUGHTGATE_TEST_HOLD_AT": point}
        run = watch("run", "hi", *STARTING, "--db", db, env=at)
        run.wait_for(f"holding at {point}")
        run.proc.send_signal(sig)
        hold.unlink()  # (a handled signal is acted on once the hold is over)
        code, out, err = run.finish()
        if point == "tools":
            assert code == -sig, err
            assert _runs_in(db) == []
            continue
        assert code == 130, err
        assert "Traceback" not in err
        reason = "SIGTERM" if sig == signal.SIGTERM else "SIGHUP: its terminal was closed"
        assert "interrupted" in out and reason in out
        (stored,) = _runs_in(db)
        assert stored.status == "interrupted" and reason in (stored.error or "")
        assert stored.run_id in out


def test_a_run_stopped_after_a_billed_turn_shows_what_it_was_billed(
    db: str, watch: Callable[..., Watched]
) -> None:
    """SIGTERM after the model's first turn (billed 49 tokens) and its tool call: the run is
    ``interrupted``, and its usage is that turn's on the run, in its ``run.interrupted`` event and
    in ``thoughtgate status`` -- not ``in 0 · out 0`` (ADR 0131)."""
    run = watch("run", "look it up", *SLOW[:1], "fake:billedslow", *SLOW[2:], "--db", db)
    run.wait_for("thinking slowly")
    run.proc.send_signal(signal.SIGTERM)
    code, out, err = run.finish()
    assert code == 130, err
    assert "in 12 · out 37" in out, out
    stored, events = read_store(db)
    assert stored.status == "interrupted"
    assert (stored.usage["input_tokens"], stored.usage["output_tokens"]) == (12, 37)
    assert events[-1].type == EventType.RUN_INTERRUPTED
    assert events[-1].payload["usage"]["total_tokens"] == 49
    shown = tg("status", stored.run_id, "--db", db, "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["usage"]["total_tokens"] == 49
    assert "in 12 · out 37" in tg("status", stored.run_id, "--db", db).stdout


def test_ctrl_c_interrupts_the_run_even_when_the_tests_were_started_in_the_background(
    db: str, watch: Callable[..., Watched]
) -> None:
    """A script's background job (``pytest ... &``) starts with SIGINT ignored; the runs these
    tests interrupt with Ctrl-C must not inherit that (else they complete, exit 0, and the test
    fails in one way of starting pytest and passes in another)."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a background job has it
    try:
        run = watch("run", "slow", *SLOW, "--db", db)
    finally:
        signal.signal(signal.SIGINT, previous)
    run.wait_for("thinking slowly")
    run.proc.send_signal(signal.SIGINT)
    code, out, err = run.finish()
    assert code == 130, err
    assert "interrupted" in out and "Ctrl-C" in out


_ON_A_TERMINAL = (
    "import fcntl, os, sys, termios\n"
    "os.setsid()\n"
    "fcntl.ioctl(0, termios.TIOCSCTTY, 0)\n"
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])\n"
)
"""Run the rest of the command line as the leader of a new session whose controlling terminal
is its standard input: closing that terminal's other end hangs the session up, and the kernel
sends its leader SIGHUP, as when a terminal window is closed."""


@pytest.mark.parametrize("env", [None, NOT_DURABLE], ids=["durable", "not-durable"])
def test_closing_its_terminal_ends_the_run_with_that_cause_and_exit_130(
    db: str, env: dict[str, str] | None
) -> None:
    """A real terminal, closed (ADR 0165): the kernel's SIGHUP ends the run ``interrupted``
    with its cause, and what is still printed to the gone terminal does not fail the command
    (it exits 130, the run's outcome, not 1 for an ``EIO`` on its panel). Before, the signal
    killed it (exit -1 here): the run was left to the next process, closed "its process
    stopped", or, durable, suspended."""
    import os
    import pty

    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", _ON_A_TERMINAL, "-m", "thoughtgate", "run", "slow", *SLOW,
             "--db", db],
            env={**cli_env(PYTHONUNBUFFERED="1"), **(env or {})},
            cwd=str(REPO),
            stdin=slave,
            stdout=slave,
            stderr=slave,
        )  # fmt: skip
    finally:
        os.close(slave)
    try:
        seen = b""
        deadline = time.monotonic() + HANG_S
        while b"thinking slowly" not in seen:  # what the terminal shows: a read, not a clock
            assert time.monotonic() < deadline and proc.poll() is None, seen
            seen += os.read(master, 4096)
    finally:
        os.close(master)  # the terminal closes
    assert proc.wait(timeout=HANG_S) == 130
    stored, events = read_store(db)
    assert stored.status == "interrupted"
    assert "SIGHUP: its terminal was closed" in (stored.error or "")
    assert [t.status for t in stored.tasks] == ["interrupted"]
    assert [e.type for e in events][-1] == EventType.RUN_INTERRUPTED


def test_a_run_started_with_sighup_ignored_runs_on_when_its_terminal_closes(
    db: str, tmp_path: Path, watch: Callable[..., Watched]
) -> None:
    """``nohup thoughtgate run ...``: SIGHUP ignored at the start is kept ignored (ADR 0165), so
    the run goes on to its end when the terminal closes, as ``nohup`` promises. (A pin: it held
    before, when nothing handled SIGHUP; the handler added for it must not undo it.)"""
    hold = tmp_path / "hold"  # the model waits while it exists: the signal lands mid-run
    hold.touch()
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as nohup starts it
    try:
        run = watch(
            "run", ticker_prompt(3, 0, hold), "--model", "fake:ticker", *SLOW[2:], "--db", db,
            env=NOT_DURABLE,
        )  # fmt: skip
    finally:
        signal.signal(signal.SIGHUP, previous)

    async def running() -> bool:
        store = await open_store(db, sweep=False)
        try:
            return [r.status for r in await store.list_runs()] == ["running"]
        finally:
            await store.close()

    deadline = time.monotonic() + HANG_S
    while not asyncio.run(running()):  # the model prints nothing while it waits
        assert time.monotonic() < deadline and run.proc.poll() is None
        time.sleep(0.05)
    run.proc.send_signal(signal.SIGHUP)
    hold.unlink()
    code, out, err = run.finish()
    assert code == 0, err
    assert "completed" in out
    stored, _ = read_store(db)
    assert stored.status == "completed"


def test_ctrl_c_with_json_still_prints_the_runs_document(
    db: str, watch: Callable[..., Watched]
) -> None:
    run = watch("run", "slow", *SLOW, "--db", db, "--json")

    async def started() -> bool:
        store = await open_store(db, sweep=False)
        try:
            runs = await store.list_runs()
            return bool(runs) and bool(await store.read(runs[0].run_id, after=3))
        finally:
            await store.close()

    deadline = time.monotonic() + HANG_S
    while not asyncio.run(started()):  # --json prints nothing until the end: watch the store
        assert time.monotonic() < deadline and run.proc.poll() is None
        time.sleep(0.05)
    run.proc.send_signal(signal.SIGINT)
    code, out, _ = run.finish()
    assert code == 130
    doc = json.loads(out)
    assert doc["status"] == "interrupted" and doc["tasks"][0]["status"] == "interrupted"
    assert "Ctrl-C" in doc["error"]


def test_kill_9_of_a_cli_run_without_durability_is_closed_by_the_next_process(
    db: str, watch: Callable[..., Watched]
) -> None:
    run = watch("run", "slow", *SLOW, "--db", db, env=NOT_DURABLE)
    run.wait_for("thinking slowly")
    run.proc.kill()
    run.finish()
    listed = json.loads(tg("runs", "--db", db, "--json").stdout)  # any process that opens it
    assert [r["status"] for r in listed] == ["interrupted"]
    shown = json.loads(tg("status", listed[0]["run_id"], "--db", db, "--json").stdout)
    assert [t["status"] for t in shown["tasks"]] == ["interrupted"]
    assert "stopped" in shown["error"]


def test_kill_9_of_a_durable_cli_run_leaves_it_suspended_for_resume(
    db: str, watch: Callable[..., Watched]
) -> None:
    """Durable (the default on SQLite): the next process marks it suspended, never running
    forever and never closed (``thoughtgate resume`` continues it: test_durable_replicas)."""
    run = watch("run", "slow", *SLOW, "--db", db)
    run.wait_for("thinking slowly")
    run.proc.kill()
    run.finish()
    (listed,) = json.loads(tg("runs", "--db", db, "--json", "--view-as", "member").stdout)
    assert listed["status"] == "running"
    assert listed["metadata"]["suspended"]["resume"] == "manual"
    assert "stopped" in listed["metadata"]["suspended"]["reason"]
    assert "previous_executor" not in listed["metadata"], "the process is operator detail"
    (owner_view,) = json.loads(tg("runs", "--db", db, "--json").stdout)
    assert owner_view["metadata"]["previous_executor"], "an operator learns which process it was"


SHORT_LEASE = {**NOT_DURABLE, "THOUGHTGATE_ORCHESTRATION__LEASE_TTL_S": "3"}
"""Without durable runs, with a 3 s lease (renewed every second; a daemon sweeps every 2 s)."""


@pytest.fixture
def pg_url() -> Iterator[str]:
    schema = schema_name()
    yield f"{PG_URL}?schema={schema}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
@pytest.mark.parametrize("executor", ["run", "serve"])
def test_a_live_daemon_closes_the_runs_of_a_killed_process_within_its_lease(
    tmp_path: Path,
    request: pytest.FixtureRequest,
    watch: Callable[..., Watched],
    backend: str,
    executor: str,
) -> None:
    """kill -9 of the process executing a run (a ``thoughtgate run`` or another daemon) without
    durable runs: a second, live daemon on the same store closes the run -- tasks first -- and its
    live readers see the end. (With durable runs the live daemon resumes it instead:
    test_durable_replicas.)

    The killed process is reaped only after the run is closed, and a zombie's pid still answers
    ``kill(pid, 0)``: the watcher cannot tell from the pid that it is gone -- just as a daemon on
    another machine cannot -- so the run is closed by its lease expiring. Every process here has a
    3 s lease (default 15 s), so the close comes within about 5 s: the lease, then the watcher's
    sweep every 2 s. (A reaped process is seen gone by its pid at once:
    test_kill_9_of_a_cli_run_without_durability_is_closed_by_the_next_process.)"""
    db = (
        f"sqlite:///{tmp_path / 'shared.db'}"
        if backend == "sqlite"
        else request.getfixturevalue("pg_url")
    )
    watcher = ServeProcess("--db", db, env=SHORT_LEASE).start(expect_key=True)
    request.addfinalizer(watcher.stop)
    key = watcher.bootstrap_key
    assert key
    if executor == "run":
        victim = watch("run", "slow", *SLOW, "--db", db, env=SHORT_LEASE)
        victim.wait_for("thinking slowly")
        stored, _ = read_store(db, sweep=False)
        run_id = stored.run_id
        kill = victim.proc.kill
    else:
        other = ServeProcess(
            "--db", db, "--tools", "support.served:SERVER_TOOLS", env=SHORT_LEASE
        ).start()
        request.addfinalizer(other.stop)
        with httpx.Client(base_url=other.base_url, headers=auth(key), timeout=10) as c:
            body = {"prompt": "slow", "model": "fake:slow", "chain_of_thought": "surface"}
            run_id = c.post("/v1/runs", json=body).json()["run_id"]
        assert other.proc is not None
        kill = other.proc.kill
    with httpx.Client(base_url=watcher.base_url, headers=auth(key), timeout=40) as c:
        ticket = c.post("/v1/tickets", json={"run_id": run_id}).json()["ticket"]
        with c.stream("GET", f"/v1/runs/{run_id}/stream", params={"ticket": ticket}) as live:
            lines = live.iter_lines()
            next(line for line in lines if line.startswith("data:"))  # it is running
            killed = time.monotonic()
            kill()
            rest = "\n".join(lines)  # the stream ends after the run's terminal event
        took = time.monotonic() - killed
        frames = sse_events(rest + "\n\n")
        assert frames[-1]["type"] == EventType.RUN_INTERRUPTED
        assert took < 12, f"closed after {took:.1f} s: by the default 15 s lease, not the 3 s one?"
        run = c.get(f"/v1/runs/{run_id}").json()
    assert run["status"] == "interrupted" and [t["status"] for t in run["tasks"]] == ["interrupted"]
    assert EXPIRED in run["error"], "closed by its lease, not by its pid"
    assert [f["type"] for f in frames][-2:] == [EventType.TASK_COMPLETED, EventType.RUN_INTERRUPTED]


# --------------------------------------------------------------------------- daily use


def test_run_reads_the_prompt_from_stdin_and_sends_the_system_prompt(
    emulator: EmulatorServer, db: str
) -> None:
    before = len(emulator.emulator.requests)
    proc = tg(
        "run", "-", "--system", "Answer in one line.", "--model", "anthropic:claude-sonnet-4-5",
        "--db", db, "--json", env=emulated(emulator), stdin="Why is the sky blue?\n",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    body = emulator.emulator.requests[before].body
    assert body["system"] in (
        "Answer in one line.",
        [{"type": "text", "text": "Answer in one line."}],
    )
    assert body["messages"][0]["content"] in (
        "Why is the sky blue?",
        [{"type": "text", "text": "Why is the sky blue?"}],
    )
    empty = tg("run", "-", "--model", "fake:echo", "--db", db, stdin="  \n")
    assert empty.returncode == 2 and "empty" in empty.stderr


def test_an_empty_prompt_is_refused_alike_as_an_argument_or_from_stdin(tmp_path: Path) -> None:
    """``run ""`` was run (and recorded) while an empty stdin was refused: both are refused, with
    one message, before anything is opened."""
    db = tmp_path / "never.db"
    refusals = [
        tg("run", given, "--model", "fake:echo", "--db", f"sqlite:///{db}", stdin=piped)
        for given, piped in (("", None), ("  \n ", None), ("-", ""), ("-", "  \n"))
    ]
    for proc in refusals:
        assert proc.returncode == 2, (proc.stdout, proc.stderr)
        assert proc.stderr.strip() == f"error: {EMPTY_PROMPT}", proc.stderr
    assert not db.exists(), "nothing is recorded for an empty prompt"


def test_runs_shows_full_ids_and_when_and_any_unique_prefix_works(db: str) -> None:
    ids = [
        json.loads(tg("run", f"q{i}", "--model", "fake:echo", "--db", db, "--json").stdout)[
            "run_id"
        ]
        for i in range(2)
    ]
    table = tg("runs", "--db", db, env={"COLUMNS": "70"}).stdout
    for run_id in ids:
        assert run_id in table, "a full id even in a narrow terminal"
    assert "started" in table and time.strftime("%Y-%m-%d") in table
    prefix = ids[0][: len("run_") + 8]
    for command in ("status", "events", "trace"):
        proc = tg(command, prefix, "--db", db, "--json")
        assert proc.returncode == 0, proc.stderr
        assert ids[0] in proc.stdout
    assert tg("status", ids[0][4:14], "--db", db, "--json").returncode == 0, "without 'run_'"
    ambiguous = tg("status", "run_", "--db", db)
    assert ambiguous.returncode == 2 and "matches several runs" in ambiguous.stderr


def test_trace_prints_one_json_document(db: str) -> None:
    run_id = json.loads(
        tg("run", "x", "--model", "fake:reasoner", "--cot", "surface", "--db", db, "--json").stdout
    )["run_id"]
    for extra in ((), ("--json",)):
        doc = json.loads(tg("trace", run_id, "--db", db, *extra).stdout)
        assert isinstance(doc, list) and doc[0]["type"] == "worker.completed"


def test_help_does_not_import_the_daemon_stack() -> None:
    code = (
        "import sys\n"
        "from thoughtgate.cli import app\n"
        "try:\n    app(['--help'])\nexcept SystemExit:\n    pass\n"
        "heavy = ('uvicorn', 'starlette', 'thoughtgate.server', 'opentelemetry', 'mcp', "
        "'psycopg', 'httpx')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy or "
        "m.startswith('thoughtgate.server')))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=cli_env(), capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_environment_beats_the_readme_config_in_the_emulator_walkthrough(
    emulator: EmulatorServer, tmp_path: Path
) -> None:
    """The README's own thoughtgate.toml (base_url = the real API) in the folder must not break
    ``ANTHROPIC_BASE_URL=<emulator> thoughtgate run ...`` (docs/emulator.md)."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Configuration (`thoughtgate.toml`)", 1)[1]
    toml = section.split("```toml\n", 1)[1].split("```", 1)[0]
    assert 'base_url = "https://api.anthropic.com"' in toml, "the README still shows the case"
    (tmp_path / "thoughtgate.toml").write_text(toml, encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-m", "thoughtgate", "run", "Why is the sky blue?", "--model",
         "anthropic:claude-sonnet-4-5", "--json"],
        env={**cli_env(), "ANTHROPIC_BASE_URL": emulator.url, "ANTHROPIC_API_KEY": "any"},
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["status"] == "completed" and doc["chain_of_thought"] == "surface"
    assert doc["tasks"][0]["output"].startswith("The sky looks blue")
    assert (tmp_path / "thoughtgate.db").exists(), "the README's store.url was used"


def test_keys_create_json_includes_the_id(db: str) -> None:
    doc = json.loads(
        tg("keys", "create", "--role", "viewer", "--name", "v", "--db", db, "--json").stdout
    )
    listed = json.loads(tg("keys", "list", "--db", db, "--json").stdout)
    assert doc["key_id"] == listed[0]["key_id"]
    assert tg("keys", "revoke", doc["key_id"], "--db", db).returncode == 0


def test_a_down_collector_prints_one_warning_and_the_run_still_succeeds(
    db: str, tmp_path: Path
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{s.getsockname()[1]}"
    env = {
        "THOUGHTGATE_TELEMETRY__EXPORTER": "otlp_http",
        "THOUGHTGATE_TELEMETRY__ENDPOINT": endpoint,
    }
    proc = tg("run", "x", "--model", "fake:echo", "--db", db, "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["status"] == "completed"
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "cannot export to" in lines[0], proc.stderr
