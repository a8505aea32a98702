"""Shared by the client and web-page tests: a multi-step fake script, two tools, a daemon on
loopback (optionally with runs seeded straight into its store) and raw-marker helpers.

``fake:story`` reads ``token=T delay=D`` from the run's system prompt (which no reader is ever
sent): four turns. Each of the first three has a provider summary and raw reasoning carrying
``RAWTHOUGHT-T`` unless ``T`` is empty (only developer+ may ever receive either), and narrates
for the reader through ``visible_step``: a step of its own, then -- beside each of the two tool
calls -- why it calls the tool; the third turn only narrates; the fourth answers in several
deltas. It pauses ``D`` seconds between chunks so a reader can watch it live. The web daemon
turns ``narration`` on (:data:`NARRATING`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import http.server
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Any, TypeVar

from support.daemon import SERVER_TOOLS, Daemon, ThreadServer, seed_keys
from support.scripts import failing
from thoughtgate.config import Config
from thoughtgate.engine.tools import ToolRegistry, tool
from thoughtgate.errors import ProviderHTTPError
from thoughtgate.events.payloads import RunStatus
from thoughtgate.events.schema import NewEvent
from thoughtgate.events.visible import VISIBLE_MARKER
from thoughtgate.providers.base import TurnRequest
from thoughtgate.store.base import EventStore
from thoughtgate.store.memory import MemoryStore
from thoughtgate.store.records import RunRecord
from thoughtgate.testing.fake import ScriptFn, reasoning, text, tool_call

T = TypeVar("T")

__all__ = [
    "MIRROR_STEP",
    "NARRATING",
    "SAID_ANSWER",
    "SAID_FIRST",
    "SCRIPTS",
    "SEEDED_EVENTS",
    "SEEDED_SECRET",
    "STEP_TITLES",
    "STORY_ANSWER",
    "STORY_PROMPT",
    "TOOL_WHYS",
    "WEB_TOOLS",
    "other_site",
    "raw_marker",
    "said_marker",
    "seed_run",
    "step_event",
    "story_run",
    "web_daemon",
]


@contextlib.contextmanager
def other_site(body: bytes = b"<!doctype html><p>another site</p>") -> Iterator[int]:
    """Another site's server on loopback, answering every ``GET`` with the page ``body``; yields
    its port (``http://127.0.0.1:PORT`` and ``http://localhost:PORT`` are two origins of it).
    On loopback too: chromium's local-network rules, which refuse a public page's requests to
    loopback by themselves (and which not every browser has), are not what is tested, the
    daemon's answers are."""

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def raw_marker(token: str) -> str:
    return f"RAWTHOUGHT-{token}"


def said_marker(token: str) -> str:
    """In a ``fake:story-outage`` provider's error text (the failure's own words), if a token."""
    return f"PROVIDERSAID-{token}" if token else ""


STORY_PROMPT = "Plan a day trip from Lisbon to Porto tomorrow"


def story_run(token: str, delay: float = 0.0, prompt: str = STORY_PROMPT) -> dict[str, Any]:
    """The ``POST /v1/runs`` body of a ``fake:story`` run."""
    return {
        "prompt": prompt,
        "model": "fake:story",
        "chain_of_thought": "surface",
        "tools": ["check_weather", "find_trains"],
        "system": f"token={token} delay={delay}",
    }


def _args(request: TurnRequest) -> tuple[str, float]:
    fields = dict(part.split("=", 1) for part in (request.system or "").split() if "=" in part)
    return fields.get("token", ""), float(fields.get("delay", "0"))


NARRATING: dict[str, Any] = {"visible_reasoning": {"summarizers": ["narration", "phases"]}}
"""The operator's choice in the web daemon: visible steps from narration and phases."""

STEP_TITLES = [
    "The trip depends on the weather in Porto.",
    "Sunny all day, so the trip is on.",
    "Putting the plan together",
]
"""The visible steps of a ``fake:story`` run (what it narrated outside a tool call), in order."""

TOOL_WHYS = [["Checking the forecast"], ["Finding a morning train"]]
"""What it narrated beside each tool call: shown on that tool's card."""

STORY_ANSWER = (
    "Take the 09:12 train from Lisbon to Porto: it arrives at 12:05, and Porto will be sunny "
    "and 24 °C all afternoon."
)

_TURNS: list[tuple[str, str, list[str], tuple[str, dict[str, Any]] | None]] = [
    (
        "**Weighing the forecast**\n\nRain would spoil a walking day, so weather decides.",
        "user wants a day trip; weather first, then trains. ",
        [STEP_TITLES[0], *TOOL_WHYS[0]],
        ("check_weather", {"city": "Porto"}),
    ),
    (
        "**Choosing a morning train**\n\nA morning departure leaves the most time there.",
        "sunny, good. trains next; prefer arrival before noon-ish. ",
        [STEP_TITLES[1], *TOOL_WHYS[1]],
        ("find_trains", {"origin": "Lisbon", "destination": "Porto"}),
    ),
    (
        "**Drafting the plan**\n\nOne train and the forecast answer the question.",
        "09:12 arrives 12:05, fine. write it short. ",
        [STEP_TITLES[2]],
        None,
    ),
]


def _story(request: TurnRequest, turn: int) -> AsyncIterator[Any]:
    token, delay = _args(request)

    async def gen() -> AsyncIterator[Any]:
        if turn < len(_TURNS):
            summary, raw, notes, call = _TURNS[turn]
            yield reasoning(summary + "\n\n", kind="summary", index=1)
            await asyncio.sleep(delay)
            yield reasoning(f"{raw}{raw_marker(token) if token else ''}".rstrip() + "\n\n")
            await asyncio.sleep(delay)
            for i, note in enumerate(notes):
                yield tool_call("visible_step", {"summary": note}, call_id=f"call_note_{turn}_{i}")
            if call is not None:
                name, arguments = call
                yield tool_call(name, arguments, call_id=f"call_{name}_{turn}")
            return
        words = STORY_ANSWER.split(" ")
        for i, word in enumerate(words):
            yield text(word if i == 0 else " " + word)
            await asyncio.sleep(delay / 4)

    return gen()


SAID_FIRST = "Let me check the weather in Porto first."
"""What a ``fake:saytool`` run says before its tool call (it stays there, before the card)."""
SAID_ANSWER = "Porto will be sunny: go."


def _saytool(request: TurnRequest, turn: int) -> AsyncIterator[Any]:
    """``fake:saytool``: turn 1 thinks, says :data:`SAID_FIRST` word by word, then calls
    ``check_weather``; turn 2 answers :data:`SAID_ANSWER`. ``delay=D`` paces it."""
    token, delay = _args(request)

    async def gen() -> AsyncIterator[Any]:
        if turn == 0:
            yield reasoning(f"weather decides it. {raw_marker(token) if token else ''}")
            for i, word in enumerate(SAID_FIRST.split(" ")):
                yield text(word if i == 0 else " " + word)
                await asyncio.sleep(delay / 4)
            await asyncio.sleep(delay)
            yield tool_call("check_weather", {"city": "Porto"}, call_id="call_weather")
            return
        await asyncio.sleep(delay)
        for i, word in enumerate(SAID_ANSWER.split(" ")):
            yield text(word if i == 0 else " " + word)
            await asyncio.sleep(delay / 4)

    return gen()


def _story_outage(request: TurnRequest, turn: int) -> AsyncIterator[Any]:
    """``fake:story-outage``: the story's first turn (it checks the weather), then the provider
    is overloaded: a failed run whose error belongs to its second model turn. The provider's
    text (``by_provider``, as an adapter marks it) carries :func:`said_marker` of the run's
    token: it is the developer-only ``error_detail`` (ADR 0073)."""
    if turn == 0:
        return _story(request, turn)
    token, _ = _args(request)
    return failing(
        ProviderHTTPError(
            f"Overloaded {said_marker(token)}".strip(),
            provider="anthropic",
            status=529,
            error_type="overloaded_error",
            by_provider=True,
        )
    )


MIRROR_STEP = "Opening report\u202efdp.exe"
"""The visible step a ``fake:mirror`` run narrates (its own words: a step quoting the prompt
would quote a tool's input, which policy withholds)."""


def _mirror(request: TurnRequest, turn: int) -> Iterator[Any]:
    """``fake:mirror``: the run's prompt, as it is, in each place the page shows what a model
    chose: a tool's input and output (``lookup``), a tool's error (``explode`` quotes its input),
    a tool's name (no tool has it: an unknown tool's card) and the answer (``Echo: PROMPT``);
    and a visible step, :data:`MIRROR_STEP`."""
    prompt = request.messages[0].text if request.messages else ""
    if turn == 0:
        yield tool_call("visible_step", {"summary": MIRROR_STEP}, call_id="call_mirror_step")
        yield tool_call("lookup", {"query": prompt}, call_id="call_mirror_lookup")
    elif turn == 1:
        yield tool_call("explode", {"query": prompt}, call_id="call_mirror_explode")
    elif turn == 2:
        yield tool_call(prompt, {}, call_id="call_mirror_unknown")  # no tool has that name
    else:
        yield text(f"Echo: {prompt}")


SCRIPTS: dict[str, ScriptFn] = {
    "story": _story,
    "saytool": _saytool,
    "story-outage": _story_outage,
    "mirror": _mirror,
}
"""The web tests' fake scripts by name, for ``support.fakes``."""


@tool
def check_weather(city: str) -> str:
    """The weather forecast for a city today."""
    return f"{city}: sunny, 24 °C, light wind"


@tool
def find_trains(origin: str, destination: str) -> str:
    """Morning trains between two cities."""
    return f"{origin} -> {destination}: 07:05 (arr 10:02), 09:12 (arr 12:05)"


WEB_TOOLS = [check_weather, find_trains, *SERVER_TOOLS]  # + lookup, dangerous (approval)


# --------------------------------------------------------------------------- seeded runs


def step_event(etype: str, step_id: str, summary: Any, **extra: Any) -> NewEvent:
    """A visible-reasoning event (``cot.step`` and kin) as the pipeline writes one."""
    payload = {
        "marker": VISIBLE_MARKER,
        "step_id": step_id,
        "summary": summary,
        "phase": "thinking",
        "ts": 1.0,
        "tool_call_id": None,
        "source": "provider_summary",
        **extra,
    }
    return NewEvent(etype, payload)


SEEDED_SECRET = "SEEDED-SECRET-REASONING"

SEEDED_EVENTS = [
    NewEvent("run.started", {"prompt": "seeded"}),
    step_event("cot.step", "s1", "Reading the request"),
    NewEvent("cot.step", {"step_id": "s2", "summary": "unmarked step", "phase": "thinking"}),
    step_event("cot.step", "s3", 42),  # malformed summary
    step_event("cot.phase", "s4", "Bad phase", phase="pondering"),
    step_event("cot.step", "s5", "   "),  # blank
    step_event("cot.tool.reasoning", "s6", "Why the tool", tool_call_id="call_missing"),
    NewEvent(
        "agent.response",
        {"turn": 0, "answer": "", "reasoning": f"{SEEDED_SECRET} in a provider field"},
    ),
    NewEvent(
        "tool.started",
        {
            "call_id": "c1",
            "tool_key": "lookup",
            "label": "Look it up",
            "input": {"q": f"{SEEDED_SECRET} as tool input"},
        },
    ),
    step_event("cot.tool.reasoning", "s7", "Looking it up", tool_call_id="c1"),
    NewEvent(
        "tool.completed",
        {
            "call_id": "c1",
            "tool_key": "lookup",
            "output": f"reasoning: {SEEDED_SECRET} as tool output",
        },
    ),
    NewEvent("cot.completed", {"marker": "wrong", "receipt": {}}),
    NewEvent("message.delta", {"text": "Done."}),
    NewEvent("message.completed", {"text": "Done.", "reasoning": SEEDED_SECRET}),
    NewEvent("run.settlement.completed", {"status": "completed"}),
]


def seed_run(
    run_id: str,
    events: Sequence[NewEvent],
    *,
    mode: str = "surface",
    prompt: str = "seeded",
    status: RunStatus = "completed",
    error: str | None = None,
) -> Callable[[EventStore], Awaitable[None]]:
    """A seeder for :func:`web_daemon`: a run recorded straight into the store, as given."""

    async def seed(store: EventStore) -> None:
        # Created open, its events appended, then given its status: a run stored ended takes
        # no further events (ADR 0134), whatever its log holds.
        await store.create_run(
            RunRecord(run_id, prompt, model="fake:seeded", chain_of_thought=mode, status="running")
        )
        await store.append(run_id, list(events))
        await store.update_run(run_id, status=status, **({"error": error} if error else {}))

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

    async def apply_seeds() -> None:
        for seed in seeds:
            await seed(store)

    keys = _off_loop(lambda: seed_keys(store))
    _off_loop(lambda: asyncio.run(apply_seeds()))
    settings = Config.from_mapping({**NARRATING, **(config or {})})
    app = create_app(store, settings, tools=ToolRegistry(WEB_TOOLS), **app_options)
    try:
        with ThreadServer(app) as server:
            yield Daemon(server.base_url, keys, store, app)
    finally:
        _off_loop(lambda: asyncio.run(store.close()))


def _off_loop(fn: Callable[[], T]) -> T:
    """Run ``fn`` (which may call ``asyncio.run``) in a thread of its own: the caller's thread
    may already run an event loop (Playwright's sync API keeps one running)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(fn).result()
