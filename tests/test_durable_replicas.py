"""Killing the process that executes a run loses nothing (ADR 0013), with real processes.

* One daemon on SQLite: ``kill -9`` it after the run's tool ran, start it again, the run completes.
* Two replicas on PostgreSQL, the Anthropic wire on the emulator with signed thinking: kill the
  replica executing the run after its tool ran; the other completes it; the emulator (which checks
  every signature it is sent back) accepted every request; the tool ran exactly once.
* An approval asked on one replica, that replica killed, the answer given on the other: the run
  continues and completes.
* A ``thoughtgate run`` killed mid-run leaves a suspended run; ``thoughtgate resume`` finishes it.

Every case checks the log: events written before the kill unchanged, no gaps, one ``run.resumed``,
and no reasoning, carrier or process identity for readers below the classes that may see them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from psycopg import sql
from support.daemon import HANG_S, PG_START_S, REPO, ServeProcess, auth, cli_env
from support.durable import HOLD, SIDE_EFFECTS, side_effects, wait_for
from support.pg import PG_URL, schema_name

from thoughtgate.access.keys import create_key
from thoughtgate.store.urls import open_store
from thoughtgate.testing.emulator import (
    Call,
    Emulator,
    Say,
    Scenario,
    ScriptedTurn,
    Sleep,
    Think,
    serve_emulator,
)

# Each test starts two or three daemons, which can take 50 s each on a loaded machine: the
# project's 300 s, not less.
pytestmark = [pytest.mark.timeout(PG_START_S + 180), pytest.mark.slow]

LEASE = "3"
TOOLS = ("--tools", "support.served:DURABLE_TOOLS")
SECRET = "SECRET-REASONING"


def _keys(db: str) -> dict[str, str]:
    """One key per role, made in this process before any daemon starts: a ``thoughtgate keys
    create`` each would cost three process starts per test (that command has its own tests)."""

    async def make() -> dict[str, str]:
        store = await open_store(db)
        try:
            return {
                role: (await create_key(store, name=f"{role}-k", role=role)).key
                for role in ("owner", "member", "viewer")
            }
        finally:
            await store.close()

    return asyncio.run(make())


class Service:
    """Daemons on one store, and a way to read what they recorded."""

    def __init__(self, db: str, tmp: Path, env: dict[str, str] | None = None) -> None:
        self.db = db
        self.effects = tmp / "effects"
        self.hold = tmp / "hold"
        self.env = {
            SIDE_EFFECTS: str(self.effects),
            HOLD: str(self.hold),
            "THOUGHTGATE_ORCHESTRATION__LEASE_TTL_S": LEASE,
            "THOUGHTGATE_DURABILITY__POLL_INTERVAL_S": "0.2",
            **(env or {}),
        }
        self.keys = _keys(db)
        self.daemons: list[ServeProcess] = []

    def _daemon(self) -> ServeProcess:
        daemon = ServeProcess(
            "--db", self.db, *TOOLS, "--no-bootstrap-key", "--shutdown-grace", "0.2", env=self.env
        )
        self.daemons.append(daemon)
        return daemon

    def _start_s(self) -> float:
        return PG_START_S if self.db.startswith("postgresql") else HANG_S

    def start(self) -> ServeProcess:
        return self._daemon().start(timeout=self._start_s())

    def start_two(self) -> tuple[ServeProcess, ServeProcess]:
        """Two replicas, started at the same time."""
        a, b = self._daemon(), self._daemon()
        ServeProcess.start_all(a, b, timeout=self._start_s())
        return a, b

    def close(self) -> None:
        for d in self.daemons:
            d.stop()

    def request(self, daemon: ServeProcess, method: str, path: str, role: str, **kw: Any) -> Any:
        with httpx.Client(base_url=daemon.base_url, headers=auth(self.keys[role]), timeout=20) as c:
            r = c.request(method, path, **kw)
        assert r.status_code < 300, r.text
        return r.json()

    def events(
        self, daemon: ServeProcess, run_id: str, role: str = "owner"
    ) -> list[dict[str, Any]]:
        page = self.request(daemon, "GET", f"/v1/runs/{run_id}/events", role)
        return list(page["events"])

    def done(self, daemon: ServeProcess, run_id: str, *, timeout: float = HANG_S) -> dict[str, Any]:
        def ended() -> dict[str, Any] | None:
            run: dict[str, Any] = self.request(daemon, "GET", f"/v1/runs/{run_id}", "owner")
            return run if run["status"] not in ("pending", "running") else None

        result: dict[str, Any] = wait_for(ended, timeout=timeout, what=f"run {run_id} to end")
        return result


def assert_resumed_cleanly(
    service: Service,
    daemon: ServeProcess,
    run_id: str,
    before: list[Any],
    carriers: tuple[str, ...] = ("SIG-CARRIER",),
) -> None:
    after = service.events(daemon, run_id)
    assert [e["seq"] for e in after] == list(range(1, len(after) + 1)), "gap-free"
    assert after[: len(before)] == before, "every event written before the kill is unchanged"
    resumed = [e for e in after if e["type"] == "run.resumed"]
    assert len(resumed) == 1 and resumed[0]["payload"]["attempt"] == 2
    assert resumed[0]["payload"]["after_seq"] >= before[-1]["seq"]
    assert after[-1]["type"] == "run.settlement.completed"
    for role in ("viewer", "member"):
        shown = json.dumps(service.events(daemon, run_id, role))
        assert SECRET not in shown, f"a {role} sees no reasoning after a resume"
        assert "executor" not in shown, "which process took over is operator detail"
    owner_view = json.dumps(after)
    for carrier in carriers:
        assert carrier not in owner_view, "carriers never leave the process, not even for owners"


def tool_ran(service: Service) -> str:
    lines = wait_for(lambda: side_effects(service.effects), timeout=60, what="the tool to run")
    return str(lines[0].split()[1])


def killed_after_its_tool(service: Service, **fields: Any) -> tuple[str, list[dict[str, Any]]]:
    """Start a daemon and a run whose tool waits on ``service.hold``; once the tool's end is in
    the log, kill the daemon and release the hold. Returns the run and its events so far."""
    first = service.start()
    body = {"prompt": "go", "model": "fake:durable", "tools": ["side_effect"], **fields}
    run_id = service.request(first, "POST", "/v1/runs", "member", json=body)["run_id"]
    assert tool_ran(service) == str(first.proc.pid if first.proc else "")
    wait_for(
        lambda: any(e["type"] == "tool.completed" for e in service.events(first, run_id)),
        timeout=60,
        what="the tool's end to be recorded",
    )
    before = service.events(first, run_id)
    first.kill()
    service.hold.unlink()
    return run_id, before


def assert_completed_with_one_tool_run(
    service: Service, daemon: ServeProcess, run_id: str, before: list[dict[str, Any]]
) -> None:
    run = service.done(daemon, run_id)
    assert run["status"] == "completed" and run["tasks"][0]["output"] == "all done"
    assert len(side_effects(service.effects)) == 1, "the tool ran exactly once"
    assert_resumed_cleanly(service, daemon, run_id, before)


# --------------------------------------------------------------------------- SQLite, one daemon


def test_sqlite_daemon_killed_and_restarted_completes_the_run_and_never_repeats_the_tool(
    tmp_path: Path,
) -> None:
    service = Service(f"sqlite:///{tmp_path / 'tg.db'}", tmp_path)
    service.hold.touch()
    try:
        run_id, before = killed_after_its_tool(service, chain_of_thought="surface")
        second = service.start()
        assert_completed_with_one_tool_run(service, second, run_id, before)
    finally:
        service.close()


def test_sigterm_leaves_a_durable_run_open_and_the_restarted_daemon_finishes_it(
    tmp_path: Path,
) -> None:
    """A shutdown is not a cancel: after the grace period a durable run stops here, open, and
    resumes when a daemon is back (never ``run.interrupted``)."""
    service = Service(f"sqlite:///{tmp_path / 'tg.db'}", tmp_path)
    service.hold.touch()
    try:
        first = service.start()
        body = {"prompt": "go", "model": "fake:durable", "tools": ["side_effect"]}
        run_id = service.request(first, "POST", "/v1/runs", "member", json=body)["run_id"]
        tool_ran(service)
        assert first.proc is not None
        first.proc.send_signal(signal.SIGTERM)
        assert first.proc.wait(timeout=60) == 0
        assert "left 1 durable run(s) to resume elsewhere" in "".join(first.stderr_lines)
        service.hold.unlink()
        second = service.start()
        run = service.done(second, run_id)
        assert run["status"] == "completed"
        types = [e["type"] for e in service.events(second, run_id)]
        assert "run.interrupted" not in types and types.count("run.resumed") == 1
        assert len(side_effects(service.effects)) == 1
    finally:
        service.close()


def test_a_run_starts_without_waiting_for_the_queue_poll_and_resumes_after_a_kill(
    tmp_path: Path,
) -> None:
    """A daemon with room starts a new run at once (a queue polled every 60 s would leave it
    waiting past this test's time-outs); killed, the run resumes like a queued one."""
    service = Service(
        f"sqlite:///{tmp_path / 'tg.db'}",
        tmp_path,
        env={"THOUGHTGATE_DURABILITY__POLL_INTERVAL_S": "60"},
    )
    service.hold.touch()
    try:
        run_id, before = killed_after_its_tool(service)
        # The restarted daemon polls often, on a queue of its own (another concurrency): the
        # first daemon's queue keeps the 60 s its worker may read before it is registered anew.
        service.env["THOUGHTGATE_DURABILITY__POLL_INTERVAL_S"] = "0.2"
        service.env["THOUGHTGATE_DURABILITY__CONCURRENCY"] = "8"
        second = service.start()
        assert_completed_with_one_tool_run(service, second, run_id, before)
    finally:
        service.close()


def test_a_run_without_tools_executed_without_a_workflow_resumes_after_a_kill(
    tmp_path: Path,
) -> None:
    """Its first execution writes no workflow (ADR 0031): the restarted daemon's lease sweep
    puts it on the queue, where it gets one, and the run completes, resumed once."""
    service = Service(f"sqlite:///{tmp_path / 'tg.db'}", tmp_path)
    service.hold.touch()
    try:
        first = service.start()
        body = {"prompt": "wait", "model": "fake:waiting"}
        run_id = service.request(first, "POST", "/v1/runs", "member", json=body)["run_id"]
        wait_for(
            lambda: (
                service.request(first, "GET", f"/v1/runs/{run_id}", "owner")["status"] == "running"
            ),
            timeout=60,
            what="the run to start",
        )
        with contextlib.closing(sqlite3.connect(tmp_path / "tg.db.workflows")) as conn:
            assert conn.execute(
                "SELECT count(*) FROM workflow_status WHERE workflow_uuid = ?", (run_id,)
            ).fetchone() == (0,), "no workflow written for its first execution"
        first.kill()
        service.hold.unlink()
        second = service.start()
        run = service.done(second, run_id)
        assert run["status"] == "completed" and run["tasks"][0]["output"] == "released"
        types = [e["type"] for e in service.events(second, run_id)]
        assert types.count("run.resumed") == 1 and "run.interrupted" not in types
    finally:
        service.close()


def test_a_daemon_executes_at_most_its_concurrency_and_queues_the_rest(tmp_path: Path) -> None:
    """Also when the runs arrive at once: two start here, the others wait in the queue, and
    every one completes once the first ones end."""
    service = Service(
        f"sqlite:///{tmp_path / 'tg.db'}",
        tmp_path,
        env={"THOUGHTGATE_DURABILITY__CONCURRENCY": "2"},
    )
    service.hold.touch()
    try:
        daemon = service.start()
        body = {"prompt": "wait", "model": "fake:waiting"}

        def post(_: int) -> str:
            run_id: str = service.request(daemon, "POST", "/v1/runs", "member", json=body)["run_id"]
            return run_id

        with ThreadPoolExecutor(max_workers=5) as burst:
            runs = list(burst.map(post, range(5)))

        def statuses() -> list[str]:
            return [
                service.request(daemon, "GET", f"/v1/runs/{r}", "owner")["status"] for r in runs
            ]

        wait_for(lambda: statuses().count("running") == 2, timeout=60, what="two runs to start")
        time.sleep(1.5)  # several queue polls later, still two
        assert sorted(statuses()) == ["pending", "pending", "pending", "running", "running"]
        service.hold.unlink()
        for run_id in runs:
            assert service.done(daemon, run_id)["status"] == "completed"
    finally:
        service.close()


def test_a_run_whose_workflow_another_version_recorded_is_closed_not_left_open(
    tmp_path: Path,
) -> None:
    """A thoughtgate whose workflow takes other steps cannot replay an older one's run: the
    run ends ``interrupted`` with the reason instead of waiting for a process that will never
    take it from the queue."""
    service = Service(f"sqlite:///{tmp_path / 'tg.db'}", tmp_path)
    service.hold.touch()
    try:
        first = service.start()
        body = {"prompt": "go", "model": "fake:durable", "tools": ["side_effect"]}
        run_id = service.request(first, "POST", "/v1/runs", "member", json=body)["run_id"]
        tool_ran(service)
        first.kill()
        with contextlib.closing(sqlite3.connect(tmp_path / "tg.db.workflows")) as workflows:
            workflows.execute(
                "UPDATE workflow_status SET application_version = 'thoughtgate-run-0' "
                "WHERE workflow_uuid = ?",
                (run_id,),
            )
            workflows.commit()
        service.hold.unlink()
        second = service.start()
        run = service.done(second, run_id)
        assert run["status"] == "interrupted"
        assert "thoughtgate-run-0" in run["error"], run["error"]
        assert len(side_effects(service.effects)) == 1, "nothing ran again"
        with contextlib.closing(sqlite3.connect(tmp_path / "tg.db.workflows")) as workflows:
            left = workflows.execute(
                "SELECT count(*) FROM workflow_status WHERE workflow_uuid = ?", (run_id,)
            ).fetchone()[0]
        assert left == 0, "its checkpoints (which may hold carriers) are deleted"
    finally:
        service.close()


# --------------------------------------------------------------------------- PostgreSQL, two replicas


@contextlib.contextmanager
def pg_database() -> Iterator[str]:
    schema = schema_name()
    try:
        yield f"{PG_URL}?schema={schema}"
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as admin:
            for name in (schema, f"{schema}_workflows"):
                admin.execute(
                    sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name))
                )


@contextlib.contextmanager
def two_replicas_on_postgres(
    tmp_path: Path,
) -> Iterator[tuple[Service, ServeProcess, ServeProcess]]:
    """Two replicas started together on a fresh PostgreSQL schema; stopped, and the schema
    dropped, after."""
    with pg_database() as db:
        service = Service(db, tmp_path)
        try:
            a, b = service.start_two()
            yield service, a, b
        finally:
            service.close()


def _loop_scenario() -> Scenario:
    return Scenario(
        "durable-loop",
        (
            ScriptedTurn(
                (
                    Think("I must act once; I call side_effect."),
                    Call("side_effect", {"label": "once"}),
                )
            ),
            ScriptedTurn(
                (Sleep(2.5), Think("It is done. SECRET-REASONING tail."), Say("all done"))
            ),
        ),
    )


def test_two_replicas_on_postgres_the_survivor_completes_a_run_whose_replica_was_killed(
    tmp_path: Path,
) -> None:
    emulator = Emulator()
    emulator.add(_loop_scenario(), default=True)
    with serve_emulator(emulator) as server, pg_database() as db:
        service = Service(
            db, tmp_path, env={"ANTHROPIC_BASE_URL": server.url, "ANTHROPIC_API_KEY": "any"}
        )
        try:
            a, b = service.start_two()
            run_id = service.request(
                a,
                "POST",
                "/v1/runs",
                "member",
                json={
                    "prompt": "go",
                    "model": "anthropic:claude-sonnet-4-5",
                    "tools": ["side_effect"],
                    "chain_of_thought": "surface",
                },
            )["run_id"]
            executing_pid = tool_ran(service)
            executing, survivor = (a, b) if a.proc and str(a.proc.pid) == executing_pid else (b, a)
            assert executing.proc is not None and str(executing.proc.pid) == executing_pid
            wait_for(
                lambda: any(
                    e["type"] == "tool.completed" for e in service.events(survivor, run_id)
                ),
                timeout=60,
                what="the tool's end to be recorded",
            )
            wait_for(  # the second turn has been asked (and sleeps 2.5 s): the kill cuts it
                lambda: sum(r.path.endswith("/messages") for r in emulator.requests) >= 2,
                timeout=60,
                what="the second turn to be asked",
            )
            before = service.events(survivor, run_id)
            executing.kill()
            killed_at = time.monotonic()
            run = service.done(survivor, run_id)
            assert time.monotonic() - killed_at < 30, "the survivor took over within 30 s"
            assert run["status"] == "completed" and run["tasks"][0]["output"] == "all done"
            assert len(side_effects(service.effects)) == 1, "the tool ran exactly once"
            signatures = tuple(
                block["signature"]
                for r in emulator.requests
                for m in r.body.get("messages", [])
                if isinstance(m.get("content"), list)
                for block in m["content"]
                if block.get("type") == "thinking"
            )
            assert signatures, "signed thinking went back to the provider"
            assert_resumed_cleanly(service, survivor, run_id, before, signatures)
            statuses = [r.status for r in emulator.requests if r.path.endswith("/messages")]
            assert statuses and all(s == 200 for s in statuses), (
                f"the emulator refused a continued turn: {statuses}"
            )
            continued = [r.body for r in emulator.requests if len(r.body.get("messages", [])) > 1]
            assert continued, "the loop was continued"
            for body in continued:
                first_reply = body["messages"][1]["content"]
                assert first_reply[0]["type"] == "thinking" and first_reply[0]["signature"]
        finally:
            service.close()


def _executor_pid(db: str, run_id: str) -> int | None:
    """The pid of the process holding a run (its lease owner; no view shows it)."""
    schema = db.split("schema=")[1]
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        row = conn.execute(
            sql.SQL("SELECT owner FROM {}.runs WHERE run_id = %s").format(sql.Identifier(schema)),
            (run_id,),
        ).fetchone()
    owner = row[0] if row else None
    return int(owner.split(".")[1]) if owner else None


def test_an_approval_asked_on_a_killed_replica_is_answered_on_the_other_and_the_run_continues(
    tmp_path: Path,
) -> None:
    with two_replicas_on_postgres(tmp_path) as (service, a, b):
        db = service.db
        run_id = service.request(
            a,
            "POST",
            "/v1/runs",
            "member",
            json={"prompt": "guarded go", "model": "fake:durable", "tools": ["guarded"]},
        )["run_id"]

        def asked() -> bool:
            return any(e["type"] == "tool.approval_required" for e in service.events(b, run_id))

        wait_for(asked, timeout=60, what="the approval to be asked")
        pid = _executor_pid(db, run_id)
        asking, other = (a, b) if a.proc is not None and a.proc.pid == pid else (b, a)
        assert other.proc is not None and other.proc.pid != pid
        before = service.events(other, run_id)
        asking.kill()
        # answered on the other replica while the run has no process at all: the answer waits
        answer = service.request(
            other,
            "POST",
            f"/v1/runs/{run_id}/approvals/call_once",
            "member",
            json={"decision": "approve"},
        )
        assert answer["decision"] == "approve"
        run = service.done(other, run_id)
        assert run["status"] == "completed" and run["tasks"][0]["output"] == "all done"
        assert len(side_effects(service.effects)) == 1
        after = service.events(other, run_id)
        assert after[: len(before)] == before
        decided = [e["payload"] for e in after if e["type"] == "tool.approval_response"]
        assert [d["decision"] for d in decided] == ["approve"]
        assert sum(e["type"] == "tool.approval_required" for e in after) == 1, "asked once"
        assert _executor_pid(db, run_id) == (other.proc.pid if other.proc else None)


def test_an_approval_timeout_runs_from_the_request_across_a_restart(tmp_path: Path) -> None:
    timeout_s = 8.0
    service = Service(
        f"sqlite:///{tmp_path / 'tg.db'}",
        tmp_path,
        env={"THOUGHTGATE_ORCHESTRATION__APPROVAL_TIMEOUT_S": str(timeout_s)},
    )
    try:
        first = service.start()
        run_id = service.request(
            first,
            "POST",
            "/v1/runs",
            "member",
            json={"prompt": "guarded go", "model": "fake:durable", "tools": ["guarded"]},
        )["run_id"]
        wait_for(
            lambda: any(
                e["type"] == "tool.approval_required" for e in service.events(first, run_id)
            ),
            timeout=60,
            what="the approval to be asked",
        )
        time.sleep(2.0)  # part of the timeout passes before the kill
        first.kill()
        second = service.start()
        run = service.done(second, run_id, timeout=HANG_S)
        assert run["status"] == "completed"
        log = service.events(second, run_id)
        asked = next(e for e in log if e["type"] == "tool.approval_required")
        (resumed,) = (e for e in log if e["type"] == "run.resumed")
        expired = next(e for e in log if e["type"] == "tool.approval_timeout")
        waited = expired["ts"] - asked["ts"]
        assert waited >= timeout_s - 0.5, f"it expired {waited:.1f} s after the request"
        # Run from the resume, the timeout would end a whole timeout_s after it. Run from the
        # request it ends timeout_s after the request -- at once on a resume later than that
        # (on a loaded machine, the restart and the lease alone can take longer than 8 s).
        since_resume = expired["ts"] - resumed["ts"]
        assert since_resume < timeout_s, (
            f"the timeout ran {since_resume:.1f} s from the resume ({waited:.1f} s from the "
            "request), not from the request"
        )
        assert side_effects(service.effects) == [], "an expired approval runs nothing"
    finally:
        service.close()


def test_a_replica_without_a_runs_tools_never_takes_it(tmp_path: Path) -> None:
    """A run started on a replica that lacks its tools goes to the queue of one that has them."""
    with pg_database() as db:
        service = Service(db, tmp_path)
        try:
            tooled = service.start()
            bare = ServeProcess(
                "--db",
                db,
                "--tools",
                "support.served:NO_TOOLS",
                "--no-bootstrap-key",
                "--shutdown-grace",
                "0.2",
                env=service.env,
            ).start()
            service.daemons.append(bare)
            body = {"prompt": "go", "model": "fake:durable", "tools": ["side_effect"]}
            runs = [
                service.request(bare, "POST", "/v1/runs", "member", json=body)["run_id"]
                for _ in range(3)
            ]
            for run_id in runs:
                assert service.done(bare, run_id)["status"] == "completed"
            pids = {line.split()[1] for line in side_effects(service.effects)}
            assert tooled.proc is not None and pids == {str(tooled.proc.pid)}
            unknown = httpx.post(
                f"{bare.base_url}/v1/runs",
                json={**body, "tools": ["no_such_tool"]},
                headers=auth(service.keys["member"]),
            )
            assert unknown.status_code == 400 and "no replica" in unknown.text
        finally:
            service.close()


# --------------------------------------------------------------------------- the CLI


def test_a_killed_thoughtgate_run_without_a_workflow_is_suspended_and_resume_finishes_it(
    tmp_path: Path,
) -> None:
    """A run of one model task without tools executes in ``thoughtgate run`` without a workflow
    (ADR 0046), as a daemon's does: killed, it is suspended like any other, and ``resume``
    starts it again from its spec -- its workflow is written then."""
    db = f"sqlite:///{tmp_path / 'tg.db'}"
    hold = tmp_path / "hold"
    hold.touch()
    env = cli_env(**{HOLD: str(hold)})
    no_tools = ("--tools", "support.served:NO_TOOLS")

    def started() -> None:
        wait_for(lambda: _recorded(db, "task.started"), timeout=HANG_S, what="the run to start")
        with contextlib.closing(sqlite3.connect(tmp_path / "tg.db.workflows")) as conn:
            assert conn.execute("SELECT count(*) FROM workflow_status").fetchone() == (0,), (
                "no workflow written for its first execution"
            )

    command = ["run", "wait", "--model", "fake:waiting", *no_tools, "--db", db, "--json"]
    _killed_once(command, env, started)
    hold.unlink()
    run = _suspended_run(db, env)
    resumed = _thoughtgate(["resume", run["run_id"], *no_tools, "--db", db, "--json"], env)
    assert resumed.returncode == 0, resumed.stderr
    view = json.loads(resumed.stdout)
    assert view["status"] == "completed" and view["tasks"][0]["output"] == "released"
    types = _types(db, run["run_id"])
    assert types.count("run.resumed") == 1 and "run.interrupted" not in types
    with contextlib.closing(sqlite3.connect(tmp_path / "tg.db.workflows")) as conn:
        assert conn.execute("SELECT workflow_uuid FROM workflow_status").fetchall() == [
            (run["run_id"],)
        ], "its resume wrote its workflow"


def _killed_once(command: list[str], env: dict[str, str], ready: Callable[[], None]) -> None:
    """Run ``thoughtgate COMMAND`` and kill it (SIGKILL) once ``ready`` returns."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "thoughtgate", *command],
        env=env,
        cwd=str(REPO),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        ready()
    finally:
        proc.kill()
        proc.wait(timeout=10)


def _thoughtgate(
    args: list[str], env: dict[str, str], timeout: float = 90
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "thoughtgate", *args],
        env=env,
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _suspended_run(db: str, env: dict[str, str]) -> dict[str, Any]:
    """The store's one run, as ``thoughtgate runs`` lists it once its killed process's run was
    found (its sweep suspends it): open, waiting for ``resume``."""
    (run,) = json.loads(_thoughtgate(["runs", "--db", db, "--json"], env, timeout=60).stdout)
    assert run["status"] == "running"
    assert run["metadata"]["suspended"]["resume"] == "manual"
    return dict(run)


def _types(db: str, run_id: str) -> list[str]:
    """The types of a run's events, in order."""

    async def read() -> list[str]:
        store = await open_store(db, sweep=False)
        try:
            return [str(e.type) for e in await store.read(run_id)]
        finally:
            await store.close()

    return asyncio.run(read())


def _recorded(db: str, event_type: str) -> bool:
    """Whether the one run in the store has an event of ``event_type`` (read without a sweep:
    the process executing it is alive)."""

    async def read() -> bool:
        store = await open_store(db, sweep=False)
        try:
            runs = await store.list_runs()
            return bool(runs) and any(
                e.type == event_type for e in await store.read(runs[0].run_id)
            )
        finally:
            await store.close()

    return asyncio.run(read())


@pytest.mark.parametrize("how", ["cli", "http", "cli-url"])
def test_a_killed_thoughtgate_run_is_suspended_and_resume_finishes_it(
    tmp_path: Path, how: str
) -> None:
    """``thoughtgate resume`` continues it in the terminal; the web page's Resume asks a daemon
    (``POST /v1/runs/{id}/resume``, what its button calls), and so does ``thoughtgate resume
    --url``, which then follows the run on the daemon to its end."""
    db = f"sqlite:///{tmp_path / 'tg.db'}"
    effects, hold = tmp_path / "effects", tmp_path / "hold"
    hold.touch()
    env = cli_env(**{SIDE_EFFECTS: str(effects), HOLD: str(hold)})

    def tool_ended() -> None:
        wait_for(lambda: side_effects(effects), timeout=HANG_S, what="the tool to run")
        # killed once the tool's end is recorded (its step with it), not after a guessed pause
        wait_for(
            lambda: _recorded(db, "tool.completed"), timeout=60, what="the tool's end recorded"
        )

    _killed_once(
        ["run", "go", "--model", "fake:durable", *TOOLS, "--db", db, "--json"], env, tool_ended
    )
    hold.unlink()
    run = _suspended_run(db, env)
    if how == "cli":
        short = run["run_id"][4:12]
        resumed = _thoughtgate(["resume", short, *TOOLS, "--db", db, "--json"], env)
        assert resumed.returncode == 0, resumed.stderr
        view = json.loads(resumed.stdout)
    elif how == "cli-url":
        service = Service(db, tmp_path)
        try:
            daemon = service.start()
            remote = {"THOUGHTGATE_URL": daemon.base_url, "THOUGHTGATE_KEY": service.keys["member"]}
            resumed = _thoughtgate(["resume", run["run_id"][4:12]], {**env, **remote})
            assert resumed.returncode == 0, resumed.stderr
            said = " ".join(resumed.stderr.split())
            assert f"resuming run {run['run_id']} on {daemon.base_url} (as member)" in said
            assert "all done" in resumed.stdout, "followed live to its answer"
            assert SECRET not in resumed.stdout + resumed.stderr, "a member sees no reasoning"
            view = service.done(daemon, run["run_id"])
            again = _thoughtgate(["resume", run["run_id"], "--json"], {**env, **remote})
            assert again.returncode == 2 and again.stdout == ""
            assert "has already ended (completed)" in " ".join(again.stderr.split())
        finally:
            service.close()
    else:
        service = Service(db, tmp_path)
        try:
            daemon = service.start()
            viewer = httpx.post(
                f"{daemon.base_url}/v1/runs/{run['run_id']}/resume",
                headers=auth(service.keys["viewer"]),
            )
            assert viewer.status_code == 403, "resuming is for members and above"
            service.request(daemon, "POST", f"/v1/runs/{run['run_id']}/resume", "member")
            view = service.done(daemon, run["run_id"])
            again = httpx.post(
                f"{daemon.base_url}/v1/runs/{run['run_id']}/resume",
                headers=auth(service.keys["member"]),
            )
            assert again.status_code == 409, "an ended run does not resume"
        finally:
            service.close()
    assert view["status"] == "completed" and view["tasks"][0]["output"] == "all done"
    assert len(side_effects(effects)) == 1, "the tool ran exactly once"
