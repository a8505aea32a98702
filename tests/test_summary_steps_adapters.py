"""Provider summaries through the real Anthropic, OpenRouter and Responses adapters, against the
emulator.

On these routes a summary's words are also continuity data: Claude's summarized thinking is a
signed thinking block sent back to the model, OpenRouter's details go back whole, and so does an
OpenAI reasoning item with its summary. Each route
runs a two-turn tool loop whose every reasoning block is ONE sentence holding a unique canary --
the case where a step quotes the whole continuity string --, with a redacted block beside them,
on a ``surface`` run recorded in SQLite, with and without the operator's ``provider_summaries``.

* With the opt-in a viewer gets one step per summary, word for word, and the receipt counts them
  (``step_sources``) with nothing dropped; without it, no step and no canary.
* Raw reasoning never: OpenRouter ``reasoning.text`` of a model that thinks in the open, and a
  Claude model or OpenRouter's format served by a host that vouches for no summary (ADR 0078).
* No signature and no encrypted data, as the emulator sent them, reaches a viewer or a member on
  any read path (Python surfaces, CLI, HTTP routes, the SSE stream).
* The thread a viewer builds live (each event as it was appended, filtered for the viewer and
  fed as SSE JSON) equals the one rebuilt on reload from the store, from ``/events`` and from the
  SSE stream.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from support.daemon import Daemon, running_daemon, sse_events, stream_all
from support.loop import (
    ADAPTERS,
    TeeTransport,
    emitted_anthropic,
    emitted_openrouter,
    emitted_responses,
)
from support.reads import readings

from thoughtgate.access.filter import filter_events
from thoughtgate.config import Config
from thoughtgate.engine.tools import ToolRegistry, tool
from thoughtgate.events.schema import Event
from thoughtgate.events.thread import ThreadBuilder, ThreadView, rebuild
from thoughtgate.orchestration.runtime import RunRequest, Runtime
from thoughtgate.providers.base import Provider, ProviderSettings, split_model
from thoughtgate.server.sse import encode_event
from thoughtgate.store.urls import open_store
from thoughtgate.testing.emulator import (
    Call,
    Emulator,
    Redacted,
    Say,
    Scenario,
    ScriptedTurn,
    Summary,
    Think,
    serve_emulator,
)

pytestmark = pytest.mark.inprocess

BELOW_DEVELOPER = ("viewer", "member")
OPT_IN = Config.from_mapping(
    {"visible_reasoning": {"summarizers": ["provider_summaries", "phases"]}}
)


@tool
def lookup(query: str) -> str:
    """Look something up."""
    return f"result for {query}"


@dataclass(frozen=True)
class Route:
    id: str
    model: str
    server: str | None
    """The server the operator names (``None``: the emulator's loopback host speaks for itself)."""
    summaries: tuple[str, ...]
    """Which scripted blocks arrive as summaries there (``think``, ``summary``); none elsewhere."""


ROUTES = (
    Route("anthropic-claude-4.5", "anthropic:claude-sonnet-4-5", "anthropic", ("think", "summary")),
    Route("anthropic-claude-4.7", "anthropic:claude-opus-4-7", "anthropic", ("think", "summary")),
    Route(
        "openrouter-claude",
        "openrouter:anthropic/claude-sonnet-4.5",
        "openrouter",
        ("think", "summary"),
    ),
    Route("openrouter-openai", "openrouter:openai/gpt-5-mini", "openrouter", ("summary",)),
    Route("openai-responses", "openai:gpt-5", "openai", ("think", "summary")),
    # the same formats where no server vouches for a summary: raw, so never shown
    Route("anthropic-compatible", "anthropic:claude-sonnet-4-5", None, ()),
    Route("openrouter-format-elsewhere", "openrouter:openai/gpt-5-mini", None, ()),
)
KINDS = ("think", "summary")


def canaries() -> dict[tuple[str, int], str]:
    """One sentence per (block, turn); letters and digits only, so no rule has a reason to drop
    them and no renderer breaks them."""
    tag = uuid.uuid4().hex[:10]
    return {(k, t): f"Weighing the rail options CANARY{k.upper()}{tag}x{t}." for k in KINDS for t in (0, 1)}  # fmt: skip


def scenario(name: str, marks: dict[tuple[str, int], str]) -> Scenario:
    return Scenario(
        name,
        (
            ScriptedTurn(
                (
                    Think(marks["think", 0]),
                    Summary(marks["summary", 0]),
                    Redacted("safety"),
                    Say("Looking it up."),
                    Call("lookup", {"query": "weather"}),
                )
            ),
            ScriptedTurn(
                (Think(marks["think", 1]), Summary(marks["summary", 1]), Say("It is sunny."))
            ),
        ),
    )


def adapter(route: Route, url: str, name: str, tee: TeeTransport) -> Provider:
    prefix, bare = split_model(route.model)
    extra = {"thoughtgate": {"server": route.server}} if route.server else {}
    base = url if prefix == "anthropic" else f"{url}/v1"
    settings = ProviderSettings(base_url=base, api_key="test-key", max_retries=0, extra=extra)
    client = httpx.AsyncClient(headers={"x-emulator-scenario": name}, transport=tee)
    provider: Provider = ADAPTERS[prefix](bare, settings, client=client)
    return provider


@dataclass
class Recorded:
    route: Route
    opted_in: bool
    run_id: str
    marks: dict[tuple[str, int], str]
    live: list[Event]
    """Every event as it was appended, in order (what a live stream is fed from)."""
    opaque: list[str]
    """Every signature and encrypted string the emulator sent on this run."""

    @property
    def shown(self) -> list[str]:
        """The canary sentences a viewer must read as steps, in order."""
        if not self.opted_in:
            return []
        return [self.marks[k, t] for t in (0, 1) for k in KINDS if k in self.route.summaries]


@dataclass
class World:
    db: str
    daemon: Daemon
    runs: dict[tuple[str, bool], Recorded]


def _opaque(tee: TeeTransport) -> list[str]:
    found = []
    for exchange in tee.exchanges:
        raw = bytes(exchange.response)
        for block in [*emitted_anthropic(raw), *emitted_openrouter(raw)]:
            found += [block[k] for k in ("signature", "data") if block.get(k)]
        found += [item["encrypted_content"] for item, _ in emitted_responses(raw)]
    return found


async def _record(db: str, url: str, emulator: Emulator) -> dict[tuple[str, bool], Recorded]:
    store = await open_store(db)
    out = {}
    try:
        for route in ROUTES:
            for opted_in in (False, True):
                marks = canaries()
                name = f"summary-steps-{route.id}-{opted_in}"
                emulator.add(scenario(name, marks))
                tee = TeeTransport()
                live: list[Event] = []

                async def sink(events: Sequence[Event], live: list[Event] = live) -> None:
                    live.extend(events)

                def make(
                    model: str, route: Route = route, name: str = name, tee: TeeTransport = tee
                ) -> Provider:
                    return adapter(route, url, name, tee)

                runtime = Runtime(
                    store,
                    OPT_IN if opted_in else Config(),
                    provider_factory=make,
                    tools=ToolRegistry([lookup]),
                    sinks=[sink],
                )
                record = await runtime.run(
                    RunRequest("What is the weather?", model=route.model),
                    chain_of_thought="surface",
                )
                assert record.status == "completed", (route.id, record.error)
                mine = [e for e in live if e.run_id == record.run_id]  # the store feeds every run
                out[route.id, opted_in] = Recorded(
                    route, opted_in, record.run_id, marks, mine, _opaque(tee)
                )
    finally:
        await store.close()
    return out


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    folder: Path = tmp_path_factory.mktemp("summary-steps")
    db = f"sqlite:///{folder / 'daemon.db'}"  # the file running_daemon opens
    emulator = Emulator()
    with serve_emulator(emulator) as server:
        runs = asyncio.run(_record(db, server.url, emulator))
    with running_daemon(sqlite_dir=folder) as daemon:
        yield World(db, daemon, runs)


CASES = [(r, o) for r in ROUTES for o in (False, True)]
IDS = [f"{r.id}-{'opted-in' if o else 'default'}" for r, o in CASES]


async def _stored(db: str, run_id: str) -> list[Event]:
    store = await open_store(db)
    try:
        return await store.read(run_id)
    finally:
        await store.close()


def viewer_thread(world: World, recorded: Recorded) -> ThreadView:
    events = asyncio.run(_stored(world.db, recorded.run_id))
    return rebuild(filter_events(events, "viewer", mode="surface"))


@pytest.mark.parametrize(("route", "opted_in"), CASES, ids=IDS)
def test_a_summary_gives_its_step_only_with_the_operators_opt_in(
    world: World, route: Route, opted_in: bool
) -> None:
    recorded = world.runs[route.id, opted_in]
    thread = viewer_thread(world, recorded)
    steps = [(s.source, s.summary) for s in thread.steps]
    assert steps == [("provider_summary", m) for m in recorded.shown]
    receipt = thread.receipt
    assert receipt is not None
    assert receipt.step_sources.get("provider_summary", 0) == len(recorded.shown)
    assert dict(receipt.dropped_by_reason) == {}
    assert receipt.opaque_reasoning_exists  # the redacted block: withheld, and said so
    assert ("provider_summaries" in receipt.summarizers) == opted_in
    assert bool(receipt.notes) == opted_in


@pytest.mark.parametrize("role", BELOW_DEVELOPER)
@pytest.mark.parametrize(("route", "opted_in"), CASES, ids=IDS)
def test_no_raw_reasoning_or_continuity_data_reaches_a_reader_below_developer(
    world: World, route: Route, opted_in: bool, role: str
) -> None:
    recorded = world.runs[route.id, opted_in]
    assert recorded.opaque  # the search below has something to look for
    hidden = [m for m in recorded.marks.values() if m not in recorded.shown]
    for path, body in readings(world.db, world.daemon, recorded.run_id, role).items():
        for mark in hidden:
            canary = mark.split()[-1]
            assert canary.rstrip(".") not in body, f"{canary} reached a {role} via {path}"
        for mark in recorded.shown:
            assert mark in body, f"{mark} missing for a {role} via {path}"
        for opaque in recorded.opaque:
            assert opaque not in body, f"continuity data reached a {role} via {path}"


@pytest.mark.parametrize(("route", "opted_in"), CASES, ids=IDS)
def test_the_thread_a_viewer_builds_live_equals_every_reload(
    world: World, route: Route, opted_in: bool
) -> None:
    recorded = world.runs[route.id, opted_in]
    live = ThreadBuilder()
    for event in filter_events(recorded.live, "viewer", mode="surface"):
        live.feed(json.loads(encode_event(event)["data"]))
    reload = viewer_thread(world, recorded)
    with world.daemon.client("viewer") as c:
        listed = c.get(f"/v1/runs/{recorded.run_id}/events").json()["events"]
    _, body = stream_all(world.daemon, recorded.run_id, "viewer")
    assert live.view() == reload
    assert ThreadBuilder().feed_all(listed).view() == reload
    assert ThreadBuilder().feed_all(sse_events(body)).view() == reload
    assert [s.summary for s in reload.steps] == recorded.shown
