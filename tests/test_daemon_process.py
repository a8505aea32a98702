"""``thoughtgate serve`` and ``thoughtgate keys`` as real processes: keys via the CLI, SIGTERM
interrupts in-flight runs (live readers see ``run.interrupted``), and runs left running by a
``kill -9`` are marked interrupted when the daemon starts again."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support.daemon import HANG_S, ServeProcess, ThreadServer, auth, cli

from thoughtgate.events.schema import EventType
from thoughtgate.server.app import create_app
from thoughtgate.store.leases import Owner
from thoughtgate.store.memory import MemoryStore
from thoughtgate.store.records import RunRecord, TaskRecord

HAVE_SQLITE = importlib.util.find_spec("thoughtgate.store.sqlite") is not None
needs_sqlite = pytest.mark.skipif(
    not HAVE_SQLITE, reason="needs the SQLite store (thoughtgate.store.sqlite, branch store)"
)
TOOLS = ("--tools", "support.served:SERVER_TOOLS")
NOT_DURABLE = {"THOUGHTGATE_DURABILITY__ENABLED": "false"}
"""Runs that cannot resume (ADR 0009's path); durable daemons resume instead (ADR 0013,
test_durable_replicas)."""


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'daemon.db'}" if HAVE_SQLITE else "memory://"


@pytest.fixture
def serve_processes() -> Iterator[list[ServeProcess]]:
    started: list[ServeProcess] = []
    yield started
    for proc in started:
        proc.stop()


def _wait_status(client: httpx.Client, run_id: str, want: set[str], timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        run = client.get(f"/v1/runs/{run_id}").json()
        if run["status"] in want or time.monotonic() > deadline:
            return dict(run)
        time.sleep(0.05)


def test_keys_create_json_prints_the_key_once() -> None:
    done = cli(
        "keys", "create", "--role", "developer", "--name", "ci", "--json", "--db", "memory://"
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert set(data) == {"key_id", "name", "role", "key"} and data["role"] == "developer"
    assert data["key_id"].startswith("key_"), "the id `keys revoke` takes is printed too"
    assert data["key"].startswith("tg_")
    bad = cli("keys", "create", "--role", "root", "--name", "x", "--db", "memory://")
    assert bad.returncode == 2 and "unknown role" in bad.stderr


def test_serve_subprocess_with_cli_keys(db_url: str, serve_processes: list[ServeProcess]) -> None:
    if HAVE_SQLITE:
        viewer = json.loads(
            cli(
                "keys", "create", "--role", "viewer", "--name", "v", "--json", "--db", db_url
            ).stdout
        )["key"]
        owner = json.loads(
            cli("keys", "create", "--role", "owner", "--name", "o", "--json", "--db", db_url).stdout
        )["key"]
        server = ServeProcess("--db", db_url, "--no-bootstrap-key").start()
    else:  # memory:// is per process: the daemon prints a one-time owner key instead
        server = ServeProcess("--db", db_url).start(expect_key=True)
        assert server.bootstrap_key
        owner = server.bootstrap_key
        with httpx.Client(base_url=server.base_url, headers=auth(owner)) as c:
            viewer = c.post("/v1/keys", json={"name": "v", "role": "viewer"}).json()["key"]
    serve_processes.append(server)
    with httpx.Client(base_url=server.base_url, timeout=10) as c:
        assert c.get("/healthz").json()["status"] == "ok"
        assert c.get("/v1/me", headers=auth(viewer)).json()["role"] == "viewer"
        run = c.post(
            "/v1/runs",
            headers=auth(owner),
            json={"prompt": "hi", "model": "fake:echo", "chain_of_thought": "surface"},
        )
        assert run.status_code == 202
        run_id = run.json()["run_id"]
        with httpx.Client(base_url=server.base_url, headers=auth(owner)) as as_owner:
            done = _wait_status(as_owner, run_id, {"completed"})
        assert done["tasks"][0]["reasoning"]  # owner, surface
        seen = c.get(f"/v1/runs/{run_id}", headers=auth(viewer)).json()
        assert "reasoning" not in seen["tasks"][0]  # viewer: withheld, so absent
    if HAVE_SQLITE:
        listed = json.loads(cli("keys", "list", "--json", "--db", db_url).stdout)
        assert {k["name"] for k in listed} == {"v", "o"}
        assert cli("keys", "revoke", "v", "--db", db_url).returncode == 0
        with httpx.Client(base_url=server.base_url) as c:
            assert c.get("/v1/me", headers=auth(viewer)).status_code == 401


def test_sigterm_interrupts_in_flight_runs_and_exits_cleanly(
    db_url: str, serve_processes: list[ServeProcess], request: pytest.FixtureRequest
) -> None:
    server = ServeProcess("--db", db_url, *TOOLS, "--shutdown-grace", "0.3", env=NOT_DURABLE).start(
        expect_key=True
    )
    serve_processes.append(server)
    key = server.bootstrap_key
    assert key
    client = httpx.Client(base_url=server.base_url, headers=auth(key), timeout=10)
    request.addfinalizer(client.close)
    slow = client.post(
        "/v1/runs", json={"prompt": "slow", "model": "fake:slow", "chain_of_thought": "surface"}
    ).json()["run_id"]
    waiting = client.post(
        "/v1/runs", json={"prompt": "approval", "model": "fake:approval", "tools": ["dangerous"]}
    ).json()["run_id"]
    quick = client.post("/v1/runs", json={"prompt": "hi", "model": "fake:echo"}).json()["run_id"]
    assert _wait_status(client, quick, {"completed"})["status"] == "completed"
    _wait_status(client, waiting, {"running"})
    ticket = client.post("/v1/tickets", json={"run_id": slow}).json()["ticket"]
    lines: list[str] = []
    reading = threading.Event()  # the live reader has its first event

    def follow() -> None:
        with httpx.stream(
            "GET", f"{server.base_url}/v1/runs/{slow}/stream", params={"ticket": ticket}, timeout=20
        ) as r:
            for line in r.iter_lines():
                lines.append(line)
                if line.startswith("data:"):
                    reading.set()

    reader = threading.Thread(target=follow)
    reader.start()
    assert reading.wait(60), "the live reader got no event"
    assert server.proc is not None
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=HANG_S) == 0
    reader.join(timeout=60)  # it reads the stream to its end
    frames = [json.loads(line[5:]) for line in lines if line.startswith("data:")]
    assert frames[-1]["type"] == EventType.RUN_INTERRUPTED  # the live reader saw the end
    assert [f["seq"] for f in frames] == list(range(1, len(frames) + 1))
    log = "".join(server.stderr_lines)
    assert "interrupted 2 in-flight run(s)" in log
    access = server.stdout_text()
    assert "/stream?ticket=…" in access  # the access log redacts tickets
    assert ticket not in access and ticket not in log
    if HAVE_SQLITE:  # after a restart the log says the same
        again = ServeProcess("--db", db_url, "--no-bootstrap-key", env=NOT_DURABLE).start()
        serve_processes.append(again)
        with httpx.Client(base_url=again.base_url, headers=auth(key)) as c:
            for run_id in (slow, waiting):
                run = c.get(f"/v1/runs/{run_id}").json()
                assert run["status"] == "interrupted"
                assert [t["status"] for t in run["tasks"]] == ["interrupted"], "tasks end too"
                types = [e["type"] for e in c.get(f"/v1/runs/{run_id}/events").json()["events"]]
                assert types[-2:] == ["task.completed", "run.interrupted"]
                assert types.count("run.interrupted") == 1
            assert c.get(f"/v1/runs/{quick}").json()["status"] == "completed"


@needs_sqlite
def test_kill_9_leaves_runs_that_the_next_start_marks_interrupted(
    db_url: str, serve_processes: list[ServeProcess]
) -> None:
    server = ServeProcess("--db", db_url, *TOOLS, env=NOT_DURABLE).start(expect_key=True)
    serve_processes.append(server)
    key = server.bootstrap_key
    assert key
    with httpx.Client(base_url=server.base_url, headers=auth(key), timeout=10) as c:
        run_id = c.post("/v1/runs", json={"prompt": "slow", "model": "fake:slow"}).json()["run_id"]
        assert _wait_status(c, run_id, {"running"})["status"] == "running"
    assert server.proc is not None
    server.proc.kill()
    server.proc.wait(timeout=10)
    again = ServeProcess("--db", db_url, "--no-bootstrap-key", env=NOT_DURABLE).start()
    serve_processes.append(again)
    with httpx.Client(base_url=again.base_url, headers=auth(key), timeout=10) as c:
        run = c.get(f"/v1/runs/{run_id}").json()
        assert run["status"] == "interrupted"
        assert [t["status"] for t in run["tasks"]] == ["interrupted"], "its task ends too"
        events = c.get(f"/v1/runs/{run_id}/events").json()["events"]
        assert [e["type"] for e in events][-2:] == ["task.completed", "run.interrupted"]
        assert [e["seq"] for e in events] == list(range(1, len(events) + 1))


# --------------------------------------------------------------------------- in-process


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_the_app_closes_runs_of_dead_processes_on_startup() -> None:
    store = MemoryStore()
    me = Owner.current()
    dead = Owner(me.host, _dead_pid(), "gone")
    run = RunRecord("run_left", "p", status="running", owner=dead.owner_id)
    run.tasks = [TaskRecord("task_left", "run_left", 0, "p", status="running")]
    asyncio.run(store.create_run(run))
    with ThreadServer(create_app(store)) as server:
        status = httpx.get(f"{server.base_url}/healthz").status_code
    assert status == 200
    closed = asyncio.run(store.get_run("run_left"))
    assert closed.status == "interrupted" and closed.tasks[0].status == "interrupted"


async def test_no_new_runs_once_shutdown_began() -> None:
    from thoughtgate.access.keys import create_key

    store = MemoryStore()
    key = (await create_key(store, name="m", role="member")).key
    app = create_app(store)
    await app.state.thoughtgate.manager.shutdown()
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://daemon") as client:
        r = await client.post(
            "/v1/runs", json={"prompt": "hi", "model": "fake:echo"}, headers=auth(key)
        )
    assert r.status_code == 503 and "shutting down" in r.json()["error"]["message"]


def test_daemon_tools_come_from_flags_and_entry_points(monkeypatch: pytest.MonkeyPatch) -> None:
    import support.daemon

    from thoughtgate.cli import serve as serve_cli

    class Entry:
        def __init__(self, name: str, target: object) -> None:
            self.name, self.target = name, target

        def load(self) -> object:
            if isinstance(self.target, Exception):
                raise self.target
            return self.target

    entries = [Entry("ours", [support.daemon.dangerous]), Entry("broken", ImportError("nope"))]
    monkeypatch.setattr(serve_cli, "entry_points", lambda group: entries)
    registry = serve_cli.daemon_tools(["support.daemon:lookup"])
    assert [t.name for t in registry] == ["lookup", "dangerous"]


@pytest.mark.parametrize("words", [False, True], ids=["info", "debug"])
def test_a_broken_tools_entry_point_is_named_with_its_words_at_debug_only(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], words: bool
) -> None:
    """A plug-in's import error is its author's text, which may hold anything (ADR 0104: an
    exception's words at ``--log-level debug`` only); below debug the warning names its class.
    Either way the text is printed as it is, never read as console markup: ``[/x]`` in it
    stopped the daemon from starting."""
    from thoughtgate.cli import serve as serve_cli

    said = "cannot import [/x] REASONING-PLUGINLEAK"

    class Broken:
        name = "broken"

        def load(self) -> object:
            raise ImportError(said)

    monkeypatch.setattr(serve_cli, "entry_points", lambda group: [Broken()])
    registry = serve_cli.daemon_tools([], words=words)
    assert list(registry) == []
    err = " ".join(capsys.readouterr().err.split())
    assert "warning: cannot load tools from entry point broken: ImportError" in err
    assert ("PLUGINLEAK" in err) is words
    if words:
        assert said in err


@pytest.mark.parametrize("level", ["info", "debug"])
def test_serve_starts_and_stops_with_its_own_lines_uvicorns_at_debug_only(
    level: str, serve_processes: list[ServeProcess]
) -> None:
    """``thoughtgate serve`` printed uvicorn's ``INFO: Started server process [PID]``, ``Waiting
    for application startup.`` and ``Application startup complete.`` above the listening line
    docs/daemon.md shows, and four more at Ctrl+C. They are ``--log-level debug``'s; the access
    log (stdout) is as before."""
    server = ServeProcess("--db", "memory://", "--log-level", level, env=NOT_DURABLE)
    serve_processes.append(server.start(expect_key=True))
    with httpx.Client(base_url=server.base_url) as client:
        assert client.get("/v1/me").status_code == 401
    assert server.proc is not None
    server.proc.send_signal(signal.SIGINT)
    assert server.proc.wait(timeout=HANG_S) == 0
    access = server.stdout_text()
    server.stop()  # (its stderr read to the end)
    said = "".join(server.stderr_lines)
    lifecycle = ("Started server process [", "Application startup complete.", "Shutting down")
    shown = [line for line in lifecycle if line in said]
    if level == "info":
        assert server.stderr_lines[0].startswith("thoughtgate listening on http://"), said
        assert shown == [], said
    else:
        assert shown == list(lifecycle), said
    assert 'GET /v1/me HTTP/1.1" 401' in access


@pytest.mark.postgres
def test_the_listening_line_names_a_postgresql_store_without_its_password() -> None:
    """``thoughtgate serve`` says which store it serves on stderr, which ends in an operator's
    log collector: a PostgreSQL URL's password is not part of what it says."""
    from urllib.parse import urlsplit, urlunsplit

    import psycopg
    from psycopg import sql
    from support.pg import PG_URL, schema_name

    parts = urlsplit(PG_URL)
    user = parts.username or "postgres"
    where = parts.netloc.rpartition("@")[2]
    schema = schema_name()
    url = urlunsplit(parts._replace(netloc=f"{user}:PWLEAK-s3cret@{where}", query=""))
    server = ServeProcess("--db", f"{url}?schema={schema}")
    try:
        server.start(expect_key=True)
        said = "".join(server.stderr_lines)
    finally:
        server.stop()
        with psycopg.connect(PG_URL, autocommit=True, connect_timeout=5) as admin:
            admin.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
            )
    assert "thoughtgate listening on http://" in said
    assert "PostgreSQL database" in said
    assert "PWLEAK" not in said


def test_sighup_drains_the_daemon_as_sigterm_does_unless_it_was_ignored(
    serve_processes: list[ServeProcess], request: pytest.FixtureRequest
) -> None:
    """A daemon started in a terminal that is then closed gets ``SIGHUP``: it drains as for
    ``SIGTERM`` -- its run closed ``interrupted``, exit 0 -- instead of dying by the signal
    (129) with the run left open. Started with ``SIGHUP`` ignored (``nohup``) it keeps serving
    (ADR 0172)."""
    server = ServeProcess("--db", "memory://", *TOOLS, "--shutdown-grace", "0.3").start(
        expect_key=True
    )
    serve_processes.append(server)
    key = server.bootstrap_key
    assert key and server.proc is not None
    client = httpx.Client(base_url=server.base_url, headers=auth(key), timeout=10)
    request.addfinalizer(client.close)
    slow = client.post("/v1/runs", json={"prompt": "slow", "model": "fake:slow"}).json()["run_id"]
    _wait_status(client, slow, {"running"})
    server.proc.send_signal(signal.SIGHUP)
    assert server.proc.wait(timeout=HANG_S) == 0
    assert "interrupted 1 in-flight run(s)" in "".join(server.stderr_lines)

    ignoring = ServeProcess("--db", "memory://", "--no-bootstrap-key")
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # what nohup does, inherited
    try:
        ignoring.spawn()
    finally:
        signal.signal(signal.SIGHUP, previous)
    serve_processes.append(ignoring)
    ignoring.ready()
    assert ignoring.proc is not None
    ignoring.proc.send_signal(signal.SIGHUP)
    with httpx.Client(base_url=ignoring.base_url, timeout=10) as c:
        assert c.get("/healthz").status_code == 200, "still serving after SIGHUP under nohup"
    assert ignoring.proc.poll() is None
