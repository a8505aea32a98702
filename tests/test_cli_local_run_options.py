"""``run`` and ``resume`` take the same options for a run executed in this process, and hand the
runtime the same value for each (``cli.runs.LocalRun``)."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

from thoughtgate.cli import app
from thoughtgate.cli import runs as cli_runs

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
        "resume": (expected, {"listen_for_tools": True}),
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
