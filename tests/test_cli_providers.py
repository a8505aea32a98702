"""``thoughtgate emulate`` and ``thoughtgate smoke`` as a user runs them."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from support.daemon import HANG_S, ctrl_c_reaches_children

from thoughtgate.testing.emulator import Emulator, serve_emulator
from thoughtgate.testing.emulator.scenarios import builtin_scenarios

SRC = str(Path(__file__).resolve().parents[1] / "src")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_emulate_serves_until_interrupted() -> None:
    port = free_port()
    with ctrl_c_reaches_children():  # it is stopped with Ctrl-C however pytest was started
        proc = subprocess.Popen(
            [sys.executable, "-m", "thoughtgate", "emulate", "--port", str(port)],
            env={**os.environ, "PYTHONPATH": SRC},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    try:
        deadline = time.monotonic() + HANG_S
        while True:
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "emulator did not come up"
                time.sleep(0.1)
        assert "tool-loop" in health.json()["scenarios"]
        reply = httpx.post(
            f"http://127.0.0.1:{port}/v1/messages",
            headers={"x-api-key": "any", "anthropic-version": "2023-06-01"},
            json={
                "model": "claude-sonnet-4-5",
                "max_tokens": 100,
                "messages": [{"role": "user", "content": "hi"}],
            },
            timeout=5,
        )
        assert reply.status_code == 200 and reply.json()["type"] == "message"
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=HANG_S)  # and the pipes are closed


def _smoke_against_the_emulator(
    scenario: str, model: str, *args: str, columns: int = 400
) -> subprocess.CompletedProcess[str]:
    """``thoughtgate smoke --model MODEL`` against the emulator, ``scenario`` its default."""
    emulator = Emulator()
    for each in builtin_scenarios().values():
        emulator.add(each)
    emulator.default = scenario
    with serve_emulator(emulator) as server:
        return subprocess.run(
            [
                *(sys.executable, "-m", "thoughtgate", "smoke", "--model", model),
                *("--base-url", server.url, "--api-key", "x", *args),
            ],
            env={**os.environ, "PYTHONPATH": SRC, "COLUMNS": str(columns)},
            capture_output=True,
            text=True,
            timeout=60,
        )


def test_smoke_reports_each_capability_against_the_emulator() -> None:
    """The emulator's Claude returns raw reasoning, no summary: every request answered, and the
    one check not proven is one the adapter does not claim for Claude either -- exit 0, the
    summary line (on stderr beside ``--json``) names it as not claimed."""
    proc = _smoke_against_the_emulator("smoke", "anthropic:claude-sonnet-4-5", "--json")
    assert proc.returncode == 0, proc.stderr
    said = "smoke: 8 of 9 checks proven; not claimed for this model: reasoning_summary"
    assert said in proc.stderr
    results = {r["name"]: r for r in json.loads(proc.stdout)}
    assert results["reasoning_summary"]["proven"] or results["reasoning_text"]["proven"]
    assert results["tools"]["proven"] and results["continuity"]["proven"]
    assert all(r["detail"] for r in results.values())
    # which rules of the model's endpoint row were proven live
    assert results["rule.hidden_switch"]["proven"], results["rule.hidden_switch"]
    assert results["rule.send_back"]["proven"] and results["rule.reasoning_params"]["proven"]


def test_smoke_of_a_model_that_thinks_unasked_names_the_switch_it_lacks_and_exits_0() -> None:
    """gpt-5's row says the model reasons unasked (no hidden switch): the hidden check is not
    proven, as the row says, so it is named but fails nothing."""
    proc = _smoke_against_the_emulator("smoke", "openai:gpt-5")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert last == (
        "smoke: 7 of 9 checks proven; not claimed for this model: reasoning_summary,"
        " rule.hidden_switch"
    )
    hidden = next(line for line in proc.stdout.splitlines() if line.startswith("rule.hidden"))
    assert "not claimed" in hidden and "the model thinks unasked" in hidden


def test_smoke_exits_5_when_the_provider_answers_but_a_claimed_check_fails() -> None:
    """The emulator answers without calling the offered tool: every request was answered, but
    tools (claimed for Claude) and what needs a tool loop are not proven -- exit 5, named, on
    a last line a script can read whole however narrow the terminal."""
    proc = _smoke_against_the_emulator(
        "summary-and-answer", "anthropic:claude-sonnet-4-5", columns=60
    )
    assert proc.returncode == 5, proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert last == (
        "smoke: 5 of 9 checks proven; not proven: tools, continuity, rule.send_back;"
        " not claimed for this model: reasoning_summary"
    )


def test_smoke_without_a_key_says_which_variable() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "thoughtgate", "smoke", "--model", "anthropic:claude-sonnet-4-5"],
        env={
            **{k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"},
            "PYTHONPATH": SRC,
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "ANTHROPIC_API_KEY" in proc.stderr


def test_smoke_against_a_provider_that_fails_says_what_it_said() -> None:
    """Each failed check quotes the provider's error as it is -- its ``[provider status type]``
    prefix is text, not terminal markup -- and the hidden check says which request failed (the
    model, named after the scenario, is one the endpoint rules know no switch for)."""
    proc = _smoke_against_the_emulator("overloaded", "anthropic:overloaded")
    assert proc.returncode == 1, proc.stderr  # nothing was proven: not a success
    lines = {line.split()[0]: line for line in proc.stdout.splitlines() if line.strip()}
    assert lines["smoke:"].startswith("smoke: 0 of 9 checks proven; 9 could not be made")
    assert "the request failed: [anthropic 529 overloaded_error] " in lines["streaming"]
    hidden = lines["rule.hidden_switch"]
    assert "the hidden request (no switch in the row " in hidden, hidden
    assert "None" not in hidden and "[anthropic 529 overloaded_error]" in hidden


def test_smoke_against_an_unreachable_provider_exits_1_and_says_nothing_was_proven() -> None:
    """A base URL where nothing listens: no check could be made, and the exit code says so."""
    port = free_port()  # closed again: nothing listens there
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "thoughtgate", "smoke"),
            *("--model", "anthropic:claude-sonnet-4-5", "--api-key", "x"),
            *("--base-url", f"http://127.0.0.1:{port}"),
        ],
        env={**os.environ, "PYTHONPATH": SRC, "COLUMNS": "400"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    last = proc.stdout.strip().splitlines()[-1]
    assert last == (
        "smoke: 0 of 9 checks proven; 9 could not be made (a request to the provider failed)"
    ), last
    assert "could not connect" in proc.stdout


def test_smoke_json_keeps_its_document_and_marks_the_checks_it_could_not_make() -> None:
    port = free_port()
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "thoughtgate", "smoke", "--json"),
            *("--model", "anthropic:claude-sonnet-4-5", "--api-key", "x"),
            *("--base-url", f"http://127.0.0.1:{port}"),
        ],
        env={**os.environ, "PYTHONPATH": SRC},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    results = json.loads(proc.stdout)
    assert results and all(not r["proven"] and r["unreached"] for r in results)
    assert "smoke: 0 of 9 checks proven" in proc.stderr
