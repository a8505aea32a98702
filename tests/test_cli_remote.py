"""The CLI against a daemon (``--url`` / ``--key``, ``THOUGHTGATE_URL`` / ``THOUGHTGATE_KEY``), and
``events --follow`` live in both modes. Real subprocesses, a real daemon on loopback."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.daemon import (
    HANG_S,
    REPO,
    TOOL_CANARY_TOOLS,
    Daemon,
    cli,
    cli_env,
    markers,
    running_daemon,
)


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    with running_daemon() as d:
        yield d


def tg(
    daemon: Daemon, role: str, *args: str, env_auth: bool = True
) -> subprocess.CompletedProcess[str]:
    """``thoughtgate ARGS`` talking to the daemon as ``role`` (by environment, or by flags)."""
    auth = {"THOUGHTGATE_URL": daemon.base_url, "THOUGHTGATE_KEY": daemon.keys[role]}
    if not env_auth:
        args = (*args, "--url", daemon.base_url, "--key", daemon.keys[role])
        auth = {}
    return _tg(*args, **auth)


def _tg(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``thoughtgate ARGS`` with ``env`` added to a clean environment (no ``THOUGHTGATE_*``)."""
    return subprocess.run(
        [sys.executable, "-m", "thoughtgate", *args],
        env=cli_env(**env),
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=120,
    )


def _json(done: subprocess.CompletedProcess[str]) -> Any:
    assert done.returncode in (0, 3), done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def canary(daemon: Daemon) -> tuple[str, dict[str, str]]:
    """A surface run started through the CLI on the daemon, by a developer."""
    token = uuid.uuid4().hex[:10]
    done = tg(
        daemon, "developer",
        "run", f"canary {token}", "--model", "fake:canary", "--cot", "surface",
        "--tools", "lookup", "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    view = json.loads(done.stdout)
    assert view["status"] == "completed"
    assert markers(token)["reasoning"] in (view["tasks"][0].get("reasoning") or "")
    return view["run_id"], markers(token)


# --------------------------------------------------------------------------- run, status, runs


def test_a_member_runs_on_the_daemon_with_its_tools_and_sees_no_reasoning(daemon: Daemon) -> None:
    token = uuid.uuid4().hex[:10]
    done = tg(
        daemon, "member",
        "run", f"canary {token}", "--model", "fake:canary", "--cot", "surface",
        "--tools", "lookup", "--json", env_auth=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    view = json.loads(done.stdout)
    assert view == daemon.get(f"/v1/runs/{view['run_id']}", "member").json(), "the run view"
    assert view["tasks"][0]["output"] == "The answer is 42."
    assert "reasoning" not in view["tasks"][0]
    assert markers(token)["reasoning"] not in done.stdout + done.stderr
    events = daemon.get(f"/v1/runs/{view['run_id']}/events", "owner").json()["events"]
    assert [e["payload"]["output"] for e in events if e["type"] == "tool.completed"] == [
        f"result for TOOLARG-{token}"
    ], "the daemon's own lookup tool ran"


def test_run_prints_the_run_live_and_exits_with_its_outcome(daemon: Daemon) -> None:
    done = tg(daemon, "member", "run", "hello there", "--model", "fake:echo", "--cot", "surface")
    assert done.returncode == 0, done.stderr
    assert "Echo: hello there" in done.stdout
    assert f"on {daemon.base_url} (as member)" in done.stderr
    # on a narrow terminal too, the line naming the run and the daemon is one line to copy
    auth = {"THOUGHTGATE_URL": daemon.base_url, "THOUGHTGATE_KEY": daemon.keys["member"]}
    narrow = _tg("run", "hello", "--model", "fake:echo", **auth, COLUMNS="60")
    assert narrow.returncode == 0, narrow.stderr
    said = rf"^run run_\w+ on {re.escape(daemon.base_url)} \(as member\)$"
    assert re.search(said, narrow.stderr, re.M), narrow.stderr


def test_approvals_are_answered_from_the_terminal_side(daemon: Daemon) -> None:
    done = tg(
        daemon, "member",
        "run", "go", "--model", "fake:approval", "--tools", "dangerous", "--approve-all", "--json",
    )  # fmt: skip
    view = _json(done)
    assert view["status"] == "completed"
    events = daemon.get(f"/v1/runs/{view['run_id']}/events", "owner").json()["events"]
    responses = [e["payload"] for e in events if e["type"] == "tool.approval_response"]
    assert [(r["decision"], r["by"]) for r in responses] == [("approve", "member-key")]


def test_status_runs_and_short_ids_read_through_the_daemon_filter(
    daemon: Daemon, canary: tuple[str, dict[str, str]]
) -> None:
    run_id, mark = canary
    short = run_id.removeprefix("run_")[:10]
    for role, readable in (("viewer", False), ("developer", True)):
        status = tg(daemon, role, "status", short, "--json")
        view = _json(status)
        assert view == daemon.get(f"/v1/runs/{run_id}", role).json()
        assert (mark["reasoning"] in status.stdout) is readable
        text = tg(daemon, role, "status", run_id)
        assert text.returncode == 0 and "The answer is 42." in text.stdout
        assert (mark["reasoning"] in text.stdout) is readable
    listed = _json(tg(daemon, "viewer", "runs", "--json", "--limit", "500"))
    assert run_id in [v["run_id"] for v in listed]
    missing = tg(daemon, "viewer", "status", "nope-not-a-run")
    assert missing.returncode == 2 and "not found" in missing.stderr


def test_events_and_trace_as_the_key_may_read_them(
    daemon: Daemon, canary: tuple[str, dict[str, str]]
) -> None:
    run_id, mark = canary
    viewer = _json(tg(daemon, "viewer", "events", run_id, "--json"))
    developer = _json(tg(daemon, "developer", "events", run_id, "--json"))
    assert viewer == daemon.get(f"/v1/runs/{run_id}/events", "viewer").json()["events"]
    assert "reasoning.delta" not in {e["type"] for e in viewer}
    assert "reasoning.delta" in {e["type"] for e in developer}
    assert mark["tool"] not in json.dumps(viewer) and mark["carrier"] not in json.dumps(developer)
    page = _json(tg(daemon, "viewer", "events", run_id, "--json", "--after", "2", "--limit", "3"))
    assert all(e["seq"] > 2 for e in page) and len(page) <= 3

    refused = tg(daemon, "viewer", "trace", run_id, "--json")
    assert refused.returncode == 2 and "the trace requires role developer" in refused.stderr
    trace = _json(tg(daemon, "developer", "trace", run_id, "--json"))
    assert [e["type"] for e in trace] == ["worker.completed"]
    assert mark["reasoning"] in json.dumps(trace)


def test_runs_mine_lists_the_runs_the_key_started(daemon: Daemon) -> None:
    started = daemon.start_run({"prompt": "mine, all mine", "model": "fake:echo"}, role="member")
    daemon.wait_done(started)
    mine = _json(tg(daemon, "member", "runs", "--mine", "--json", "--limit", "500"))
    by_api = daemon.get("/v1/runs", "member", params={"key": "me", "limit": 500}).json()["runs"]
    assert mine == by_api and started in [v["run_id"] for v in mine]
    assert _json(tg(daemon, "viewer", "runs", "--mine", "--json")) == [], "a viewer starts none"


def test_resume_asks_the_daemon_and_says_why_a_run_cannot_resume(
    daemon: Daemon, canary: tuple[str, dict[str, str]]
) -> None:
    run_id, mark = canary
    refused = tg(daemon, "member", "resume", run_id[:14], "--json")
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    said = " ".join(refused.stderr.split())
    assert "409" in said and "does not run durable runs, so it resumes none" in said
    assert refused.stdout == "" and mark["reasoning"] not in said
    viewer = tg(daemon, "viewer", "resume", run_id, env_auth=False)
    assert viewer.returncode == 2 and "resuming a run requires role member" in viewer.stderr
    assert daemon.get(f"/v1/runs/{run_id}", "owner").json()["status"] == "completed"


# --------------------------------------------------------------------------- events --follow


def _follow(proc: subprocess.Popen[str]) -> list[dict[str, Any]]:
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def test_events_follow_streams_a_run_live_from_the_daemon_and_resumes_after(
    daemon: Daemon,
) -> None:
    token = uuid.uuid4().hex[:10]
    run_id = daemon.start_run(
        {
            "prompt": f"toolcanary {token}",
            "model": "fake:toolcanary",
            "chain_of_thought": "surface",
            "tools": TOOL_CANARY_TOOLS,
        },
        role="member",
    )
    auth = {"THOUGHTGATE_URL": daemon.base_url, "THOUGHTGATE_KEY": daemon.keys["viewer"]}
    follower = subprocess.Popen(
        [sys.executable, "-m", "thoughtgate", "events", run_id, "--follow", "--json"],
        env=cli_env(**auth),
        cwd=str(REPO),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines = _follow(follower)
    assert daemon.get(f"/v1/runs/{run_id}", "owner").json()["status"] == "completed"
    assert lines == daemon.get(f"/v1/runs/{run_id}/events", "viewer").json()["events"]
    assert lines[-1]["type"] == "run.settlement.completed"
    assert "reasoning.delta" not in {e["type"] for e in lines}
    middle = lines[len(lines) // 2]["seq"]
    resumed = tg(daemon, "viewer", "events", run_id, "--follow", "--json", "--after", str(middle))
    assert resumed.returncode == 0, resumed.stderr
    rest = [json.loads(line) for line in resumed.stdout.splitlines()]
    assert rest == [e for e in lines if e["seq"] > middle]


def test_events_follow_on_the_local_store_while_a_run_records(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'live.db'}"
    said = tmp_path / "runner.out", tmp_path / "runner.err"
    # Files, not pipes: a pipe nobody reads while the run records could fill up and stop the
    # runner, and what the runner said can be read at any time, to explain a failure.
    with said[0].open("w") as out, said[1].open("w") as err:
        runner = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "thoughtgate",
                "run",
                "toolcanary local1",
                "--model",
                "fake:toolcanary",
                "--cot",
                "surface",
                "--db",
                db,
                "--json",
                "--tools",
                "support.served:SERVER_TOOLS",
            ],
            env=cli_env(),
            cwd=str(REPO),
            stdout=out,
            stderr=err,
            text=True,
        )
    try:
        run_id = _first_run(db, runner, said)
        follower = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "thoughtgate",
                "events",
                run_id,
                "--follow",
                "--json",
                "--db",
                db,
                "--view-as",
                "viewer",
            ],
            env=cli_env(),
            cwd=str(REPO),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        lines = _follow(follower)
    finally:
        _wait_for(runner, said)
    assert runner.returncode == 0, _runner_said(runner, said)
    assert lines[-1]["type"] == "run.settlement.completed"
    recorded = json.loads(cli("events", run_id, "--db", db, "--view-as", "viewer", "--json").stdout)
    assert lines == recorded
    assert "reasoning.delta" not in {e["type"] for e in lines}


def _first_run(db: str, runner: subprocess.Popen[str], said: tuple[Path, Path]) -> str:
    """The id of the run ``runner`` records, once ``runs`` lists it. When ``runs`` lists no run
    although the runner had exited before it looked, the run will never come: the test fails at
    once, with the runner's exit code and what it said; a wait that reaches ``HANG_S`` fails
    with what the last ``runs`` said as well."""
    deadline = time.monotonic() + HANG_S
    tries: list[subprocess.CompletedProcess[str]] = []
    while time.monotonic() < deadline:
        ended = runner.poll() is not None  # before the look: a run it recorded is listed
        done = cli("runs", "--db", db, "--json")
        tries.append(done)
        if done.returncode == 0 and json.loads(done.stdout):
            return str(json.loads(done.stdout)[0]["run_id"])
        if ended and done.returncode == 0:
            raise AssertionError(
                "the runner exited without recording its run; "
                f"{_runner_said(runner, said)}; {_runs_said(tries)}"
            )
        time.sleep(0.05)
    raise AssertionError(
        f"the run was never recorded in {HANG_S:g} s; {_runner_said(runner, said)}; "
        f"{_runs_said(tries)}"
    )


def _wait_for(runner: subprocess.Popen[str], said: tuple[Path, Path]) -> None:
    """Wait for the runner to exit; one that does not within a minute is stopped (nothing
    outlives the test) and fails it with what it said."""
    try:
        runner.wait(timeout=60)
    except subprocess.TimeoutExpired:
        runner.kill()
        runner.wait()
        raise AssertionError(f"the runner did not exit; {_runner_said(runner, said)}") from None


def _runner_said(runner: subprocess.Popen[str], said: tuple[Path, Path]) -> str:
    state = "is still running" if runner.poll() is None else f"exited {runner.returncode}"
    out, err = (path.read_text(encoding="utf-8", errors="replace") for path in said)
    return f"the runner {state}, stderr: {err[-4000:]!r}, stdout: {out[-2000:]!r}"


def _runs_said(tries: list[subprocess.CompletedProcess[str]]) -> str:
    failed = [t for t in tries if t.returncode != 0]
    last = tries[-1] if tries else None
    shown = (
        "no runs call returned"
        if last is None
        else (
            f"the last of {len(tries)} runs calls exited {last.returncode}, "
            f"stdout {last.stdout[-500:]!r}, stderr {last.stderr[-2000:]!r}"
        )
    )
    if failed and failed[-1] is not last:
        shown += f"; {len(failed)} failed, the last with stderr {failed[-1].stderr[-2000:]!r}"
    return shown


# --------------------------------------------------------------------------- usage errors


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (("runs", "--url", "http://127.0.0.1:9"), {}, "needs an API key"),
        (("runs", "--key", "tg_x"), {}, "--key needs --url (or THOUGHTGATE_URL)"),
        (("runs", "--db", "memory://"), {"THOUGHTGATE_URL": "http://x", "THOUGHTGATE_KEY": "k"}, "--db cannot be used with --url"),
        (("status", "r", "--view-as", "viewer"), {"THOUGHTGATE_URL": "http://x", "THOUGHTGATE_KEY": "k"}, "--view-as cannot be used"),
        (("run", "x", "--tools", "mod:attr"), {"THOUGHTGATE_URL": "http://x", "THOUGHTGATE_KEY": "k"}, "name tools registered on the daemon"),
        (("run", "x", "--base-url", "http://y"), {"THOUGHTGATE_URL": "http://x", "THOUGHTGATE_KEY": "k"}, "provider settings"),
        (("resume", "r", "--key", "tg_x"), {}, "--key needs --url (or THOUGHTGATE_URL)"),
        (("resume", "r", "--url", "http://127.0.0.1:9"), {}, "needs an API key"),
        (("resume", "r", "--tools", "mod:attr"), {"THOUGHTGATE_URL": "http://x", "THOUGHTGATE_KEY": "k"}, "--tools cannot be used with --url: the daemon resumes the run with the tools it registered"),
        (("resume", "r", "--tools", "lookup"), {"THOUGHTGATE_URL": "http://x", "THOUGHTGATE_KEY": "k"}, "--tools cannot be used with --url"),
        (("resume", "r", "--api-key", "sk"), {"THOUGHTGATE_URL": "http://x", "THOUGHTGATE_KEY": "k"}, "--api-key cannot be used with --url: the daemon's provider keys apply"),
        (("resume", "r", "--db", "memory://"), {"THOUGHTGATE_URL": "http://x", "THOUGHTGATE_KEY": "k"}, "--db cannot be used with --url"),
        (("resume", "r", "--view-as", "viewer"), {"THOUGHTGATE_URL": "http://x", "THOUGHTGATE_KEY": "k"}, "--view-as cannot be used"),
    ],
)  # fmt: skip
def test_what_a_daemon_decides_is_refused_with_a_usage_error(
    args: tuple[str, ...], env: dict[str, str], message: str
) -> None:
    done = _tg(*args, **env)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert message in " ".join(done.stderr.split())


def test_a_daemon_that_cannot_be_reached_is_one_clear_error() -> None:
    env = {"THOUGHTGATE_URL": "http://127.0.0.1:9", "THOUGHTGATE_KEY": "tg_x"}
    done = subprocess.run(
        [sys.executable, "-m", "thoughtgate", "runs"],
        env={**cli_env(**env), "PATH": os.environ.get("PATH", "")},
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and "cannot reach the daemon" in done.stderr


# --------------------------------------------------------------------------- a daemon's address exported (ADR 0162)


def _daemon_key_names(daemon: Daemon) -> dict[str, str | None]:
    keys = daemon.get("/v1/keys", "owner").json()["keys"]
    return {k["name"]: k["revoked_at"] for k in keys}


def test_keys_with_thoughtgate_url_exported_act_on_that_daemon(
    daemon: Daemon, tmp_path: Path
) -> None:
    name = f"exported-{uuid.uuid4().hex[:8]}"
    db = f"sqlite:///{tmp_path / 'local.db'}"
    env = {"THOUGHTGATE_URL": daemon.base_url, "THOUGHTGATE_KEY": daemon.keys["admin"]}
    created = _tg("keys", "create", "--role", "viewer", "--name", name, "--json", **env)
    assert created.returncode == 0, created.stderr
    key = json.loads(created.stdout)["key"]
    assert name in _daemon_key_names(daemon), "the key was made on the daemon"
    assert (
        daemon.get("/v1/me", None, headers={"Authorization": f"Bearer {key}"}).json()["role"]
        == "viewer"
    ), "and the daemon takes it"
    listed = _tg("keys", "list", "--json", **env)
    assert listed.returncode == 0, listed.stderr
    assert name in {k["name"] for k in json.loads(listed.stdout)}
    shown = _tg("keys", "list", **env, COLUMNS="200")
    assert name in shown.stdout
    revoked = _tg("keys", "revoke", name, **env)
    assert revoked.returncode == 0, revoked.stderr
    assert f"on {daemon.base_url}" in revoked.stderr
    assert _daemon_key_names(daemon)[name] is not None, "revoked on the daemon"
    # --local: the local store, on purpose; the daemon's keys are untouched
    local_name = f"local-{uuid.uuid4().hex[:8]}"
    made = _tg("keys", "create", "--role", "viewer", "--name", local_name, "--local",
                  "--db", db, **env)  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert local_name not in _daemon_key_names(daemon)
    assert local_name in _tg("keys", "list", "--local", "--db", db, **env, COLUMNS="200").stdout
    # a member's key is refused by the daemon (admin and above), as locally
    member = {**env, "THOUGHTGATE_KEY": daemon.keys["member"]}
    refused = _tg("keys", "list", **member)
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    # in the local store's words, with the key's role (the daemon's 403 is generic)
    assert refused.stderr.strip() == (
        "error: managing API keys requires role admin or above; this key's role is member"
    )
    # an admin's key may not make an owner's: said so, not "your role does not allow this"
    above = _tg("keys", "create", "--role", "owner", "--name", f"o-{uuid.uuid4().hex[:8]}", **env)
    assert above.returncode == 2, (above.stdout, above.stderr)
    assert above.stderr.strip() == (
        "error: a key cannot be given a role above its creator's; this key's role is admin"
    )


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (("keys", "list", "--local", "--url", "http://x"), {}, "--local and --url contradict"),
        (("keys", "list", "--db", "memory://"), {"THOUGHTGATE_URL": "http://x", "THOUGHTGATE_KEY": "k"}, "--db cannot be used with --url"),
        (("keys", "create", "--role", "viewer", "--name", "n"), {"THOUGHTGATE_URL": "http://x"}, "keys create --local"),
        (("check-index", "--db", "memory://"), {"THOUGHTGATE_URL": "http://x"}, "THOUGHTGATE_URL is set (http://x)"),
        (("check-index", "--db", "memory://"), {"THOUGHTGATE_URL": "http://x"}, "Pass --local"),
        (("check-index", "--db", "memory://", "--local", "--url", "http://x"), {}, "check-index cannot be used with --url"),
        (("demo", "--db", "memory://"), {"THOUGHTGATE_URL": "http://x", "THOUGHTGATE_KEY": "k"}, "THOUGHTGATE_URL is set (http://x)"),
        (("demo", "--db", "memory://"), {"THOUGHTGATE_URL": "http://x"}, "or unset THOUGHTGATE_URL"),
        (("demo", "--url", "http://x"), {}, "demo cannot be used with --url"),
    ],
)  # fmt: skip
def test_a_local_only_command_refuses_an_exported_daemon_address(
    args: tuple[str, ...], env: dict[str, str], message: str
) -> None:
    done = _tg(*args, **env)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert message in " ".join(done.stderr.split())
    assert done.stdout == "", "nothing was done locally"


def test_local_runs_check_index_and_demo_on_the_local_store_despite_the_address(
    tmp_path: Path,
) -> None:
    db = f"sqlite:///{tmp_path / 'local.db'}"
    env = {"THOUGHTGATE_URL": "http://127.0.0.1:9", "THOUGHTGATE_KEY": "k"}
    demo = _tg("demo", "--local", "--db", db, "--json", **env)
    assert demo.returncode == 0, demo.stderr
    run_id = json.loads(demo.stdout)["run_id"]
    checked = _tg("check-index", "--local", "--db", db, "--json", **env)
    assert checked.returncode == 0, checked.stderr
    assert json.loads(checked.stdout)["checked"] == 1
    assert run_id
