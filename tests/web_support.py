"""Shared by the client and web-page tests: a multi-step fake script, two tools, a daemon on
loopback (optionally with runs seeded straight into its store) and raw-marker helpers.

``fake:story`` takes ``"story TOKEN [DELAY]"``: three turns, each with a provider summary (so
visible steps exist), raw reasoning carrying ``RAWTHOUGHT-TOKEN`` (which only developer+ may ever
receive), two tool calls and an answer in several deltas, pausing ``DELAY`` seconds between chunks
so a reader can watch it live.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Any

from daemon_support import Daemon, ThreadServer, seed_keys

from thoughtgate.config import Config
from thoughtgate.engine.tools import ToolRegistry, tool
from thoughtgate.events.schema import NewEvent
from thoughtgate.providers.base import TurnRequest
from thoughtgate.store.base import EventStore
from thoughtgate.store.memory import MemoryStore
from thoughtgate.store.records import RunRecord
from thoughtgate.testing.fake import FAKE_SCRIPTS, reasoning, text, tool_call

__all__ = ["STORY_ANSWER", "raw_marker", "seed_run", "web_daemon"]


def raw_marker(token: str) -> str:
    return f"RAWTHOUGHT-{token}"


def _args(request: TurnRequest) -> tuple[str, float]:
    first = request.messages[0].text if request.messages else ""
    parts = first.split()
    token = parts[1] if len(parts) > 1 else "x"
    delay = float(parts[2]) if len(parts) > 2 else 0.0
    return token, delay


STORY_ANSWER = (
    "Take the 09:12 train from Lisbon to Porto: it arrives at 12:05, and Porto will be sunny "
    "and 24 °C all afternoon."
)

_TURNS: list[tuple[str, str, tuple[str, dict[str, Any]] | None]] = [
    (
        "**Checking the forecast**\n\nThe trip depends on the weather in Porto.",
        "user wants a day trip; weather first, then trains. ",
        ("check_weather", {"city": "Porto"}),
    ),
    (
        "**Finding a morning train**\n\nA morning departure leaves the most time there.",
        "sunny, good. trains next; prefer arrival before noon-ish. ",
        ("find_trains", {"origin": "Lisbon", "destination": "Porto"}),
    ),
    (
        "**Putting the plan together**\n\nOne train and the forecast answer the question.",
        "09:12 arrives 12:05, fine. write it short. ",
        None,
    ),
]


def _story(request: TurnRequest, turn: int) -> AsyncIterator[Any]:
    token, delay = _args(request)

    async def gen() -> AsyncIterator[Any]:
        summary, raw, call = _TURNS[min(turn, len(_TURNS) - 1)]
        yield reasoning(summary, kind="summary")
        await asyncio.sleep(delay)
        yield reasoning(f"{raw}{raw_marker(token)} ")
        await asyncio.sleep(delay)
        if call is not None:
            name, arguments = call
            yield tool_call(name, arguments, call_id=f"call_{name}_{turn}")
            return
        words = STORY_ANSWER.split(" ")
        for i, word in enumerate(words):
            yield text(word if i == 0 else " " + word)
            await asyncio.sleep(delay / 4)

    return gen()


FAKE_SCRIPTS["story"] = _story


@tool
def check_weather(city: str) -> str:
    """The weather forecast for a city today."""
    return f"{city}: sunny, 24 °C, light wind"


@tool
def find_trains(origin: str, destination: str) -> str:
    """Morning trains between two cities."""
    return f"{origin} -> {destination}: 07:05 (arr 10:02), 09:12 (arr 12:05)"


WEB_TOOLS = [check_weather, find_trains]


def seed_run(
    run_id: str, events: Sequence[NewEvent], *, mode: str = "surface", prompt: str = "seeded"
) -> Callable[[EventStore], Awaitable[None]]:
    """A seeder for :func:`web_daemon`: a run recorded straight into the store, as given."""

    async def seed(store: EventStore) -> None:
        await store.create_run(
            RunRecord(
                run_id, prompt, model="fake:seeded", chain_of_thought=mode, status="completed"
            )
        )
        await store.append(run_id, list(events))

    return seed


@contextlib.contextmanager
def web_daemon(
    *,
    config: dict[str, Any] | None = None,
    seeds: Sequence[Callable[[EventStore], Awaitable[None]]] = (),
    **app_options: Any,
) -> Iterator[Daemon]:
    """A daemon over a memory store with one key per role, the web tools, ``seeds`` applied to
    the store before it starts, served on loopback."""
    from thoughtgate.server.app import create_app

    store = MemoryStore()
    keys = seed_keys(store)

    async def apply_seeds() -> None:
        for seed in seeds:
            await seed(store)

    asyncio.run(apply_seeds())
    settings = Config.from_mapping(config or {})
    app = create_app(store, settings, tools=ToolRegistry(WEB_TOOLS), **app_options)
    try:
        with ThreadServer(app) as server:
            yield Daemon(server.base_url, keys, store, app)
    finally:
        asyncio.run(store.close())
