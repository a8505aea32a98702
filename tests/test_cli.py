"""The CLI as a user runs it: real subprocesses, a real SQLite file, JSON for programs."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from thoughtgate.events.schema import EVENT_VERSION
from thoughtgate.store.urls import open_store

SRC = str(Path(__file__).resolve().parents[1] / "src")


def tg(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHONPATH": SRC, **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", "thoughtgate", *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd,
        timeout=120,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\nstdout:{proc.stdout}\nstderr:{proc.stderr}")
    return proc


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'tg.db'}"


async def _create_store(db: str) -> None:
    await (await open_store(db)).close()


def run_json(db: str, *extra: str) -> dict[str, Any]:
    out = tg("run", "hello world", "--model", "fake:echo", "--db", db, "--json", *extra)
    value: dict[str, Any] = json.loads(out.stdout)
    return value


def test_run_json_is_the_run_view_and_follows_the_reasoning_rules(db: str) -> None:
    surface = run_json(db, "--cot", "surface")
    assert {"run_id", "status", "error", "chain_of_thought", "tasks", "usage"} <= set(surface)
    assert surface["status"] == "completed" and surface["chain_of_thought"] == "surface"
    assert surface["error"] is None
    task = surface["tasks"][0]
    assert {"task_id", "status", "output", "reasoning", "error"} <= set(task)
    assert (task["status"], task["error"]) == ("completed", None)
    assert task["output"] == "Echo: hello world"
    assert "echo them back" in task["reasoning"]
    # the same document as `status --json` for the same reader
    status = json.loads(tg("status", surface["run_id"], "--db", db, "--json").stdout)
    assert status == surface
    # withheld reasoning is absent, never null
    assert "reasoning" not in run_json(db, "--cot", "surface", "--view-as", "member")["tasks"][0]
    assert "reasoning" not in run_json(db, "--cot", "telemetry_only")["tasks"][0]
    assert "reasoning" not in run_json(db)["tasks"][0]


def test_events_status_runs_and_trace_read_through_the_filter(db: str) -> None:
    run_id = run_json(db, "--cot", "surface")["run_id"]
    owner = json.loads(tg("events", run_id, "--db", db, "--json").stdout)
    assert [e["seq"] for e in owner] == list(range(1, len(owner) + 1))
    assert set(owner[0]) == {"seq", "run_id", "task_id", "type", "ts", "v", "payload"}
    assert {e["v"] for e in owner} == {EVENT_VERSION}
    assert any(e["type"] == "reasoning.delta" for e in owner)
    viewer = json.loads(tg("events", run_id, "--db", db, "--json", "--view-as", "viewer").stdout)
    assert not any(e["type"] == "reasoning.delta" for e in viewer)
    assert "echo them back" not in json.dumps(viewer)
    after = json.loads(tg("events", run_id, "--db", db, "--json", "--after", "5").stdout)
    assert after[0]["seq"] == 6
    status = json.loads(tg("status", run_id, "--db", db, "--json").stdout)
    assert status["tasks"][0]["reasoning"]
    runs = json.loads(tg("runs", "--db", db, "--json").stdout)
    assert runs[0]["run_id"] == run_id
    trace = json.loads(tg("trace", run_id, "--db", db, "--json").stdout)
    assert trace[0]["payload"]["trace"]["reasoning"]
    denied = tg("trace", run_id, "--db", db, "--view-as", "member", check=False)
    assert denied.returncode == 2 and "developer" in denied.stderr


def test_status_names_each_turns_reasoning_for_what_it_is(db: str) -> None:
    """Raw reasoning (fake:echo) is "Raw reasoning"; Claude 4+ summarized thinking (the demo) is
    "Reasoning (provider summary)"; a viewer's status shows neither, only the visible steps."""
    wide = {"COLUMNS": "200"}
    raw_run = run_json(db, "--cot", "surface")["run_id"]
    developer = tg("status", raw_run, "--db", db, "--view-as", "developer", env=wide).stdout
    assert "Raw reasoning · model turn 1 · developer only" in developer
    assert "echo them back" in developer and "provider summary" not in developer
    demo = json.loads(tg("demo", "--json", "--db", db).stdout)["run_id"]
    developer = tg("status", demo, "--db", db, "--view-as", "developer", env=wide).stdout
    for turn in (1, 2, 3):
        assert f"Reasoning (provider summary) · model turn {turn} · developer only" in developer
    assert "Raw reasoning" not in developer
    viewer = tg("status", demo, "--db", db, "--view-as", "viewer", env=wide).stdout
    assert "Reasoning" not in viewer.replace("About the reasoning", "")
    assert "I need the user's country" not in viewer  # the thinking, never shown to a viewer
    assert "• Found your country in your profile." in viewer  # narrated for the reader
    assert "↳ Checking your profile for your country" in viewer  # why, under its tool's card
    assert "notes the agent wrote for you (3)" in viewer
    assert "only developers and above can read it" in viewer


def test_local_role_from_config_and_view_as_cannot_raise_it(db: str, tmp_path: Path) -> None:
    cfg = tmp_path / "thoughtgate.toml"
    cfg.write_text(
        '[access]\nlocal_role = "member"\n[orchestration]\nchain_of_thought = "surface"\n'
    )
    out = json.loads(
        tg("run", "hi", "--model", "fake:echo", "--db", db, "--json", "--config", str(cfg)).stdout
    )
    assert out["chain_of_thought"] == "surface" and "reasoning" not in out["tasks"][0]
    up = tg(
        "status", out["run_id"], "--db", db, "--config", str(cfg), "--view-as", "owner", check=False
    )
    assert up.returncode == 2 and "above your local role" in up.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "x", "--model", "fake:echo", "--cot", "loud"], "unknown chain_of_thought mode"),
        (["run", "x", "--model", "fake:echo", "--view-as", "boss"], "unknown role 'boss'"),
        (["run", "x", "--model", "nope:x"], "unknown provider 'nope'"),
        (["status", "run_missing"], "run 'run_missing' not found"),
        (["events", "run_missing"], "not found"),
    ],
)
def test_bad_input_gets_one_clear_message(db: str, args: list[str], message: str) -> None:
    asyncio.run(_create_store(db))  # an unknown run in a store that exists
    proc = tg(*args, "--db", db, check=False)
    assert proc.returncode != 0
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_bad_config_fails_at_start(db: str, tmp_path: Path) -> None:
    (tmp_path / "thoughtgate.toml").write_text('[orchestration]\nchain_of_thought = "loud"\n')
    proc = tg("runs", "--db", db, check=False, cwd=tmp_path)
    assert proc.returncode == 2
    assert "orchestration.chain_of_thought" in proc.stderr and "'loud'" in proc.stderr


def test_env_db_and_config_overrides(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'env.db'}"
    out = json.loads(
        tg(
            "run",
            "x",
            "--model",
            "fake:echo",
            "--json",
            env={"THOUGHTGATE_DB": url, "THOUGHTGATE_ORCHESTRATION__CHAIN_OF_THOUGHT": "surface"},
        ).stdout
    )
    assert out["chain_of_thought"] == "surface"
    assert (tmp_path / "env.db").exists()


def test_not_our_database_is_refused_and_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    path.write_bytes(b"this is not sqlite at all" * 100)
    before = path.read_bytes()
    proc = tg("runs", "--db", f"sqlite:///{path}", check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert path.read_bytes() == before


def test_demo_json_runs_offline(tmp_path: Path) -> None:
    out = json.loads(tg("demo", "--json", "--db", f"sqlite:///{tmp_path / 'd.db'}").stdout)
    assert out["status"] == "completed" and out["chain_of_thought"] == "surface"
    assert out["tasks"][0]["output"]
    assert out["tasks"][0]["reasoning"], "the local owner sees the demo's reasoning"


def test_demo_human_output_uses_default_store(tmp_path: Path) -> None:
    proc = tg("demo", env={"XDG_DATA_HOME": str(tmp_path / "data"), "COLUMNS": "200"})
    assert "answer" in proc.stdout
    assert "visible steps from: narration, phases" in proc.stdout
    assert "Reasoning (provider summary) · model turn 1" in proc.stdout  # Claude 4+ summarizes
    assert "Raw reasoning" not in proc.stdout
    assert "↳ Looking up its largest city" in proc.stdout
    assert "Steps shown came from notes the agent wrote for you (3)" in proc.stdout
    assert list((tmp_path / "data").rglob("thoughtgate.db")), "demo records in the default store"


def test_demo_suggests_a_command_that_survives_a_narrow_terminal(tmp_path: Path) -> None:
    """The command the demo suggests is one line however narrow the terminal: copied as shown,
    it must run."""
    proc = tg("demo", env={"XDG_DATA_HOME": str(tmp_path / "data"), "COLUMNS": "60"})
    hint = [line for line in proc.stdout.splitlines() if "thoughtgate events run_" in line]
    assert len(hint) == 1 and hint[0].rstrip().endswith("--view-as viewer"), proc.stdout
    # and the first line names the emulator's URL and the store's path unbroken
    assert re.search(
        r"via the emulator at http://127\.0\.0\.1:\d+ · store sqlite:///\S+", proc.stdout
    )


def test_reads_of_a_store_that_does_not_exist_create_nothing_and_say_so(tmp_path: Path) -> None:
    """A mistyped --db path is visible: no runs listed with a note naming it, a run id is an
    unknown run (exit 2); neither the file nor its directory appears."""
    where = tmp_path / "nodir"
    path = where / "typo.db"
    db = f"sqlite:///{path}"
    wide = {"COLUMNS": "400"}
    listed = tg("runs", "--db", db, "--json", env=wide)
    assert json.loads(listed.stdout) == []
    assert f"no thoughtgate store at {path} yet: nothing has been recorded there" in listed.stderr
    table = tg("runs", "--db", db, env=wide)
    assert table.stdout == "" and f"no thoughtgate store at {path}" in table.stderr
    for args in (["status"], ["events"], ["events", "--follow"], ["trace"]):
        proc = tg(args[0], "run_abc", *args[1:], "--db", db, check=False, env=wide)
        assert proc.returncode == 2, (args, proc.stderr)
        assert f"no thoughtgate store at {path}: run 'run_abc' not found" in proc.stderr
        assert "Traceback" not in proc.stderr
    assert not where.exists()
    # a write still creates it, and reads then see what it recorded, with no note
    run_id = run_json(db)["run_id"]
    after = tg("runs", "--db", db, "--json")
    assert [r["run_id"] for r in json.loads(after.stdout)] == [run_id]
    assert "no thoughtgate store" not in after.stderr
    assert tg("status", run_id, "--db", db, "--json").returncode == 0


def test_keys_list_and_revoke_on_a_store_that_does_not_exist_create_nothing(
    tmp_path: Path,
) -> None:
    """``keys list`` is a listing, as ``runs``: no keys, with a note naming the path; revoking a
    key there is a key not found (exit 2) naming it. Only ``keys create`` makes the store."""
    where = tmp_path / "nodir"
    path = where / "typo.db"
    db = f"sqlite:///{path}"
    wide = {"COLUMNS": "400"}
    listed = tg("keys", "list", "--db", db, "--json", env=wide)
    assert json.loads(listed.stdout) == []
    assert f"no thoughtgate store at {path} yet: nothing has been recorded there" in listed.stderr
    table = tg("keys", "list", "--db", db, env=wide)
    assert table.stdout == "" and f"no thoughtgate store at {path}" in table.stderr
    revoked = tg("keys", "revoke", "ci", "--db", db, check=False, env=wide)
    assert revoked.returncode == 2, revoked.stderr
    assert f"no thoughtgate store at {path}: key 'ci' not found there" in revoked.stderr
    assert "Traceback" not in revoked.stderr
    assert not where.exists()
    # a role below admin is refused before the store is looked at, as on a store that exists
    viewer = tmp_path / "viewer.toml"
    viewer.write_text('[access]\nlocal_role = "viewer"\n', encoding="utf-8")
    denied = tg("keys", "list", "--db", db, "--config", str(viewer), check=False, env=wide)
    assert denied.returncode == 2 and "managing API keys" in denied.stderr
    assert not where.exists()
    # creating a key creates the store; the listing then shows it, with no note
    tg("keys", "create", "--role", "viewer", "--name", "ci", "--db", db)
    after = tg("keys", "list", "--db", db, "--json")
    assert [k["name"] for k in json.loads(after.stdout)] == ["ci"]
    assert "no thoughtgate store" not in after.stderr
    assert tg("keys", "revoke", "ci", "--db", db).returncode == 0


def test_resume_of_a_run_in_a_store_that_does_not_exist_creates_nothing(tmp_path: Path) -> None:
    where = tmp_path / "nodir"
    path = where / "typo.db"
    wide = {"COLUMNS": "400"}
    for json_out in ([], ["--json"]):
        proc = tg(
            "resume", "run_abc", "--db", f"sqlite:///{path}", *json_out, check=False, env=wide
        )
        assert proc.returncode == 2, proc.stderr
        assert f"no thoughtgate store at {path}: run 'run_abc' not found there" in proc.stderr
        assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert not where.exists()


def test_reads_never_create_the_default_or_env_store(tmp_path: Path) -> None:
    data = tmp_path / "data"
    env_db = tmp_path / "env" / "tg.db"
    for env in ({"XDG_DATA_HOME": str(data)}, {"THOUGHTGATE_DB": f"sqlite:///{env_db}"}):
        assert json.loads(tg("runs", "--json", env=env, cwd=tmp_path).stdout) == []
        assert json.loads(tg("keys", "list", "--json", env=env, cwd=tmp_path).stdout) == []
        for args in (["status", "run_abc"], ["resume", "run_abc"], ["keys", "revoke", "ci"]):
            missing = tg(*args, env=env, cwd=tmp_path, check=False)
            assert missing.returncode == 2 and "no thoughtgate store at" in missing.stderr
    assert not data.exists() and not env_db.parent.exists()


@pytest.mark.parametrize(
    ("url", "missing"),
    [
        ("memory://", False),
        ("postgresql://localhost/tg", False),
        ("sqlite:///:memory:", False),
        ("sqlite:///there.db", False),
        ("sqlite:///nowhere.db", True),
        ("sqlite:///nodir/x.db", True),
    ],
)
def test_only_a_sqlite_file_that_is_not_there_is_missing(
    url: str, missing: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from thoughtgate.cli.missing_store import missing_local_store

    monkeypatch.chdir(tmp_path)
    (tmp_path / "there.db").write_bytes(b"")
    found = missing_local_store(url)
    assert (found is not None) == missing
    if missing:
        assert found == Path(url.removeprefix("sqlite:///"))


@pytest.mark.parametrize(
    "args",
    [
        ["events", "{run}"],
        ["status", "{run}"],
        ["events", "{run}", "--json", "--follow"],
        ["run", "piped", "--model", "fake:reasoner", "--cot", "surface"],
    ],
    ids=["events", "status", "events --follow --json", "run"],
)
def test_a_reader_that_stops_reading_ends_the_command_quietly(db: str, args: list[str]) -> None:
    """``thoughtgate events RUN | head -1``: the reader is gone before the command writes. Rich
    raised SystemExit from inside the event loop, which asyncio reported as a traceback ("Task
    exception was never retrieved"). It is exit 1, and nothing on stderr; a run still ends as
    it would (it is not cut short by its reader)."""
    run_id = run_json(db, "--cot", "surface")["run_id"]
    with subprocess.Popen(
        [sys.executable, "-m", "thoughtgate", *(a.format(run=run_id) for a in args), "--db", db],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": SRC, "COLUMNS": "60"},
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # before the interpreter has started: every write finds no reader
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=120) == 1, err
    assert err == "", err
    if args[0] == "run":
        listed = json.loads(tg("runs", "--db", db, "--json", "--search", "piped").stdout)
        assert [r["status"] for r in listed] == ["completed"]
