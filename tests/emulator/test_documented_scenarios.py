"""Every built-in scenario does what docs/emulator.md says it does, and a request that names an
unknown scenario is refused with the list of known ones (never silently answered by another)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from thoughtgate.testing.emulator import Emulator, EmulatorServer, serve_emulator
from thoughtgate.testing.emulator.scenarios import builtin_scenarios

HEADERS = {"x-api-key": "any", "anthropic-version": "2023-06-01"}
THINKING = {"type": "enabled", "budget_tokens": 1024}
DOCS = Path(__file__).resolve().parents[2] / "docs" / "emulator.md"


def documented() -> set[str]:
    """The names in docs/emulator.md's "Built-in scenarios" paragraph."""
    text = DOCS.read_text(encoding="utf-8").split("Built-in scenarios", 1)[1].split("\n\n", 1)[0]
    return set(re.findall(r"(?:: |,\s+)`([a-z-]+)`", text))


@pytest.fixture
def server() -> Iterator[EmulatorServer]:
    emulator = Emulator()
    for scenario in builtin_scenarios().values():
        emulator.add(scenario)
    with serve_emulator(emulator) as running:
        yield running


def messages(
    server: EmulatorServer, scenario: str, *, history: list[dict[str, Any]] | None = None, **kw: Any
) -> httpx.Response:
    body: dict[str, Any] = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 2048,
        "messages": history or [{"role": "user", "content": "Hi"}],
        **kw,
    }
    return httpx.post(
        f"{server.url}/v1/messages",
        json=body,
        headers={**HEADERS, "x-emulator-scenario": scenario},
        timeout=10,
    )


def blocks(response: httpx.Response) -> list[str]:
    assert response.status_code == 200, response.text
    return [b["type"] for b in response.json()["content"]]


def test_the_docs_list_every_built_in_scenario() -> None:
    assert set(builtin_scenarios()) == documented()


def test_think_and_answer(server: EmulatorServer) -> None:
    assert blocks(messages(server, "think-and-answer", thinking=THINKING)) == ["thinking", "text"]
    assert blocks(messages(server, "think-and-answer")) == ["text"], "no thinking unless asked"


def test_summary_and_answer(server: EmulatorServer) -> None:
    response = messages(server, "summary-and-answer", thinking=THINKING)
    assert blocks(response) == ["thinking", "text"]
    assert "Considering scattering" in response.json()["content"][0]["thinking"]


def test_redacted(server: EmulatorServer) -> None:
    response = messages(server, "redacted", thinking=THINKING)
    assert blocks(response) == ["redacted_thinking", "thinking", "text"]


def test_smoke_answers_calls_a_tool_then_reports_its_number(server: EmulatorServer) -> None:
    tools = [{"name": "get_secret_number", "description": "n", "input_schema": {"type": "object"}}]
    first = messages(server, "smoke", tools=tools)
    content = first.json()["content"]
    assert [b["type"] for b in content] == ["text", "tool_use"]
    history = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": content},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": content[1]["id"], "content": "4817"}
            ],
        },
    ]
    assert (
        "4817"
        in messages(server, "smoke", history=history, tools=tools).json()["content"][-1]["text"]
    )


@pytest.mark.parametrize(
    ("scenario", "narrated"),
    [
        ("tool-loop", [[], []]),
        (
            "narrated-tool-loop",
            [
                ["Checking your profile for your country"],
                ["Found your country in your profile.", "Looking up its largest city"],
            ],
        ),
    ],
)
def test_tool_loop_is_three_turns_two_tool_calls_then_the_answer(
    server: EmulatorServer, scenario: str, narrated: list[list[str]]
) -> None:
    """``narrated-tool-loop`` is the same loop with ``visible_step`` calls beside the real ones."""
    history: list[dict[str, Any]] = [{"role": "user", "content": "Largest city?"}]
    tools = [
        {"name": n, "description": n, "input_schema": {"type": "object"}}
        for n in ("get_country", "largest_city", "visible_step")
    ]
    called, steps = [], []
    for _ in range(2):
        response = messages(server, scenario, history=history, tools=tools)
        assert response.json()["stop_reason"] == "tool_use"
        content = response.json()["content"]
        uses = [b for b in content if b["type"] == "tool_use"]
        called += [u["name"] for u in uses if u["name"] != "visible_step"]
        steps.append([u["input"]["summary"] for u in uses if u["name"] == "visible_step"])
        results = [{"type": "tool_result", "tool_use_id": u["id"], "content": "ok"} for u in uses]
        history += [
            {"role": "assistant", "content": content},
            {"role": "user", "content": results},
        ]
    final = messages(server, scenario, history=history, tools=tools)
    assert called == ["get_country", "largest_city"]
    assert steps == narrated
    assert final.json()["stop_reason"] == "end_turn"
    assert "Mexico City" in final.json()["content"][-1]["text"]


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/chat/completions", "/v1/responses"])
def test_overloaded_is_always_529(server: EmulatorServer, path: str) -> None:
    body: dict[str, Any] = {"model": "m", "max_tokens": 64}
    body |= {"input": "Hi"} if path.endswith("responses") else {}
    body |= {"messages": [{"role": "user", "content": "Hi"}]} if "responses" not in path else {}
    headers = {**HEADERS, "authorization": "Bearer any", "x-emulator-scenario": "overloaded"}
    statuses = [
        httpx.post(f"{server.url}{path}", json=body, headers=headers, timeout=10).status_code
        for _ in range(4)
    ]
    assert statuses == [529] * 4, "every attempt, however many retries a client makes"


def test_flaky_fails_once_with_retry_after_then_succeeds(server: EmulatorServer) -> None:
    first = messages(server, "flaky")
    assert first.status_code == 529 and first.headers["retry-after"]
    assert blocks(messages(server, "flaky")) == ["text"]


def test_stream_error_sends_an_error_event_inside_a_200_stream(server: EmulatorServer) -> None:
    response = messages(server, "stream-error", thinking=THINKING, stream=True)
    assert response.status_code == 200
    assert "event: error" in response.text and "overloaded_error" in response.text
    assert "message_stop" not in response.text


def test_cut_drops_the_connection_mid_stream(server: EmulatorServer) -> None:
    with pytest.raises(httpx.HTTPError):
        messages(server, "cut", thinking=THINKING, stream=True)


def test_slow_pauses_the_stream(server: EmulatorServer) -> None:
    started = time.monotonic()
    response = messages(server, "slow", stream=True)
    assert response.status_code == 200 and "Slow answer." in response.text
    assert time.monotonic() - started >= 0.5


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/chat/completions", "/v1/responses"])
def test_an_unknown_scenario_is_a_400_that_lists_the_known_ones(
    server: EmulatorServer, path: str
) -> None:
    response = httpx.post(
        f"{server.url}{path}",
        json={"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "Hi"}]},
        headers={**HEADERS, "authorization": "Bearer any", "x-emulator-scenario": "overload"},
        timeout=10,
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert "unknown x-emulator-scenario 'overload'" in error["message"]
    for name in documented():
        assert name in error["message"]
