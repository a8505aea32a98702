"""With the defaults, nothing a provider returned in its reasoning channel reaches a reader below
developer, on any read path, in any of the four wire formats.

Each run goes through the real adapter to the in-process emulator (Anthropic thinking -- summarized
on Claude 4+ --, OpenRouter ``reasoning_details`` text and summaries, OpenAI Responses reasoning
summaries, DeepSeek ``reasoning_content``, vLLM ``reasoning``, inline ``<think>``), with a unique
canary in every thinking block and every summary, on a ``surface`` run with the default
configuration, recorded in SQLite. Then every read path is searched for the canaries as a viewer
and as a member: the HTTP routes and the SSE stream of a daemon over that database, the CLI, the
MCP tools, host metadata, the thread a client rebuilds, and OpenTelemetry spans. A developer's
reads do carry them (the search can find them), and with ``provider_summaries`` named by the
operator a viewer does get the summary's first sentence -- so the default is what keeps them out.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from support.daemon import Daemon, running_daemon
from support.loop import CASES, Case, make_provider
from support.reads import readings

from thoughtgate.access.filter import filter_events
from thoughtgate.config import Config
from thoughtgate.engine.tools import ToolRegistry, tool
from thoughtgate.orchestration.runtime import RunRequest, Runtime
from thoughtgate.store.urls import open_store
from thoughtgate.telemetry import TelemetrySink
from thoughtgate.testing.emulator import (
    Call,
    Emulator,
    Say,
    Scenario,
    ScriptedTurn,
    Summary,
    Think,
    serve_emulator,
)

BELOW_DEVELOPER = ("viewer", "member")


@tool
def lookup(query: str) -> str:
    """Look something up."""
    return f"result for {query}"


def canaries(case: Case) -> tuple[str, ...]:
    """Thinking and summary canaries of both turns: letters and digits only, so no renderer
    breaks them and the step policy has no reason to drop them."""
    tag = uuid.uuid4().hex[:10]
    return tuple(f"CANARY{kind}{tag}x{turn}" for turn in (0, 1) for kind in ("THINK", "SUMMARY"))


def canary_scenario(name: str, marks: tuple[str, ...]) -> Scenario:
    think0, summary0, think1, summary1 = marks
    return Scenario(
        name,
        (
            ScriptedTurn(
                (
                    Think(f"{think0} is what I really think. Then more."),
                    Summary(f"{summary0} is what I summarize. Then more."),
                    Say("Looking it up."),
                    Call("lookup", {"query": "weather"}),
                )
            ),
            ScriptedTurn(
                (
                    Think(f"{think1} closes the thought. Then more."),
                    Summary(f"{summary1} closes the summary. Then more."),
                    Say("It is sunny."),
                )
            ),
        ),
    )


@dataclass(frozen=True)
class Recorded:
    case: Case
    run_id: str
    marks: tuple[str, ...]


@dataclass
class World:
    db: str
    runs: list[Recorded]
    spans: str
    """Every finished span's attributes and events, as one JSON text."""
    daemon: Daemon


async def _record(
    db: str, url: str, config: Config, exporter: InMemorySpanExporter | None
) -> list[Recorded]:
    store = await open_store(db)
    traces = TracerProvider(shutdown_on_exit=False)
    if exporter is not None:
        traces.add_span_processor(SimpleSpanProcessor(exporter))
    out = []
    try:
        for case in CASES:
            marks = WORLD_MARKS[case.id]

            def provider(model: str, case: Case = case) -> Any:
                return make_provider(model, url=url, scenario=f"canary-{case.id}")

            runtime = Runtime(
                store,
                config,
                provider_factory=provider,
                tools=ToolRegistry([lookup]),
                sinks=[TelemetrySink(traces)],
            )
            record = await runtime.run(
                RunRequest("What is the weather?", model=case.model), chain_of_thought="surface"
            )
            assert record.status == "completed", (case.id, record.error)
            out.append(Recorded(case, record.run_id, marks))
    finally:
        await store.close()
    return out


WORLD_MARKS = {case.id: canaries(case) for case in CASES}


@pytest.fixture(scope="module")
def emulator_url() -> Iterator[str]:
    emulator = Emulator()
    for case in CASES:
        emulator.add(canary_scenario(f"canary-{case.id}", WORLD_MARKS[case.id]))
    with serve_emulator(emulator) as server:
        yield server.url


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, emulator_url: str) -> Iterator[World]:
    folder: Path = tmp_path_factory.mktemp("canary")
    db = f"sqlite:///{folder / 'daemon.db'}"  # the file running_daemon opens
    exporter = InMemorySpanExporter()
    runs = asyncio.run(_record(db, emulator_url, Config(), exporter))
    spans = json.dumps(
        [
            [dict(s.attributes or {}), [dict(e.attributes or {}) for e in s.events]]
            for s in exporter.get_finished_spans()
        ],
        default=str,
    )
    with running_daemon(sqlite_dir=folder) as daemon:
        yield World(db, runs, spans, daemon)


def _readings(world: World, recorded: Recorded, role: str) -> dict[str, str]:
    return readings(world.db, world.daemon, recorded.run_id, role)


@pytest.mark.parametrize("role", BELOW_DEVELOPER)
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_no_reasoning_text_reaches_a_reader_below_developer(
    world: World, case: Case, role: str
) -> None:
    [recorded] = [r for r in world.runs if r.case.id == case.id]
    for path, body in _readings(world, recorded, role).items():
        for mark in recorded.marks:
            assert mark not in body, f"{mark} reached a {role} through {path} ({case.id})"
    for mark in recorded.marks:
        assert mark not in world.spans, f"{mark} reached OpenTelemetry ({case.id})"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_developer_reads_what_the_provider_returned(world: World, case: Case) -> None:
    """The search above can find the canaries: a developer's reads carry what came back."""
    [recorded] = [r for r in world.runs if r.case.id == case.id]
    readings = _readings(world, recorded, "developer")
    think0 = recorded.marks[0]
    assert all(think0 in body for body in readings.values()), case.id


@pytest.fixture(scope="module")
def summaries_shown(emulator_url: str, tmp_path_factory: pytest.TempPathFactory) -> list[Any]:
    """The same runs with the operator's explicit ``provider_summaries`` opt-in."""
    db = f"sqlite:///{tmp_path_factory.mktemp('optin') / 'optin.db'}"
    opt_in = Config.from_mapping(
        {"visible_reasoning": {"summarizers": ["provider_summaries", "phases"]}}
    )
    runs = asyncio.run(_record(db, emulator_url, opt_in, None))

    async def read() -> list[Any]:
        store = await open_store(db)
        try:
            out = []
            for r in runs:
                events = await store.read(r.run_id)
                kinds = {
                    part["reasoning_kind"]
                    for e in events
                    if e.type == "agent.response"
                    for part in e.payload.get("reasoning_parts", [])
                    if part.get("text")
                }
                viewer = json.dumps(
                    [e.to_dict() for e in filter_events(events, "viewer", mode="surface")]
                )
                out.append((r, kinds, viewer))
            return out
        finally:
            await store.close()

    return asyncio.run(read())


def test_with_the_operators_opt_in_a_viewer_reads_provider_summaries(
    summaries_shown: list[Any],
) -> None:
    summarized = 0
    for recorded, kinds, viewer in summaries_shown:
        shown = [m for m in recorded.marks if m in viewer]
        if "summary" in kinds:
            summarized += 1
            assert shown, recorded.case.id
            assert "provider_summaries" in viewer  # the receipt names the opt-in ...
            assert "The operator chose to show you summaries" in viewer  # ... in plain words
        else:
            assert shown == [], recorded.case.id  # raw reasoning is never a summary
    assert summarized >= 3  # Anthropic (Claude 4+), OpenAI Responses, OpenRouter summaries
