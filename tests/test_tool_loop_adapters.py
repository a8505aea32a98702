"""The agent tool loop through all four adapters against the emulator (issue 4, "done when").

Every test runs the real ``Runtime`` (or the real adapter) against the in-process emulator and looks
at what actually crossed the wire: ``emulator.requests`` for what the adapters sent (and the status
the emulator answered), :class:`~support.loop.TeeTransport` for the exact bytes the emulator sent.

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

import asyncio
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
from support.daemon import HANG_S
from support.loop import (
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
                # the item as it came, but without its text: no API reads it back (ADR 0156)
                sent = {k: v for k, v in item.items() if k not in ("summary", "content")}
                sent["summary"] = []
                at = next(i for i, x in enumerate(items) if x == sent)
                assert as_json(items[at]) == as_json(sent), "id and blob go back unchanged"
                assert items[at + 1]["id"] == follower, "right before the item that followed it"
        return
    sent = assistants(case, body)
    assert len(sent) == len(responses)
    for message, raw in zip(sent, responses, strict=True):
        if case.carrier == "anthropic":
            blocks = emitted_anthropic(raw)
            assert blocks, "every turn of the scenario reasons"
            head = message["content"][: len(blocks)]
            assert [as_json(b) for b in head] == [as_json(b) for b in blocks]
            rest = message["content"][len(blocks) :]
            assert all(b["type"] not in ("thinking", "redacted_thinking") for b in rest)
            assert rest and rest[-1]["type"] == "tool_use"
        elif case.carrier == "openrouter":
            details = emitted_openrouter(raw)
            assert details, "every turn of the scenario reasons"
            assert as_json(message["reasoning_details"]) == as_json(details)
        else:
            assert message["reasoning_content"] == emitted_compat(raw) != ""


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
        if mode == "hidden" or not case.sends_carrier:
            assert not has_carrier(case.carrier, bodies[k])
        else:
            assert_carriers_replayed(case, bodies[k], responses[:k])
    # no rehydration: a marker only ever sits inside the carrier field
    for body in bodies:
        for path in marker_paths(body):
            assert inside_carrier(case.carrier, body, path), f"reasoning text at {path}"
    seen = [p for b in bodies for p in marker_paths(b)]
    # a reasoning item goes back without its summary text (ADR 0156): only signed text does
    texts_back = case.sends_carrier and case.carrier != "responses"
    assert bool(seen) == (mode != "hidden" and texts_back), (
        "carriers hold reasoning only when it was asked for"
    )

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
        if case.sends_carrier:
            assert {c["model"] for c in trace["continuity"]} == {case.bare}
        else:
            assert trace["continuity"] == []
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


def redacted_first(body: dict[str, Any]) -> None:
    content = assistant_content(body)
    content[0], content[1] = content[1], content[0]


def to_other_model(body: dict[str, Any]) -> None:
    """The same history, sent to another budget-form model (a switch that kept the blocks)."""
    body["model"] = "claude-sonnet-4-0"


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
            Breakage(
                "reorder-thinking-blocks",
                case,
                body=redacted_first,
                message="messages.1.content.1: `thinking` or `redacted_thinking` blocks in the "
                "latest assistant message cannot be modified.",
            ),
            Breakage(
                "replay-to-another-model",
                case,
                body=to_other_model,
                message="messages.1.content.0: `thinking` or `redacted_thinking` blocks in the "
                "latest assistant message cannot be modified.",
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
    ]
    return out


BREAKAGES = _breakages()


async def first_turn(provider: Provider, specs: Any) -> tuple[TurnRequest, Turn, Message]:
    request = TurnRequest([Message.user(PROMPT)], tools=specs, reasoning=ReasoningRequest(True))
    turn = await stream_llm_turn(provider, request)
    results = Message(
        "tool", tuple(ToolResultPart(c.call_id, "Mexico", name=c.name) for c in turn.tool_calls)
    )
    return request, turn, results


async def post_raw(provider: Provider, body: dict[str, Any]) -> None:
    """POST a hand-edited body through the adapter's own HTTP transport (its error mapping)."""
    adapter: Any = provider  # every HTTP adapter has its transport and path
    async with adapter.transport.open(adapter.path, body, stream=True) as response:
        async for _ in response.aiter_bytes():
            pass


@pytest.mark.parametrize("breakage", BREAKAGES, ids=[f"{b.case}-{b.id}" for b in BREAKAGES])
async def test_broken_carriers_get_the_providers_real_error(
    server: EmulatorServer, breakage: Breakage
) -> None:
    case = CASE_BY_ID[breakage.case]
    provider = make_provider(case.model, url=server.url, scenario=scenario_name("loop", case))
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


# --------------------------------------------------------------------------- 3: no rehydration


CARRIER_CASES = [c for c in CASES if c.sends_carrier]


@pytest.mark.parametrize("case", CARRIER_CASES, ids=[c.id for c in CARRIER_CASES])
async def test_continued_conversation_sends_no_carrier_and_no_reasoning(
    server: EmulatorServer, case: Case
) -> None:
    rig = Rig(server, scenario_name("loop", case))
    first, _ = await rig.run(case.model, "surface")
    assert first.status == "completed"
    assert has_carrier(case.carrier, rig.bodies()[-1]), "the first run's loop did use carriers"
    server.emulator.requests.clear()

    rig.scenario = scenario_name("answer", case)
    second = await rig.runtime.continue_run(first.run_id, "And the second largest?")
    assert second.status == "completed" and second.metadata["continues"] == first.run_id
    assert second.chain_of_thought == "surface", "the conversation keeps its disclosure mode"
    (body,) = rig.bodies()
    assert rig.requests[0].status == 200
    assert not has_carrier(case.carrier, body), "stored history carries no carrier"
    assert marker_paths(body) == [], "nor any reasoning text"
    dumped = as_json(body)
    assert PROMPT in dumped and ANSWER in dumped and "And the second largest?" in dumped
    assert not any(marker in dumped for marker in LOOP_MARKS)
    events = await rig.runtime.store.read(second.run_id)
    (response,) = of_type(events, EventType.AGENT_RESPONSE)
    assert response.payload["reasoning"] == CONTINUE_MARK, "the new turn's own reasoning is kept"


@pytest.mark.parametrize("case", CARRIER_CASES, ids=[c.id for c in CARRIER_CASES])
async def test_switching_model_drops_the_other_models_carriers(
    server: EmulatorServer, case: Case
) -> None:
    """Carriers made by ``case.switch_to`` ride in the history of a run on ``case.model``."""
    summaries = any(c.summaries for c in CASES if c.model == case.switch_to)
    scenario = "loop-summary" if summaries else "loop"
    other = make_provider(case.switch_to, url=server.url, scenario=scenario)
    try:
        _, turn, _ = await first_turn(other, ToolLog().registry().specs)
    finally:
        await other.aclose()
    foreign = list(turn.continuity)
    assert foreign and all(b.model != case.bare for b in foreign)
    kept = tuple(p for p in strip_reasoning(turn.parts) if not isinstance(p, ToolCallPart))
    history = [Message.user(PROMPT), Message("assistant", kept)]
    server.emulator.requests.clear()

    rig = Rig(server, scenario_name("answer", case))
    run, events = await rig.run(case.model, "surface", history=history, prompt="Go on.")
    assert run.status == "completed"
    (body,) = rig.bodies()
    assert rig.requests[0].status == 200
    assert not has_carrier(case.carrier, body) and marker_paths(body) == []
    assert "Let me look up your country." in as_json(body), "the visible text stays"
    dropped = of_type(events, EventType.CONTINUITY_DROPPED)
    assert [e.payload["carrier"] for e in dropped] == [b.carrier for b in foreign]
    for e in dropped:
        assert e.payload["from_model"] == turn.model and e.payload["turn"] == 0
        assert f"not {case.prefix}:{case.bare}" in e.payload["reason"]
        assert MARK not in as_json(e.payload), "the record says why, not what"


# --------------------------------------------------------------------------- 4: cut streams


@pytest.mark.parametrize("point", CUT_POINTS, ids=[p.id for p in CUT_POINTS])
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
async def test_cut_or_failed_turn_keeps_the_partial(
    server: EmulatorServer, case: Case, point: CutPoint
) -> None:
    """A stream cut or failed mid-turn (or a turn refused after a tool ran) is recorded as far as
    it got; the task ends ``message.partially_completed``. The run is partial when some answer
    text had arrived, and failed (``run.failed``) when none had: an outage is never an answer."""
    rig = Rig(server, scenario_name(f"cut-{point.id}", case))
    run, events = await rig.run(case.model, "surface")  # returns: no unhandled exception

    outcome = "partial" if point.text else "failed"
    assert run.status == outcome and run.tasks[0].status == outcome
    assert run.error and run.tasks[0].error == run.error, "the error is on the run for every view"
    statuses = [r.status for r in rig.requests]
    assert statuses == [200] * len(point.tools_run) + [point.status or 200]
    assert [name for name, _ in rig.tools.calls] == list(point.tools_run)
    responses_ev = of_type(events, EventType.AGENT_RESPONSE)
    assert len(responses_ev) == 1 + len(point.tools_run)
    last = responses_ev[-1].payload
    assert last["complete"] is False and last["error"]
    assert last["reasoning"] == point.reasoning, "the partial reasoning is recorded"
    assert last["reasoning_bytes"] == len(point.reasoning.encode())
    assert last["answer"] == point.text, "and the partial text"
    calls = [(c["name"], c["input"]) for c in last["tool_calls"]]
    assert calls == list(point.cut_calls), "and the tool call that had arrived (not run)"
    (partial,) = of_type(events, EventType.MESSAGE_PARTIALLY_COMPLETED)
    assert partial.payload["text"] == point.text and partial.payload["reason"] == "provider_error"
    # OpenRouter's body has a numeric code and the type in metadata.error_type: the type wins
    assert partial.payload["error_type"] == point.error_type
    assert partial.payload["status"] == point.status
    assert MARK not in as_json(partial.payload)
    assert not of_type(events, EventType.MESSAGE_COMPLETED)
    earlier = [LOOP_MARKS[0]] * len(point.tools_run)
    expected = "\n\n".join(r for r in [*earlier, point.reasoning] if r)
    assert run.tasks[0].reasoning == expected and run.tasks[0].output == point.text
    (worker,) = of_type(events, EventType.WORKER_COMPLETED)
    assert worker.payload["status"] == outcome
    assert worker.payload["turns"] == len(responses_ev)
    kinds = [e.type for e in events]
    assert EventType.RUN_ERROR not in kinds
    terminal = EventType.RUN_SETTLEMENT_COMPLETED if point.text else EventType.RUN_FAILED
    assert kinds[-1] == terminal and kinds.count(terminal) == 1
    assert events[-1].payload["status"] == outcome
    assert events[-1].payload["error"] == run.error


async def test_a_missing_key_is_a_usage_error_before_any_run_exists(server: EmulatorServer) -> None:
    from thoughtgate.errors import ConfigError
    from thoughtgate.providers.base import ProviderSettings, create_provider

    store = MemoryStore()
    runtime = Runtime(
        store, provider_factory=lambda m: create_provider(m, ProviderSettings(base_url=server.url))
    )
    with pytest.raises(ConfigError, match="API key") as info:
        await runtime.create_run(RunRequest(PROMPT, model=CASES[0].model))
    assert "= None" not in str(info.value) and "ANTHROPIC_API_KEY" in str(info.value)
    assert await store.list_runs() == [], "nothing was recorded for a run that could not start"


async def test_a_run_that_cannot_start_its_provider_ends_run_failed(server: EmulatorServer) -> None:
    from thoughtgate.errors import ProviderConnectionError

    def unreachable(model: str) -> Provider:
        raise ProviderConnectionError("cannot reach the provider", provider="anthropic")

    runtime = Runtime(MemoryStore(), provider_factory=unreachable)
    created = await runtime.create_run(RunRequest(PROMPT, model=CASES[0].model))
    with pytest.raises(ProviderConnectionError, match="cannot reach"):
        await runtime.execute(created.run_id)
    events = await runtime.store.read(created.run_id)
    assert [e.type for e in events][-2:] == [EventType.TASK_COMPLETED, EventType.RUN_FAILED]
    assert "cannot reach" in events[-1].payload["error"]
    assert (
        events[-2].payload["status"] == "failed" and "cannot reach" in events[-2].payload["error"]
    )
    run = await runtime.store.get_run(created.run_id)
    assert run.status == "failed" and run.tasks[0].status == "failed", "no task left running"


async def test_an_adapter_bug_mid_loop_ends_run_error(server: EmulatorServer) -> None:
    """An exception nobody mapped is not swallowed: the run records ``run.error`` and it raises."""

    class Broken:
        def __init__(self, inner: Provider) -> None:
            self.inner = inner
            self.name, self.model, self.capabilities = inner.name, inner.model, inner.capabilities

        async def stream(self, request: TurnRequest) -> Any:
            if len(request.messages) > 1:
                raise RuntimeError("adapter bug")
            async for chunk in self.inner.stream(request):
                yield chunk

        async def aclose(self) -> None:
            await self.inner.aclose()

    rig = Rig(server, "loop")
    rig.runtime.provider_factory = lambda m: Broken(rig.provider(m))  # type: ignore[assignment,return-value]
    created = await rig.runtime.create_run(RunRequest(PROMPT, model=CASES[0].model))
    with pytest.raises(RuntimeError, match="adapter bug"):
        await rig.runtime.execute(created.run_id)
    events = await rig.runtime.store.read(created.run_id)
    assert [e.type for e in events][-2:] == [EventType.TASK_COMPLETED, EventType.RUN_ERROR]
    assert events[-1].payload["error"] == "RuntimeError"
    # the library's words are error_detail, recorded where reasoning is: not on a hidden run
    assert "error_detail" not in events[-1].payload
    responses = of_type(events, EventType.AGENT_RESPONSE)
    assert responses, "the turn before the bug is recorded"
    # the failed task still records what its one returned turn was billed (ADR 0131)
    billed = responses[0].payload["usage"]
    assert events[-2].payload == {
        "status": "failed",
        "output": None,
        "error": "RuntimeError",
        "usage": billed,
    }
    run = await rig.runtime.store.get_run(created.run_id)
    assert run.status == "error" and run.tasks[0].status == "failed"
    assert rig.tools.calls == [("get_country", {})], "the first turn's tool did run"


# --------------------------------------------------------------------------- 6: the CLI


def cli_env(**extra: str) -> dict[str, str]:
    path = os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")])
    return {**os.environ, "PYTHONPATH": path, "NO_COLOR": "1", **extra}


def cli_args(server: EmulatorServer, db: str, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "thoughtgate",
        "run",
        "Book me a table in Paris.",
        "--model",
        "anthropic:claude-sonnet-4-5",
        "--base-url",
        server.url,
        "--api-key",
        "x",
        "--tools",
        "support.loop:CLI_TOOLS",
        "--cot",
        "surface",
        "--json",
        "--db",
        db,
        *extra,
    ]


async def stored_events(db: str, run_id: str) -> list[Event]:
    from thoughtgate.store.urls import open_store

    store = await open_store(db)
    try:
        return await store.read(run_id)
    finally:
        await store.close()


def tool_result_sent(server: EmulatorServer) -> str:
    """The ``tool_result`` the CLI's loop sent back to the model."""
    bodies = server.emulator.bodies("/messages")
    assert len(bodies) == 2 and [r.status for r in server.emulator.requests] == [200, 200]
    (block,) = bodies[1]["messages"][-1]["content"]
    assert block["type"] == "tool_result"
    content: str = block["content"]
    return content


def test_cli_loads_tools_and_approves_all(server: EmulatorServer, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'cli.db'}"
    proc = subprocess.run(
        cli_args(server, db, "--approve-all"),
        capture_output=True,
        text=True,
        env=cli_env(),
        stdin=subprocess.DEVNULL,
        timeout=HANG_S,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["status"] == "completed" and out["tasks"][0]["output"] == CLI_ANSWER
    assert tool_result_sent(server) == "BOOKED-Paris"
    kinds = [e.type for e in asyncio.run(stored_events(db, out["run_id"]))]
    for kind in ("tool.approval_required", "tool.approval_response", "tool.completed"):
        assert kind in kinds
    assert kinds[-1] == "run.settlement.completed"
    assert CLI_MARK in (out["tasks"][0]["reasoning"] or ""), "surface, local owner"


def test_cli_without_a_tty_lets_the_approval_time_out(
    server: EmulatorServer, tmp_path: Path
) -> None:
    db = f"sqlite:///{tmp_path / 'cli.db'}"
    started = time.monotonic()
    proc = subprocess.run(
        cli_args(server, db),
        capture_output=True,
        text=True,
        env=cli_env(THOUGHTGATE_ORCHESTRATION__APPROVAL_TIMEOUT_S="0.3"),
        stdin=subprocess.DEVNULL,
        timeout=HANG_S,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "Allow tool" not in proc.stdout
    # the wait is said on stderr (stdout stays the one JSON document), with how long it lasts
    assert "no terminal to ask on: it waits up to 0.3 s (orchestration.approval_timeout_s)" in (
        proc.stderr
    ), proc.stderr
    out = json.loads(proc.stdout)
    assert out["status"] == "completed", "a timed-out approval is not an error"
    assert tool_result_sent(server) == (
        "The tool call was not approved in time and was not executed."
    )
    events = asyncio.run(stored_events(db, out["run_id"]))
    (timeout,) = [e for e in events if e.type == "tool.approval_timeout"]
    assert timeout.payload["timeout_s"] == 0.3
    assert "tool.started" not in [e.type for e in events]
    # not the 300 s default: a process start alone took 28 s on a loaded machine
    assert time.monotonic() - started < HANG_S


@pytest.mark.parametrize(
    ("answer", "result"),
    [
        (b"y", "BOOKED-Paris"),
        (b"n", "The user rejected this tool call; it was not executed."),
    ],
)
def test_cli_asks_on_a_terminal(
    server: EmulatorServer, tmp_path: Path, answer: bytes, result: str
) -> None:
    """stdin is a pseudo-terminal, so the CLI asks (on stderr) and reads the answer from it;
    stdout, a pipe, carries nothing but the JSON document."""
    db = f"sqlite:///{tmp_path / 'cli.db'}"
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        cli_args(server, db),
        stdin=slave,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=cli_env(THOUGHTGATE_ORCHESTRATION__APPROVAL_TIMEOUT_S="30", TERM="dumb"),
        close_fds=True,
    )
    os.close(slave)
    assert proc.stdout is not None and proc.stderr is not None
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    streams = {out_fd: bytearray(), err_fd: bytearray()}
    open_fds = set(streams)
    answered = False
    deadline = time.monotonic() + HANG_S
    try:
        while open_fds and time.monotonic() < deadline:
            ready, _, _ = select.select(list(open_fds), [], [], 0.2)
            for fd in ready:
                data = os.read(fd, 4096)
                if not data:
                    open_fds.discard(fd)  # the child closed it: everything it wrote is in
                streams[fd] += data
            if not answered and b"Allow tool book_table" in streams[err_fd]:
                os.write(master, answer + b"\n")
                answered = True
        assert proc.wait(timeout=HANG_S) == 0, streams[err_fd].decode()
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
        proc.stdout.close()
        proc.stderr.close()
    stdout, stderr = streams[out_fd].decode(), streams[err_fd].decode()
    assert answered and "Allow tool book_table with {'city': 'Paris'}? [y/N]:" in stderr
    out = json.loads(stdout)  # one clean document: the prompt did not leak into it
    assert out["status"] == "completed" and out["tasks"][0]["output"] == CLI_ANSWER
    assert tool_result_sent(server) == result, "the tool ran only on yes"
