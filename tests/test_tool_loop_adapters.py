"""The agent tool loop through all four adapters against the emulator (issue 4, "done when").

Every test runs the real ``Runtime`` (or the real adapter) against the in-process emulator and looks
at what actually crossed the wire: ``emulator.requests`` for what the adapters sent (and the status
the emulator answered), :class:`~loop_support.TeeTransport` for the exact bytes the emulator sent.

1. a multi-turn tool run completes per adapter and mode, and each later request carries the
   provider's carrier, equal to what the emulator emitted, in the place the API wants it;
2. deliberately broken carriers get the provider's real 400;
3. no rehydration: reasoning markers appear only inside the carrier field, never in a continued
   conversation, never across a model switch (which is recorded as ``continuity.dropped``);
4. streams cut or failed at several points keep the partial turn and settle the run as partial;
5. recording: ``agent.response`` per turn with sizes, ``worker.completed`` with mode, usage, turns
   and timing;
6. the CLI loads user tools and approves them (``--approve-all``, a timeout without a TTY, and an
   interactive "y" on a pseudo-terminal).
"""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from loop_support import (
    ANSWER,
    CASE_BY_ID,
    CASES,
    CLI_ANSWER,
    CLI_MARK,
    CONTINUE_MARK,
    CUT_POINTS,
    LOOP_MARKS,
    MARK,
    Case,
    CutPoint,
    TeeTransport,
    ToolLog,
    answer_scenario,
    cli_scenario,
    emitted_anthropic,
    emitted_compat,
    emitted_openrouter,
    emitted_responses,
    empty_reasoning_scenario,
    has_carrier,
    inside_carrier,
    loop_scenario,
    make_provider,
    marker_paths,
)
from thoughtgate.engine.loop import strip_reasoning
from thoughtgate.engine.turn import stream_llm_turn
from thoughtgate.errors import ProviderHTTPError
from thoughtgate.events.schema import Event, EventType
from thoughtgate.orchestration.runtime import RunRequest, Runtime
from thoughtgate.providers.base import Provider, ReasoningRequest, TurnRequest
from thoughtgate.providers.chat_completions import CHAT_PATH
from thoughtgate.providers.openai_responses import RESPONSES_PATH
from thoughtgate.store.memory import MemoryStore
from thoughtgate.store.records import RunRecord
from thoughtgate.testing.emulator import Emulator, EmulatorServer, serve_emulator
from thoughtgate.types import ContinuityBlock, Message, Part, ToolCallPart, ToolResultPart, Turn

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "What is the largest city in my country?"
CASE_IDS = [c.id for c in CASES]


@pytest.fixture(scope="module")
def server() -> Iterator[EmulatorServer]:
    emulator = Emulator()
    emulator.add(cli_scenario("cli"), default=True)  # the CLI cannot send scenario headers
    for summaries, suffix in ((False, ""), (True, "-summary")):
        emulator.add(loop_scenario(f"loop{suffix}", summaries=summaries))
        emulator.add(answer_scenario(f"answer{suffix}", summaries=summaries))
        for point in CUT_POINTS:
            emulator.add(point.scenario(f"cut-{point.id}{suffix}", summaries=summaries))
    emulator.add(empty_reasoning_scenario("empty-reasoning"))
    with serve_emulator(emulator) as srv:
        yield srv


@pytest.fixture(autouse=True)
def fresh_log(server: EmulatorServer) -> None:
    server.emulator.requests.clear()
    server.emulator.attempts.clear()


def scenario_name(base: str, case: Case) -> str:
    return f"{base}-summary" if case.summaries else base


# --------------------------------------------------------------------------- a rig per test


@dataclass
class Rig:
    """A runtime whose adapters talk to the emulator; ``scenario`` may change between runs."""

    server: EmulatorServer
    scenario: str
    tee: TeeTransport = field(default_factory=TeeTransport)
    tools: ToolLog = field(default_factory=ToolLog)
    runtime: Runtime = field(init=False)

    def __post_init__(self) -> None:
        self.runtime = Runtime(
            MemoryStore(), provider_factory=self.provider, tools=self.tools.registry()
        )

    def provider(self, model: str) -> Provider:
        return make_provider(model, url=self.server.url, scenario=self.scenario, tee=self.tee)

    async def run(
        self, model: str, mode: str, *, history: Sequence[Message] = (), prompt: str = PROMPT
    ) -> tuple[RunRecord, list[Event]]:
        run = await self.runtime.run(
            RunRequest(prompt, model=model, history=history), chain_of_thought=mode
        )
        return run, await self.runtime.store.read(run.run_id)

    @property
    def requests(self) -> list[Any]:
        return self.server.emulator.requests

    def bodies(self) -> list[Any]:
        return [r.body for r in self.requests]


def of_type(events: Sequence[Event], kind: str) -> list[Event]:
    return [e for e in events if e.type == kind]


def assistants(case: Case, body: dict[str, Any]) -> list[Any]:
    if case.carrier == "responses":
        raise AssertionError("Responses bodies have items, not messages")
    return [m for m in body["messages"] if m["role"] == "assistant"]


def as_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def assert_carriers_replayed(case: Case, body: dict[str, Any], responses: list[bytes]) -> None:
    """Each earlier turn's carrier, exactly as the emulator emitted it, where the API wants it."""
    if case.carrier == "responses":
        items = body["input"]
        for raw in responses:
            emitted = emitted_responses(raw)
            assert emitted, "every turn of the scenario reasons"
            for item, follower in emitted:
                at = next(i for i, x in enumerate(items) if x == item)
                assert as_json(items[at]) == as_json(item), "the item goes back byte-identical"
                assert items[at + 1]["id"] == follower, "right before the item that followed it"
        return
    sent = assistants(case, body)
    assert len(sent) == len(responses)
    for message, raw in zip(sent, responses, strict=True):
        if case.carrier == "anthropic":
            blocks = emitted_anthropic(raw)
            head = message["content"][: len(blocks)]
            assert [as_json(b) for b in head] == [as_json(b) for b in blocks]
            rest = message["content"][len(blocks) :]
            assert all(b["type"] not in ("thinking", "redacted_thinking") for b in rest)
            assert rest and rest[-1]["type"] == "tool_use"
        elif case.carrier == "openrouter":
            details = emitted_openrouter(raw)
            assert as_json(message["reasoning_details"]) == as_json(details)
        else:
            assert message["reasoning_content"] == emitted_compat(raw)


# --------------------------------------------------------------------------- 1 + 5: the tool run


@pytest.mark.parametrize("mode", ["surface", "telemetry_only", "hidden"])
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
async def test_multi_turn_tool_run(server: EmulatorServer, case: Case, mode: str) -> None:
    rig = Rig(server, scenario_name("loop", case))
    run, events = await rig.run(case.model, mode)

    assert run.status == "completed" and run.tasks[0].output == ANSWER
    assert rig.tools.calls == [("get_country", {}), ("largest_city", {"country": "Mexico"})]
    assert [r.status for r in rig.requests] == [200, 200, 200], "the emulator accepted every body"
    bodies = rig.bodies()
    assert [x.request for x in rig.tee.exchanges] == bodies
    responses = [bytes(x.response) for x in rig.tee.exchanges]

    # carriers: in the right place, equal to what the emulator emitted; none when hidden
    for k in (1, 2):
        if mode == "hidden":
            assert not has_carrier(case.carrier, bodies[k])
        else:
            assert_carriers_replayed(case, bodies[k], responses[:k])
    # no rehydration: a marker only ever sits inside the carrier field
    for body in bodies:
        for path in marker_paths(body):
            assert inside_carrier(case.carrier, body, path), f"reasoning text at {path}"
    seen = [p for b in bodies for p in marker_paths(b)]
    assert bool(seen) == (mode != "hidden"), "carriers hold reasoning only when it was asked for"

    # recording
    responses_ev = of_type(events, EventType.AGENT_RESPONSE)
    assert [e.payload["turn"] for e in responses_ev] == [0, 1, 2]
    assert all(e.payload["complete"] for e in responses_ev)
    for e, marker in zip(responses_ev, LOOP_MARKS, strict=True):
        if mode == "surface":
            assert e.payload["reasoning"] == marker, "full reasoning, never truncated"
            assert e.payload["reasoning_chars"] == len(marker)
            assert e.payload["reasoning_bytes"] == len(marker.encode()) > len(marker)
        else:
            assert "reasoning" not in e.payload and "continuity" not in e.payload
    assert responses_ev[-1].payload["answer"] == ANSWER
    for e in events:
        if e.type.startswith("message."):
            assert MARK not in as_json(e.payload), "message text carries no reasoning"
    assert bool(of_type(events, EventType.REASONING_DELTA)) == (mode == "surface")

    (worker,) = of_type(events, EventType.WORKER_COMPLETED)
    payload = worker.payload
    assert payload["mode"] == mode and payload["turns"] == 3 and payload["status"] == "completed"
    assert payload["duration_s"] > 0
    usage = payload["usage"]
    assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0
    assert "reasoning_tokens" in usage
    if mode != "hidden":
        assert (usage["reasoning_tokens"] > 0) == case.reasoning_tokens
        trace = payload["trace"]
        assert trace["reasoning"] == "\n\n".join(LOOP_MARKS)
        assert trace["reasoning_bytes"] == len(trace["reasoning"].encode())
        assert trace["continuity"] and {c["model"] for c in trace["continuity"]} == {case.bare}
    else:
        assert "trace" not in payload
    assert run.tasks[0].reasoning == ("\n\n".join(LOOP_MARKS) if mode == "surface" else None)
    assert events[-1].type == EventType.RUN_SETTLEMENT_COMPLETED
    assert events[-1].payload["status"] == "completed"


async def test_deepseek_sends_back_an_empty_reasoning_content(server: EmulatorServer) -> None:
    """A tool-call turn that reasoned nothing still goes back with ``reasoning_content: ""``."""
    rig = Rig(server, "empty-reasoning")
    run, _ = await rig.run(CASE_BY_ID["deepseek"].model, "surface")
    assert run.status == "completed" and run.tasks[0].output == "Mexico."
    assert [r.status for r in rig.requests] == [200, 200]
    (sent,) = [m for m in rig.bodies()[1]["messages"] if m["role"] == "assistant"]
    assert sent["reasoning_content"] == "" and sent["tool_calls"]


# --------------------------------------------------------------------------- 2: broken carriers

Mutation = Callable[[list[Part]], list[Part]]
BodyMutation = Callable[[dict[str, Any]], None]


def edit_block(index: int, change: Callable[[dict[str, Any]], dict[str, Any]]) -> Mutation:
    """Replace the ``index``-th continuity block of the assistant turn by an edited copy."""

    def mutate(parts: list[Part]) -> list[Part]:
        blocks = [p for p in parts if isinstance(p, ContinuityBlock)]
        target = blocks[index]
        edited = replace(target, data=change(json.loads(json.dumps(target.data))))
        return [edited if p is target else p for p in parts]

    return mutate


def drop_blocks(parts: list[Part]) -> list[Part]:
    return [p for p in parts if not isinstance(p, ContinuityBlock)]


def edit_detail(index: int, name: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def change(data: dict[str, Any]) -> dict[str, Any]:
        detail = data["reasoning_details"][index]
        detail[name] = detail[name][:-6] + "EDITED"
        return data

    return change


def anthropic_edit(key: str, value: Callable[[str], str]) -> Callable[[dict[str, Any]], Any]:
    def change(data: dict[str, Any]) -> dict[str, Any]:
        data[key] = value(data[key])
        return data

    return change


def assistant_content(body: dict[str, Any]) -> list[dict[str, Any]]:
    content: list[dict[str, Any]] = body["messages"][1]["content"]
    return content


def drop_thinking(body: dict[str, Any]) -> None:
    body["messages"][1]["content"] = [
        b for b in assistant_content(body) if b["type"] not in ("thinking", "redacted_thinking")
    ]


def text_first(body: dict[str, Any]) -> None:
    content = assistant_content(body)
    text = next(b for b in content if b["type"] == "text")
    body["messages"][1]["content"] = [text, *(b for b in content if b is not text)]


def reasoning_at(body: dict[str, Any]) -> int:
    return next(i for i, x in enumerate(body["input"]) if x.get("type") == "reasoning")


def drop_reasoning_item(body: dict[str, Any]) -> None:
    del body["input"][reasoning_at(body)]


def drop_following_item(body: dict[str, Any]) -> None:
    del body["input"][reasoning_at(body) + 1]


def follower_first(body: dict[str, Any]) -> None:
    i = reasoning_at(body)
    items = body["input"]
    items[i], items[i + 1] = items[i + 1], items[i]


def drop_summary(body: dict[str, Any]) -> None:
    del body["input"][reasoning_at(body)]["summary"]


def null_reasoning_content(body: dict[str, Any]) -> None:
    (message,) = (m for m in body["messages"] if m["role"] == "assistant")
    message["reasoning_content"] = None


@dataclass(frozen=True)
class Breakage:
    """A broken carrier and the provider's answer (``None``: the API does not demand it)."""

    id: str
    case: str
    history: Mutation | None = None
    body: BodyMutation | None = None
    message: str | None = None
    exact: bool = False


ANTHROPIC_EXPECTED = (
    "messages.1.content.0.type: Expected `thinking` or `redacted_thinking`, but found `text`. "
    "When `thinking` is enabled, a final `assistant` message must start with a thinking block"
)
DEEPSEEK_MISSING = "The `reasoning_content` in the thinking mode must be passed back to the API."


def _breakages() -> list[Breakage]:
    out: list[Breakage] = []
    for case in ("anthropic-budget", "anthropic-adaptive"):
        out += [
            Breakage(
                "edit-thinking-text",
                case,
                history=edit_block(0, anthropic_edit("thinking", lambda t: t + " (edited)")),
                message="messages.1.content.0: `thinking` or `redacted_thinking` blocks in the "
                "latest assistant message cannot be modified. These blocks must remain as they "
                "were in the original response.",
                exact=True,
            ),
            Breakage(
                "forge-signature",
                case,
                history=edit_block(0, anthropic_edit("signature", lambda s: "forged")),
                message="messages.1.content.0: Invalid `signature` in `thinking` block",
                exact=True,
            ),
            Breakage(
                "edit-redacted",
                case,
                history=edit_block(1, anthropic_edit("data", lambda d: d[:-8] + "AAAAAAAA")),
                message="messages.1.content.1: `thinking` or `redacted_thinking` blocks in the "
                "latest assistant message cannot be modified.",
            ),
            Breakage("drop-thinking", case, body=drop_thinking, message=ANTHROPIC_EXPECTED),
            Breakage(
                "text-before-thinking",
                case,
                body=text_first,
                message="messages.1.content.0: If an assistant message contains any thinking "
                "blocks, the first block must be thinking or redacted_thinking. Found text.",
                exact=True,
            ),
            # Through the adapter a missing block makes that request go without thinking, as the
            # API's error advises; the emulator then accepts it.
            Breakage("history-without-blocks", case, history=drop_blocks),
        ]
    out += [
        Breakage(
            "drop-details",
            "openrouter-anthropic",
            history=drop_blocks,
            message="Provider returned error: ",
        ),
        Breakage(
            "edit-text-detail",
            "openrouter-anthropic",
            history=edit_block(0, edit_detail(0, "text")),
            message="messages.1.content.0: Invalid `signature` in `thinking` block",
        ),
        Breakage(
            "edit-encrypted-detail",
            "openrouter-anthropic",
            history=edit_block(0, edit_detail(1, "data")),
            message="messages.1.content.1: Invalid `signature` in `thinking` block",
        ),
        Breakage("drop-details", "openrouter-openai", history=drop_blocks),
        Breakage(
            "edit-encrypted-detail",
            "openrouter-openai",
            history=edit_block(0, edit_detail(1, "data")),
            message="could not be verified",
        ),
        Breakage(
            "edit-encrypted-item",
            "responses",
            history=edit_block(
                0,
                lambda d: {
                    **d,
                    "item": {
                        **d["item"],
                        "encrypted_content": d["item"]["encrypted_content"][:-4] + "AAAA",
                    },
                },
            ),
            message="could not be verified.",
        ),
        # Without its reasoning item the adapter sends no item ids, so nothing needs pairing.
        Breakage("history-without-item", "responses", history=drop_blocks),
        Breakage(
            "drop-reasoning-item",
            "responses",
            body=drop_reasoning_item,
            message="' of type 'message' was provided without its required 'reasoning' item: 'rs_",
        ),
        Breakage(
            "drop-following-item",
            "responses",
            body=drop_following_item,
            message="' of type 'reasoning' was provided without its required following item.",
        ),
        Breakage(
            "follower-before-reasoning",
            "responses",
            body=follower_first,
            message="without its required 'reasoning' item",
        ),
        Breakage(
            "reasoning-item-without-summary",
            "responses",
            body=drop_summary,
            message="Missing required parameter: 'input[1].summary'.",
            exact=True,
        ),
        Breakage(
            "omit-reasoning-content",
            "deepseek",
            history=drop_blocks,
            message=DEEPSEEK_MISSING,
            exact=True,
        ),
        Breakage(
            "null-reasoning-content",
            "deepseek",
            body=null_reasoning_content,
            message=DEEPSEEK_MISSING,
            exact=True,
        ),
        Breakage("omit-reasoning-content", "vllm", history=drop_blocks),
        Breakage("omit-reasoning-content", "think-tags", history=drop_blocks),
    ]
    return out


BREAKAGES = _breakages()


async def first_turn(provider: Provider, specs: Any) -> tuple[TurnRequest, Turn, Message]:
    request = TurnRequest(
        [Message.user(PROMPT)], tools=specs, reasoning=ReasoningRequest(True)
    )
    turn = await stream_llm_turn(provider, request)
    results = Message(
        "tool", tuple(ToolResultPart(c.call_id, "Mexico", name=c.name) for c in turn.tool_calls)
    )
    return request, turn, results


async def post_raw(provider: Provider, body: dict[str, Any]) -> None:
    """POST a hand-edited body through the adapter's own HTTP transport (its error mapping)."""
    transport: Any = getattr(provider, "transport", None) or getattr(provider, "_http", None)
    path = getattr(provider, "_path", None) or (
        RESPONSES_PATH if provider.name == "openai" else CHAT_PATH
    )
    async with transport.open(path, body, stream=True) as response:
        async for _ in response.aiter_bytes():
            pass


@pytest.mark.parametrize("breakage", BREAKAGES, ids=[f"{b.case}-{b.id}" for b in BREAKAGES])
async def test_broken_carriers_get_the_providers_real_error(
    server: EmulatorServer, breakage: Breakage
) -> None:
    case = CASE_BY_ID[breakage.case]
    provider = make_provider(
        case.model, url=server.url, scenario=scenario_name("loop", case)
    )
    try:
        request, turn, results = await first_turn(provider, ToolLog().registry().specs)
        assert turn.continuity, "the first turn produced a carrier to break"
        parts = list(strip_reasoning(turn.parts))
        if breakage.history is not None:
            parts = breakage.history(parts)
        history = [Message.user(PROMPT), Message("assistant", tuple(parts)), results]
        second = replace(request, messages=history)
        if breakage.message is None:
            turn2 = await stream_llm_turn(provider, second)
            assert [c.name for c in turn2.tool_calls] == ["largest_city"]
            assert server.emulator.requests[-1].status == 200
            sent = server.emulator.requests[-1].body
            if case.carrier == "anthropic":
                assert "thinking" not in sent, "that one request goes without thinking"
            if case.carrier == "responses":
                assert all("id" not in i for i in sent["input"]), "nothing demands a pairing"
            return
        with pytest.raises(ProviderHTTPError) as info:
            if breakage.body is None:
                await stream_llm_turn(provider, second)
            else:
                body = provider.build_body(second, stream=True)  # type: ignore[attr-defined]
                assert has_carrier(case.carrier, body)
                breakage.body(body)
                await post_raw(provider, body)
    finally:
        await provider.aclose()
    err = info.value
    assert err.status == 400 and server.emulator.requests[-1].status == 400
    if breakage.exact:
        assert err.message == breakage.message
    else:
        assert breakage.message in err.message
    if case.prefix != "openrouter":
        assert err.error_type == "invalid_request_error"
    assert err.request_id, "the provider's request id is kept for support"
