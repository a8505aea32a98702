"""Options several commands share reach each of them alike: ``run`` and ``resume`` hand the runtime
one ``cli.runs.LocalRun``, and every command that reads runs gets one ``cli.options.ReadOptions``."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

from thoughtgate.cli import app
from thoughtgate.cli import runs as cli_runs
from thoughtgate.cli.options import ReadOptions

SHARED = [
    "--base-url",
    "http://127.0.0.1:9/v1",
    "--api-key",
    "sk-test",
    "--tools",
    "tools_a:one",
    "--tools",
    "tools_b:two",
    "--approve-all",
    "--view-as",
    "viewer",
    "--db",
    "memory://",
    "--config",
    "thoughtgate-test.toml",
    "--json",
]
LOCAL = {"THOUGHTGATE_URL": None, "THOUGHTGATE_KEY": None}


@pytest.mark.unit
def test_run_and_resume_pass_every_shared_option_through_alike(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: dict[str, tuple[cli_runs.LocalRun, dict[str, Any]]] = {}

    def fake(body: Any, options: cli_runs.LocalRun, **kw: Any) -> str:
        seen[body.__qualname__.split(".")[-3]] = (options, kw)
        return "completed"

    monkeypatch.setattr(cli_runs, "_local_command", fake)
    runner = CliRunner()
    for args in (["run", "Hello?", *SHARED], ["resume", "run_abc", *SHARED]):
        result = runner.invoke(app, args, env=LOCAL)
        assert result.exit_code == 0, result.output
    expected = cli_runs.LocalRun(
        base_url="http://127.0.0.1:9/v1",
        api_key="sk-test",
        tools=["tools_a:one", "tools_b:two"],
        approve_all=True,
        view_as="viewer",
        db="memory://",
        config="thoughtgate-test.toml",
        json_out=True,
    )
    assert seen == {
        "run": (expected, {}),
        "resume": (expected, {"listen_for_tools": True, "recorded_run": "run_abc"}),
    }


@pytest.mark.unit
def test_run_and_resume_defaults_are_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[cli_runs.LocalRun] = []

    def fake(body: Any, options: cli_runs.LocalRun, **kw: Any) -> str:
        seen.append(options)
        return "completed"

    monkeypatch.setattr(cli_runs, "_local_command", fake)
    runner = CliRunner()
    assert runner.invoke(app, ["run", "Hello?"], env=LOCAL).exit_code == 0
    assert runner.invoke(app, ["resume", "run_abc"], env=LOCAL).exit_code == 0
    none = cli_runs.LocalRun(None, None, None, False, None, None, None, False)
    assert seen == [none, none]


READ = ["--view-as", "viewer", "--db", "memory://", "--config", "tg.toml", "--json"]
DAEMON = ["--url", "http://127.0.0.1:9", "--key", "tg_key"]


@pytest.mark.unit
@pytest.mark.parametrize(
    "args",
    [
        ["status", "run_abc"],
        ["runs", "--limit", "3"],
        ["events", "run_abc", "--after", "2"],
        ["trace", "run_abc"],
    ],
)
def test_every_reading_command_takes_the_read_options_last_and_passes_them_on(
    monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    seen: list[ReadOptions] = []
    monkeypatch.setattr(cli_runs, "read_command", lambda body, read: seen.append(read))
    runner = CliRunner()
    assert runner.invoke(app, [*args, *READ, *DAEMON], env=LOCAL).exit_code == 0
    assert runner.invoke(app, args, env=LOCAL).exit_code == 0
    assert seen == [
        ReadOptions("viewer", "memory://", "tg.toml", True, "http://127.0.0.1:9", "tg_key"),
        ReadOptions(None, None, None, False, None, None),
    ]
    assert "--url" in runner.invoke(app, [args[0], "--help"], env=LOCAL).output


@pytest.mark.unit
def test_run_asks_about_the_daemon_with_its_url_and_key(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[str | None, str | None]] = []

    def wants(url: str | None, key: str | None) -> bool:
        asked.append((url, key))
        return False  # then it runs here, which the fake below stands for

    monkeypatch.setattr(cli_runs, "wants_daemon", wants)
    monkeypatch.setattr(cli_runs, "_local_command", lambda body, options, **kw: "completed")
    result = CliRunner().invoke(app, ["run", "Hello?", *DAEMON], env=LOCAL)
    assert result.exit_code == 0, result.output
    assert asked == [("http://127.0.0.1:9", "tg_key")]
