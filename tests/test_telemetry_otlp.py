"""OpenTelemetry as a stock backend receives it: OTLP/HTTP protobuf, decoded, checked against the
GenAI semantic conventions and the registry table in ``docs/telemetry.md``.

Runs go through the real adapters against the emulator (DeepSeek behind ``openai-compatible``,
Anthropic), with the configured ``otlp_http`` exporters pointed at an in-process collector on
loopback.
"""

from __future__ import annotations

import json
import pkgutil
import re
from collections.abc import Iterator
from importlib import import_module
from pathlib import Path
from typing import Any

import pytest
from support.loop import LOOP_MARKS, ToolLog, loop_scenario, make_provider
from support.otlp import Collector, DecodedSpan, serve_collector

from thoughtgate import __version__
from thoughtgate.config import Config
from thoughtgate.orchestration.runtime import RunRequest, Runtime, TaskSpec
from thoughtgate.store.memory import MemoryStore
from thoughtgate.telemetry import TelemetrySink, telemetry_sinks
from thoughtgate.telemetry import conventions as gc
from thoughtgate.testing.emulator import Emulator, EmulatorServer, serve_emulator

DOC = Path(__file__).resolve().parents[1] / "docs" / "telemetry.md"
PROMPT = "What is the largest city in my country?"
SYSTEM = "Answer in one sentence. SYSTEM-8C1F"
SPAN_KIND_CLIENT = 3
STATUS_ERROR = 2


@pytest.fixture(scope="module")
def emulator() -> Iterator[EmulatorServer]:
    with serve_emulator(Emulator().add(loop_scenario("loop"), default=True)) as server:
        yield server


@pytest.fixture
def collector() -> Iterator[Collector]:
    yield from serve_collector()


async def _export(
    collector: Collector,
    emulator: EmulatorServer,
    model: str,
    mode: str,
    *,
    capture: bool = True,
    tasks: int = 1,
) -> tuple[list[DecodedSpan], dict[str, list[dict[str, Any]]], str]:
    """One run exported through the configured OTLP/HTTP exporters; what the collector got."""
    config = Config.from_mapping(
        {
            "telemetry": {
                "exporter": "otlp_http",
                "endpoint": collector.url,
                "capture_content": capture,
            }
        }
    )
    (sink,) = telemetry_sinks(config)
    assert isinstance(sink, TelemetrySink)
    runtime = Runtime(
        MemoryStore(),
        config,
        provider_factory=lambda m: make_provider(m, url=emulator.url, scenario="loop"),
        tools=ToolLog().registry(),
        sinks=[sink],
    )
    specs = [TaskSpec(PROMPT, system=SYSTEM) for _ in range(tasks)] if tasks > 1 else []
    run = await runtime.run(
        RunRequest(PROMPT, model=model, system=SYSTEM, tasks=specs), chain_of_thought=mode
    )
    assert run.status == "completed"
    sink.shutdown()  # flushes both signals, as process exit does
    return collector.spans(), collector.metric_points(), run.run_id


def _by_op(spans: list[DecodedSpan], op: str) -> list[DecodedSpan]:
    return sorted((s for s in spans if s.operation == op), key=lambda s: s.start_ns)


def _registry_table() -> dict[str, str]:
    """``attribute -> registry`` from the table under "Attribute registry" in the doc."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## Attribute registry", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([a-z0-9_.]+)` \| ([^|]+) \|", section, flags=re.M)
    assert rows, "the registry table is missing from docs/telemetry.md"
    return {name: where.strip() for name, where in rows}


def _conventions_names() -> set[str]:
    """Every attribute name the installed OpenTelemetry semantic-conventions package defines."""
    names: set[str] = set()
    for package in (
        "opentelemetry.semconv.attributes",
        "opentelemetry.semconv._incubating.attributes",
    ):
        root = import_module(package)
        for info in pkgutil.iter_modules(root.__path__):
            module = import_module(f"{package}.{info.name}")
            names.update(v for k, v in vars(module).items() if k.isupper() and isinstance(v, str))
    return names


# --------------------------------------------------------------------------- the registry


def test_every_name_in_the_registry_table_is_a_convention_or_ours() -> None:
    table = _registry_table()
    known = _conventions_names()
    for name, registry in table.items():
        if name.startswith("thoughtgate."):
            assert registry == "thoughtgate", name
        else:
            assert name in known, f"{name} is not in the semantic conventions"
            assert registry in ("GenAI", "server", "error"), (name, registry)
    # and every name the code spells out is in the table
    for const in dir(gc):
        value = getattr(gc, const)
        if const.isupper() and isinstance(value, str) and re.fullmatch(r"[a-z_.]+", value):
            if value.startswith(("gen_ai.client.",)) or value == gc.SCOPE:
                continue  # metric names and the scope are not attributes
            assert value in table, f"{value} is emitted but not in the registry table"


@pytest.mark.parametrize(
    ("model", "provider"),
    [
        ("openai-compatible:deepseek-reasoner", "deepseek"),
        ("anthropic:claude-sonnet-4-5", "anthropic"),
    ],
)
async def test_spans_arrive_as_otlp_with_only_registered_attributes(
    collector: Collector, emulator: EmulatorServer, model: str, provider: str
) -> None:
    spans, _, run_id = await _export(collector, emulator, model, "surface")
    assert collector.paths.count("/v1/traces") >= 1
    assert collector.content_types == {"application/x-protobuf"}
    table = _registry_table()
    for span in spans:
        names = set(span.attributes) | {k for _, attrs in span.events for k in attrs}
        assert names <= set(table), f"{span.name}: {sorted(names - set(table))} not registered"
        assert (span.scope_name, span.scope_version) == ("thoughtgate", __version__)
        assert span.schema_url == gc.SCHEMA_URL
        assert span.resource["service.name"] == "thoughtgate"

    (agent,) = _by_op(spans, "invoke_agent")
    turns = _by_op(spans, "chat")
    assert len(turns) == 3 and agent.parent_span_id == b""
    assert agent.attributes["gen_ai.provider.name"] == provider
    host, port = emulator.url.removeprefix("http://").split(":")
    for turn in turns:
        attrs = turn.attributes
        assert turn.kind == SPAN_KIND_CLIENT and turn.parent_span_id == agent.span_id
        assert attrs["gen_ai.provider.name"] == provider, "the real provider, not its wire format"
        assert attrs["gen_ai.conversation.id"] == run_id
        assert (attrs["server.address"], attrs["server.port"]) == (host, int(port))
        assert attrs["gen_ai.response.id"], "the provider's id for the response"
        assert attrs["gen_ai.response.model"]
        assert attrs["gen_ai.request.stream"] is True
        assert attrs["gen_ai.request.max_tokens"] == 4096
        assert attrs["gen_ai.response.time_to_first_chunk"] >= 0, "every turn, tool-only included"
        assert attrs["gen_ai.usage.input_tokens"] > 0
    assert len({t.attributes["gen_ai.response.id"] for t in turns}) == 3


async def test_content_capture_exports_each_turns_reasoning_and_never_a_carrier(
    collector: Collector, emulator: EmulatorServer
) -> None:
    spans, _, _ = await _export(collector, emulator, "anthropic:claude-sonnet-4-5", "surface")
    turns = _by_op(spans, "chat")
    reasoning = [
        [
            p["content"]
            for p in json.loads(t.attributes["gen_ai.output.messages"])[0]["parts"]
            if p["type"] == "reasoning"
        ]
        for t in turns
    ]
    assert [r[0].startswith(m) for r, m in zip(reasoning, LOOP_MARKS, strict=True)] == [True] * 3
    assert json.loads(turns[0].attributes["gen_ai.system_instructions"]) == [
        {"type": "text", "content": SYSTEM}
    ]
    names = [d["name"] for d in json.loads(turns[0].attributes["gen_ai.tool.definitions"])]
    assert names == ["get_country", "largest_city"]
    last_input = json.loads(turns[-1].attributes["gen_ai.input.messages"])
    assert [m["role"] for m in last_input] == ["user", "assistant", "tool", "assistant", "tool"]
    dump = json.dumps([s.attributes for s in spans])
    assert "signature" not in dump and "redacted_thinking" not in dump
    for mark in LOOP_MARKS:
        assert mark not in json.dumps(last_input), "reasoning never goes back in"


@pytest.mark.parametrize("capture", [False, True])
async def test_a_hidden_run_exports_no_reasoning_and_no_content(
    collector: Collector, emulator: EmulatorServer, capture: bool
) -> None:
    spans, _, _ = await _export(
        collector, emulator, "anthropic:claude-sonnet-4-5", "hidden", capture=capture
    )
    dump = json.dumps([(s.name, s.attributes, s.events, s.status_message) for s in spans])
    for secret in (*LOOP_MARKS, "SYSTEM-8C1F", PROMPT, "Mexico City"):
        assert secret not in dump


async def test_metrics_follow_the_client_conventions(
    collector: Collector, emulator: EmulatorServer
) -> None:
    spans, points, _ = await _export(
        collector, emulator, "openai-compatible:deepseek-reasoner", "telemetry_only", tasks=2
    )
    (workflow,) = _by_op(spans, "invoke_workflow")
    assert workflow.attributes["gen_ai.workflow.name"] == "thoughtgate"
    assert len(_by_op(spans, "invoke_agent")) == 2
    table = _registry_table()

    usage = points[gc.TOKEN_USAGE]
    duration = points[gc.OPERATION_DURATION]
    for point in (*usage, *duration):
        assert set(point["attributes"]) <= set(table)
        assert point["scope"] == {
            "name": "thoughtgate",
            "version": __version__,
            "schema_url": gc.SCHEMA_URL,
        }
        assert point["attributes"]["gen_ai.operation.name"] == "chat"
        assert point["attributes"]["gen_ai.provider.name"] == "deepseek"
        assert point["attributes"]["server.address"] == "127.0.0.1"
    assert {p["attributes"]["gen_ai.token.type"] for p in usage} == {"input", "output"}
    assert [float(b) for b in usage[0]["explicit_bounds"]] == [float(b) for b in gc.TOKEN_BUCKETS]
    assert [float(b) for b in duration[0]["explicit_bounds"]] == list(gc.DURATION_BUCKETS)
    assert usage[0]["unit"] == "{token}" and duration[0]["unit"] == "s"
    turns = _by_op(spans, "chat")
    assert sum(int(p["count"]) for p in duration) == len(turns) == 6
    inputs = sum(float(p["sum"]) for p in usage if p["attributes"]["gen_ai.token.type"] == "input")
    assert inputs == sum(t.attributes["gen_ai.usage.input_tokens"] for t in turns)
    # telemetry_only with capture: each turn's reasoning rides on its own span
    for turn, mark in zip(turns[:3], LOOP_MARKS, strict=True):
        parts = json.loads(turn.attributes["gen_ai.output.messages"])[0]["parts"]
        assert parts[0]["type"] == "reasoning" and parts[0]["content"].startswith(mark)
