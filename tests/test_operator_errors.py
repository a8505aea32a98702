"""What a caller is told when the fault is not theirs, and what a terminal user is told when it is.

A daemon with no key (or no base URL) for a provider answers a run that needs it ``503
provider_not_configured`` in words that say nothing of how the server is set up; its log tells
the operator what to set (ADR 0128). A key the daemon refuses is named as such by the client and
the CLI, and ``run`` checks its daemon and key before it waits for a prompt on standard input.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from support.daemon import REPO, Daemon, agui_input, cli_env, running_daemon
from typer.testing import CliRunner

from thoughtgate.cli import app
from thoughtgate.cli.exit_codes import ExitCode
from thoughtgate.client import DaemonError, ThoughtgateClient
from thoughtgate.config import Config
from thoughtgate.errors import AuthenticationError

NOT_CONFIGURED = "this server is not configured for provider 'anthropic'"
OPERATOR_WORDS = ("ANTHROPIC_API_KEY", "api_key", "emulator", "providers.anthropic")
"""What the operator is told to set, and nothing a caller sees."""

NO_DURABLE_RUNS = {"THOUGHTGATE_DURABILITY__ENABLED": "false"}


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    with running_daemon() as d:
        yield d


def _caller_sees_no_setup(text: str) -> None:
    for word in OPERATOR_WORDS:
        assert word not in text, text


def _runs(daemon: Daemon) -> list[dict[str, Any]]:
    with daemon.client("owner") as c:
        listed: list[dict[str, Any]] = c.get("/v1/runs").json()["runs"]
    return listed


# --------------------------------------------------------------------------- the daemon


@pytest.mark.inprocess
@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/runs", {"prompt": "hi", "model": "anthropic:claude-sonnet-4-5"}),
        ("/v1/runs/follow", {"prompt": "hi", "model": "anthropic:claude-sonnet-4-5"}),
        (
            "/v1/runs",
            {
                "prompt": "two steps",
                "model": "fake:echo",
                "tasks": [{"prompt": "a"}, {"prompt": "b", "model": "anthropic:claude-haiku-4-5"}],
            },
        ),
        ("/v1/agui", agui_input(model="anthropic:claude-sonnet-4-5")),
    ],
    ids=["start", "follow", "a-task's-model", "agui"],
)
def test_a_provider_without_a_key_is_the_servers_503_in_neutral_words(
    daemon: Daemon, caplog: pytest.LogCaptureFixture, path: str, body: dict[str, Any]
) -> None:
    """Not the caller's bad request (it was a ``400`` quoting the setting and variable to set):
    a ``503`` saying only that the server is not configured for the provider; no run is
    created, so none is left ``running``; the operator's log names what to set."""
    before = len(_runs(daemon))
    with caplog.at_level(logging.WARNING), daemon.client("member") as c:
        answer = c.post(path, json=body)
    assert answer.status_code == 503, answer.text
    error = answer.json()["error"]
    assert error == {"code": "provider_not_configured", "message": NOT_CONFIGURED}
    _caller_sees_no_setup(answer.text)
    assert len(_runs(daemon)) == before
    logged = [r.getMessage() for r in caplog.records if r.name == "thoughtgate.server"]
    assert any("ANTHROPIC_API_KEY" in line and "anthropic" in line for line in logged), logged


@pytest.mark.inprocess
def test_a_compatible_server_without_a_base_url_is_the_servers_503(
    daemon: Daemon, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING), daemon.client("member") as c:
        answer = c.post("/v1/runs", json={"prompt": "hi", "model": "openai-compatible:qwen3"})
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"]["message"] == (
        "this server is not configured for provider 'openai-compatible'"
    )
    assert "OPENAI_BASE_URL" not in answer.text and "base_url" not in answer.text
    assert any("OPENAI_BASE_URL" in r.getMessage() for r in caplog.records)


@pytest.mark.inprocess
def test_a_run_that_needs_an_unconfigured_provider_later_fails_with_the_public_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A provider built while the run executes (here the operator's summarizer model): the run
    ends ``failed`` with the neutral reason every reader may see, never ``running``, and the
    operator's log names what to set."""
    config = Config.from_mapping(
        {
            "visible_reasoning": {
                "summarizers": ["phases", "model"],
                "summarizer_model": "anthropic:claude-haiku-4-5",
            }
        }
    )
    with caplog.at_level(logging.WARNING), running_daemon(config=config) as daemon:
        run_id = daemon.start_run(
            {"prompt": "hi", "model": "fake:reasoner", "chain_of_thought": "surface"}
        )
        ended = daemon.wait_done(run_id)
        with daemon.client("viewer") as c:
            seen = c.get(f"/v1/runs/{run_id}").text + c.get(f"/v1/runs/{run_id}/events").text
    assert ended["status"] == "failed", ended
    assert ended["error"] == NOT_CONFIGURED
    assert ended["tasks"][0]["error"] == NOT_CONFIGURED
    _caller_sees_no_setup(json.dumps(ended) + seen)
    assert any("ANTHROPIC_API_KEY" in r.getMessage() for r in caplog.records)


# --------------------------------------------------------------------------- the client, the CLI


@pytest.mark.inprocess
async def test_the_python_client_names_an_unconfigured_provider_and_a_refused_key(
    daemon: Daemon,
) -> None:
    async with ThoughtgateClient(daemon.base_url, daemon.keys["member"]) as tg:
        with pytest.raises(DaemonError) as refused:
            await tg.start_run("hi", "anthropic:claude-sonnet-4-5")
    assert refused.value.status == 503 and refused.value.code == "provider_not_configured"
    assert NOT_CONFIGURED in str(refused.value)
    async with ThoughtgateClient(daemon.base_url, "tg_wrong") as tg:
        with pytest.raises(AuthenticationError) as unknown:
            await tg.me()
    assert str(unknown.value).startswith("the daemon refused this key"), unknown.value
    assert "Authorization: Bearer" not in str(unknown.value)


@pytest.mark.inprocess
def test_run_on_a_daemon_without_the_providers_key_says_so_and_exits_1(daemon: Daemon) -> None:
    result = CliRunner().invoke(
        app,
        ["run", "hi", "--model", "anthropic:claude-sonnet-4-5"],
        env={"THOUGHTGATE_URL": daemon.base_url, "THOUGHTGATE_KEY": daemon.keys["member"]},
    )
    assert result.exit_code == ExitCode.FAILED, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert NOT_CONFIGURED in lines[0] and "no run was started" in lines[0], lines
    _caller_sees_no_setup(result.output + result.stderr)


CLIENT_COMMANDS = [
    ["run", "hi", "--model", "fake:echo"],
    ["run", "-", "--model", "fake:echo"],
    ["runs"],
    ["status", "run_x"],
    ["events", "run_x"],
    ["trace", "run_x"],
    ["resume", "run_x"],
]


@pytest.mark.inprocess
@pytest.mark.parametrize("args", CLIENT_COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_a_key_the_daemon_refuses_is_named_as_such_with_the_usage_exit_code(
    daemon: Daemon, args: list[str]
) -> None:
    """The daemon's own words ("authentication required: a valid API key (Authorization: Bearer
    KEY) or live ticket") are for an HTTP caller; the terminal says it was the key given to it,
    and exits 2 as for any usage or access error. ``run -`` says so before it reads a prompt."""
    result = CliRunner().invoke(
        app, [*args, "--url", daemon.base_url, "--key", "tg_wrong"], env=NO_DURABLE_RUNS
    )
    assert result.exit_code == ExitCode.USAGE, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == [
        f"error: the daemon at {daemon.base_url} refused this key (--key or THOUGHTGATE_KEY): "
        "it is unknown or revoked; ask the daemon's operator for one"
    ], result.stderr


def _run_with_input_open(args: list[str], checking: str) -> tuple[int, str]:
    """``thoughtgate run -`` with ``args``, its standard input held open and never written (a
    user who has not typed yet): its exit code and standard error once it ended by itself."""
    process = subprocess.Popen(
        [sys.executable, "-m", "thoughtgate", "run", "-", *args],
        env=cli_env(),
        cwd=str(REPO),
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdin is not None and process.stderr is not None
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise AssertionError(f"run waited for standard input before checking {checking}") from None
    finally:
        process.stdin.close()
    with process.stderr:
        return process.returncode, process.stderr.read()


@pytest.mark.external
@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--url", "localhost:8765", "--key", "k"], "is not a daemon's address"),
        (["--url", "http://127.0.0.1:9"], "needs an API key"),
        (["--key", "k"], "--key needs --url (or THOUGHTGATE_URL)"),
        (["--url", "http://127.0.0.1:9", "--key", "k", "--db", "memory://"], "--db cannot be used"),
    ],
    ids=["bad-url", "no-key", "key-without-url", "local-only-flag"],
)
def test_run_refuses_its_daemon_arguments_before_it_waits_for_a_prompt(
    args: list[str], says: str
) -> None:
    """``run -`` with a wrong ``--url``/``--key`` on a terminal (standard input open, nothing
    typed yet): it says what is wrong at once; it used to wait for the whole prompt first."""
    code, stderr = _run_with_input_open(args, "--url/--key")
    assert code == ExitCode.USAGE, stderr
    assert says in stderr, stderr


@pytest.mark.external
def test_run_refuses_a_wrong_key_before_it_waits_for_a_prompt(daemon: Daemon) -> None:
    code, stderr = _run_with_input_open(["--url", daemon.base_url, "--key", "x"], "the key")
    assert code == ExitCode.USAGE, stderr
    assert "refused this key" in stderr, stderr


@pytest.mark.inprocess
def test_a_prompt_from_standard_input_still_runs_on_the_daemon(daemon: Daemon) -> None:
    result = CliRunner().invoke(
        app,
        [
            "run",
            "-",
            "--model",
            "fake:echo",
            "--url",
            daemon.base_url,
            "--key",
            daemon.keys["member"],
        ],
        input="hello there\n",
        env=NO_DURABLE_RUNS,
    )
    assert result.exit_code == ExitCode.COMPLETED, result.output
    assert "Echo: hello there" in result.stdout


@pytest.mark.unit
def test_an_http_401_for_a_ticket_keeps_the_daemons_words() -> None:
    """Only a refused key is reworded: a ticket's own 401 (expired, forged) says what it says."""
    from thoughtgate.client.errors import raise_for_response

    body = {"error": {"code": "ticket_expired", "message": "the live ticket expired"}}
    response = httpx.Response(401, json=body)
    with pytest.raises(AuthenticationError, match=r"^the live ticket expired$"):
        raise_for_response(response)
