"""Fault injection, each case bounded in time: the daemon killed mid-run, provider streams cut at
every byte, readers dropping and resuming at random (also across PostgreSQL replicas), a store
that is full or loses its connections mid-run, and a thousand readers on one run.

What a user relies on in every case: no event that was committed (and so possibly shown to
someone) is ever lost or duplicated, sequence numbers have no gaps, a batch is stored whole or not
at all, and a run that cannot go on ends with a terminal event that says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import httpx
import psycopg
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from support.daemon import PG_START_S, Daemon, ServeProcess, running_daemon
from support.faults import (
    TOOLS_FLAG,
    Attempt,
    FailingStore,
    Frame,
    RawSSE,
    Replicas,
    ends_run,
    event_frames,
    follow,
    pg_schema_sync,
    replicas,
    start_run,
    stored_batches_are_whole,
    stored_run,
    ticker_prompt,
)
from support.pg import PG_URL
from support.store_conformance import make_run

from thoughtgate.errors import StoreError, StoreUnavailableError
from thoughtgate.events.schema import Event, EventType, NewEvent, is_run_terminal
from thoughtgate.orchestration.runtime import RunRequest, Runtime
from thoughtgate.providers.anthropic import AnthropicProvider
from thoughtgate.providers.base import Provider, ProviderSettings
from thoughtgate.providers.openai_compatible import OpenAICompatibleProvider
from thoughtgate.providers.openai_responses import OpenAIResponsesProvider
from thoughtgate.providers.openrouter import OpenRouterProvider
from thoughtgate.store.base import EventStore, RunEnding
from thoughtgate.store.leases import close_run_interrupted
from thoughtgate.store.memory import MemoryStore
from thoughtgate.store.postgres import PostgresStore
from thoughtgate.store.records import RunRecord
from thoughtgate.store.sqlite import SQLiteStore

FIXTURES = Path(__file__).parent / "fixtures"


def _delta_steps(events: list[dict[str, Any]] | list[Event], kind: str) -> list[int]:
    """The step numbers of ``fake:ticker``'s deltas of one kind (``r`` or ``t``), in log order."""
    wanted = EventType.REASONING_DELTA if kind == "r" else EventType.MESSAGE_DELTA
    out = []
    for e in events:
        etype, payload = (e["type"], e["payload"]) if isinstance(e, dict) else (e.type, e.payload)
        if etype == wanted:
            out.append(int(str(payload["text"]).strip()[1:]))
    return out


# =============================================================================== kill -9


@pytest.mark.timeout(180)  # two daemon starts: up to a minute each on a loaded machine
@pytest.mark.parametrize("durable", [False, True], ids=["closed", "resumed"])
async def test_kill_9_mid_run_loses_and_duplicates_nothing_a_reader_saw(
    tmp_path: Path, durable: bool
) -> None:
    """Without durable runs the restarted daemon closes the run; with them (ADR 0013) it resumes
    it, the cut turn recorded as cut and asked again. Either way a reader lost nothing it saw."""
    db_url = f"sqlite:///{tmp_path / 'daemon.db'}"
    env = {} if durable else {"THOUGHTGATE_DURABILITY__ENABLED": "false"}
    server = ServeProcess("--db", db_url, *TOOLS_FLAG, env=env).start(expect_key=True)
    again: ServeProcess | None = None
    try:
        key = server.bootstrap_key
        assert key
        run_id, ticket = start_run(server.base_url, key, ticker_prompt(400, 10))
        conn = await RawSSE.open(server.base_url, run_id, ticket)
        received: list[Frame] = []
        async for frame in conn.frames():  # until the connection dies with the server
            received.append(frame)
            if len(received) == 60:
                assert server.proc is not None
                server.proc.kill()  # SIGKILL: no drain, no goodbye, possibly mid-append
        await conn.close()
        assert server.proc is not None and server.proc.wait(timeout=10) == -9
        assert len(received) >= 60 and not ends_run(received[-1])  # it died mid-run

        flags = TOOLS_FLAG if durable else ()  # a replica that can run it (its fake script)
        again = ServeProcess("--db", db_url, *flags, "--no-bootstrap-key", env=env).start()
        if durable:
            resumed = await follow(again.base_url, run_id, ticket, last_event_id=received[-1].id)
            assert ends_run(event_frames(resumed)[-1])
        run, stored = stored_run(again.base_url, key, run_id)
        # every event the live reader got before the kill is stored, byte for byte, in place
        assert [f.json() for f in received] == stored[: len(received)]
        assert [e["seq"] for e in stored] == list(range(1, len(stored) + 1))
        types = [e["type"] for e in stored]
        cut = types.index(EventType.RUN_RESUMED) if durable else len(stored)
        for kind in "rt":  # no delta twice, none missing before the cut
            steps = _delta_steps(stored[:cut], kind)
            assert steps == list(range(len(steps)))
        assert not {EventType.RUN_FAILED, EventType.RUN_ERROR} & set(types)
        if durable:  # the cut turn is recorded as cut, the run asks again and completes
            assert (
                types.count(EventType.RUN_RESUMED) == 1 and EventType.RUN_INTERRUPTED not in types
            )
            turns = [e["payload"] for e in stored if e["type"] == EventType.AGENT_RESPONSE]
            assert [t["complete"] for t in turns] == [False, True] and "cut" in turns[0]["error"]
            assert run["status"] == "completed"
        else:
            assert types[-1] == EventType.RUN_INTERRUPTED
            assert types.count(EventType.RUN_INTERRUPTED) == 1
            assert run["status"] == "interrupted"
        # a reader resuming on the restarted daemon gets the rest and the end, nothing twice
        rest = await follow(again.base_url, run_id, ticket, last_event_id=received[-1].id)
        assert [f.json() for f in received + event_frames(rest)] == stored
    finally:
        server.stop()
        if again is not None:
            again.stop()


# =============================================================================== cut streams

PROVIDERS: dict[str, tuple[type[Any], str]] = {
    "anthropic": (AnthropicProvider, "anthropic:claude-sonnet-4-5"),
    "openrouter": (OpenRouterProvider, "openrouter:z-ai/glm-4.6"),
    "openai_responses": (OpenAIResponsesProvider, "openai:gpt-5"),
    "compat": (OpenAICompatibleProvider, "openai-compatible:deepseek-reasoner"),
}
SHORT = {  # every byte offset
    "anthropic": "adaptive_text_first.sse",
    "openrouter": "reasoning_string_only.sse",
    "openai_responses": "raw_reasoning_text.sse",
    "compat": "vllm_reasoning.sse",
}
LONG = {  # sampled offsets
    "anthropic": "thinking_text.sse",
    "openrouter": "anthropic_thinking.sse",
    "openai_responses": "summary_then_message.sse",
    "compat": "deepseek_reasoner.sse",
}


class _CutBody(httpx.AsyncByteStream):
    """The first ``len(data)`` bytes of a transcript, then (if ``cut``) the connection drops."""

    def __init__(self, data: bytes, *, cut: bool) -> None:
        self.data = data
        self.cut = cut

    async def __aiter__(self) -> Any:
        if self.data:
            yield self.data
        if self.cut:
            raise httpx.RemoteProtocolError("peer closed connection without sending complete body")


class CutRunner:
    """Runs tasks through the real runtime with a provider whose stream is cut at an offset."""

    def __init__(self, fmt: str, transcript: str) -> None:
        self.cls, self.model = PROVIDERS[fmt]
        self.data = (FIXTURES / fmt / transcript).read_bytes()
        self.store = MemoryStore()
        self.served = b""
        self.runtime = Runtime(self.store, provider_factory=self._provider)

    def _provider(self, model: str) -> Provider:
        served, cut = self.served, self.served != self.data

        def handler(request: httpx.Request) -> httpx.Response:
            headers = {"content-type": "text/event-stream", "request-id": "req_cut"}
            return httpx.Response(200, headers=headers, stream=_CutBody(served, cut=cut))

        settings = ProviderSettings(base_url="http://replay.invalid/v1", api_key="k", max_retries=0)
        client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
        provider: Provider = self.cls(model.partition(":")[2], settings, client=client)
        return provider

    async def run(self, offset: int) -> tuple[str, list[Event]]:
        self.served = self.data[:offset]
        request = RunRequest("Why is the sky blue?", model=self.model, chain_of_thought="surface")
        run = await self.runtime.run(request)  # never raises: a cut is not a crash
        return run.status, await self.store.read(run.run_id)


def _one(events: list[Event], etype: str) -> Event:
    found = [e for e in events if e.type == etype]
    assert len(found) == 1, (etype, [e.type for e in events])
    return found[0]


async def _full_turn(runner: CutRunner) -> dict[str, Any]:
    runner.served = runner.data
    run = await runner.runtime.run(
        RunRequest("Why is the sky blue?", model=runner.model, chain_of_thought="surface")
    )
    assert run.status == "completed"
    events = await runner.store.read(run.run_id)
    full = _one(events, EventType.AGENT_RESPONSE).payload
    assert full["complete"] and full["reasoning"] and full["answer"]
    return full


def _without_call(payload: Any) -> dict[str, Any]:
    return {k: v for k, v in payload.items() if k != "call"}


def _check_cut(status: str, events: list[Event], full: dict[str, Any], offset: int) -> None:
    response = _one(events, EventType.AGENT_RESPONSE).payload
    deltas = {
        t: "".join(str(e.payload["text"]) for e in events if e.type == t)
        for t in (EventType.MESSAGE_DELTA,)
    }
    if status == "completed":  # only a cut after the stream's last event can complete
        assert events[-1].type == EventType.RUN_SETTLEMENT_COMPLETED, offset
        # the same turn, recorded alike; only when it was sent and answered differs (``call``)
        assert _without_call(response) == _without_call(full), offset
        return
    # some answer text arrived: partial; none did: failed (an outage is never an answer)
    outcome, terminal = (
        ("partial", EventType.RUN_SETTLEMENT_COMPLETED)
        if response["answer"]
        else ("failed", EventType.RUN_FAILED)
    )
    assert status == outcome and events[-1].type == terminal, offset
    ended = _one(events, EventType.MESSAGE_PARTIALLY_COMPLETED).payload
    assert ended["reason"] == "provider_error" and ended["error"], offset
    assert response["complete"] is False, offset
    assert full["reasoning"].startswith(response["reasoning"]), offset
    assert full["answer"].startswith(response["answer"]), offset
    assert ended["text"] == response["answer"], offset
    # what live readers were sent is exactly what the partial turn recorded: nothing lost
    assert deltas[EventType.MESSAGE_DELTA] == response["answer"], offset
    assert _reasoning_from_deltas(events) == response["reasoning"], offset


def _reasoning_from_deltas(events: list[Event]) -> str:
    """The reasoning a live reader rebuilds: deltas joined per part (``index``), parts by a
    blank line, as the turn's ``reasoning_text`` joins them."""
    parts: dict[int, list[str]] = {}
    for e in events:
        if e.type == EventType.REASONING_DELTA:
            parts.setdefault(int(e.payload["index"]), []).append(str(e.payload["text"]))
    return "\n\n".join("".join(texts) for texts in parts.values())


@pytest.mark.parametrize("fmt", sorted(SHORT))
async def test_a_stream_cut_at_every_byte_ends_the_task_partially_completed(fmt: str) -> None:
    runner = CutRunner(fmt, SHORT[fmt])
    full = await _full_turn(runner)
    for offset in range(len(runner.data)):
        status, events = await runner.run(offset)
        _check_cut(status, events, full, offset)


_LONG_RUNNERS: dict[str, tuple[CutRunner, dict[str, Any]]] = {}


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fmt=st.sampled_from(sorted(LONG)), fraction=st.floats(0.0, 1.0))
async def test_a_long_stream_cut_at_sampled_bytes_ends_partially_completed(
    fmt: str, fraction: float
) -> None:
    if fmt not in _LONG_RUNNERS:
        runner = CutRunner(fmt, LONG[fmt])
        _LONG_RUNNERS[fmt] = (runner, await _full_turn(runner))
    runner, full = _LONG_RUNNERS[fmt]
    offset = int(len(runner.data) * fraction)
    status, events = await runner.run(offset)
    _check_cut(status, events, full, offset)


# =============================================================================== resume machine


class ResumeMachine(RuleBasedStateMachine):
    """A live reader that drops its connection at random points and resumes on any replica.

    The run executes on ``urls[0]``; each example starts a fresh run that stays live for over half a
    second, so the reader is dropped and resumed while events are still being appended.
    """

    urls: ClassVar[list[str]] = []
    start: ClassVar[Callable[[], tuple[str, str]]]
    stored: ClassVar[Callable[[str], list[dict[str, Any]]]]

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.run_id, self.ticket = type(self).start()
        self.seen: list[Frame] = []
        self.conn: RawSSE | None = None
        self.frames: Any = None
        self.ended = False

    def _await(self, coro: Any, timeout: float = 10) -> Any:
        return self.loop.run_until_complete(asyncio.wait_for(coro, timeout))

    @precondition(lambda self: self.conn is None and not self.ended)
    @rule(replica=st.integers(0, 1), via=st.sampled_from(["header", "query"]))
    def connect(self, replica: int, via: str) -> None:
        url = self.urls[replica % len(self.urls)]
        last = self.seen[-1].id if self.seen else None
        conn = self._await(RawSSE.open(url, self.run_id, self.ticket, last_event_id=last, via=via))
        if conn.status == 204:  # resumed after the end
            assert self.seen and ends_run(self.seen[-1])
            self.ended = True
            self._await(conn.close())
            return
        assert conn.status == 200
        self.conn, self.frames = conn, conn.frames()

    @precondition(lambda self: self.conn is not None)
    @rule(count=st.integers(1, 30))
    def read(self, count: int) -> None:
        for _ in range(count):
            try:
                frame = self._await(anext(self.frames))
            except StopAsyncIteration:  # the server ended the response after the terminal event
                self.drop()
                return
            if frame.id is None:
                continue
            self.seen.append(frame)
            if ends_run(frame):
                self.ended = True

    @precondition(lambda self: self.conn is not None)
    @rule()
    def drop(self) -> None:
        """Close the socket without reading what is in flight (frames are lost, not skipped)."""
        assert self.conn is not None
        self.conn.abort()
        self._await(self.frames.aclose())
        self.conn = self.frames = None

    @rule(seconds=st.sampled_from([0.0, 0.03, 0.1]))
    def wait(self, seconds: float) -> None:
        time.sleep(seconds)

    @invariant()
    def no_gap_no_duplicate_order_kept(self) -> None:
        assert [f.id for f in self.seen] == list(range(1, len(self.seen) + 1))

    def teardown(self) -> None:
        try:
            if self.conn is not None:
                self.drop()
            if not self.ended:
                last = self.seen[-1].id if self.seen else None
                rest = self._await(
                    follow(self.urls[0], self.run_id, self.ticket, last_event_id=last)
                )
                self.seen += event_frames(rest)
            assert ends_run(self.seen[-1])
            assert [f.json() for f in self.seen] == type(self).stored(self.run_id)
        finally:
            self.loop.close()


def _machine(
    urls: list[str], start: Callable[[], tuple[str, str]], stored: Callable[[str], Any]
) -> type[ResumeMachine]:
    return type(
        "Machine",
        (ResumeMachine,),
        {"urls": urls, "start": staticmethod(start), "stored": staticmethod(stored)},
    )


# Live timing differs between runs, so a failing example cannot be replayed exactly: report the
# first one found instead of shrinking it.
MACHINE_SETTINGS = settings(
    max_examples=6,
    stateful_step_count=20,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow],
)


@pytest.fixture(scope="module")
def sqlite_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with running_daemon(sqlite_dir=tmp_path_factory.mktemp("faults")) as daemon:
        yield daemon


@pytest.mark.timeout(90)
def test_readers_dropping_and_resuming_at_random_see_every_event_once(
    sqlite_daemon: Daemon,
) -> None:
    daemon = sqlite_daemon

    def start() -> tuple[str, str]:
        run_id = daemon.start_run(
            {"prompt": ticker_prompt(40, 15), "model": "fake:ticker", "chain_of_thought": "surface"}
        )
        return run_id, daemon.ticket(run_id, "owner")

    def stored(run_id: str) -> Any:
        return daemon.get(f"/v1/runs/{run_id}/events", "owner", params={"limit": 5000}).json()[
            "events"
        ]

    run_state_machine_as_test(
        _machine([daemon.base_url], start, stored),
        settings=MACHINE_SETTINGS,
    )


@pytest.fixture(scope="module")
def pg_pair() -> Iterator[Replicas]:
    with replicas() as pair:
        yield pair


@pytest.mark.postgres
@pytest.mark.timeout(PG_START_S + 90)  # its fixture starts the replicas
def test_readers_resuming_across_postgres_replicas_see_every_event_once(
    pg_pair: Replicas,
) -> None:
    a, b = pg_pair.urls

    def start() -> tuple[str, str]:
        run_id = pg_pair.start_run(a, ticker_prompt(40, 15))
        return run_id, pg_pair.ticket(b, run_id)

    run_state_machine_as_test(
        _machine([a, b], start, lambda run_id: pg_pair.events(b, run_id)),
        settings=settings(MACHINE_SETTINGS, max_examples=5),
    )


# =============================================================================== store faults


async def test_sqlite_disk_full_mid_run_fails_it_clearly_and_stores_whole_batches(
    tmp_path: Path,
) -> None:
    inner = await SQLiteStore.open(tmp_path / "full.db", max_bytes=300 * 1024)
    store = FailingStore(inner)  # injects nothing here: it only records each batch's outcome
    try:
        runtime = Runtime(store)
        run = await runtime.create_run(
            RunRequest(ticker_prompt(5000, 0), model="fake:ticker", chain_of_thought="surface")
        )
        with pytest.raises(StoreError, match="database or disk is full"):
            await asyncio.wait_for(runtime.execute(run.run_id), 30)
        log = await store.read(run.run_id)
        stored_batches_are_whole(store.attempts, log)
        first_failure = next(i for i, a in enumerate(store.attempts) if a.stored is None)
        after = [a.stored for a in store.attempts[first_failure:] if a.stored is not None]
        # Nothing of the run went on after the failed batch: at most its closing events fitted
        # (the task ended failed, then the run's terminal event).
        closing = {EventType.TASK_COMPLETED, EventType.RUN_FAILED}
        stored_after = [e for out in after for e in out]
        assert all(e.type in closing for e in stored_after), [e.type for e in stored_after]
        assert all(
            e.payload.get("status") == "failed"
            for e in stored_after
            if e.type == EventType.TASK_COMPLETED
        )
        if after:
            assert "database or disk is full" in log[-1].payload["error"]
        # The run's end is one batch with its state (``finish_run``): stored, the run reads
        # failed; when only the task's end fitted, the run is still open, its end left to the
        # lease sweep once the store takes writes again -- never shown ended otherwise.
        ended = any(e.type == EventType.RUN_FAILED for e in stored_after)
        status = (await store.get_run(run.run_id)).status
        assert status == ("failed" if ended else "running")
        for kind in "rt":  # the stored deltas are a gap-free prefix of what the model said
            steps = _delta_steps(log, kind)
            assert steps == list(range(len(steps)))
    finally:
        await inner.close()


async def test_a_failed_background_flush_fails_the_run_instead_of_leaving_a_hole() -> None:
    """The store refuses one batch of buffered deltas, then works again: the run must not carry
    on recording after a hole in its log (it ends ``run.failed`` naming the error)."""
    store = FailingStore(MemoryStore())
    runtime = Runtime(store)
    run = await runtime.create_run(
        RunRequest(ticker_prompt(60, 2), model="fake:ticker", chain_of_thought="surface")
    )
    original = store.append

    async def append_once_failing(run_id: str, events: Any, **fenced: Any) -> list[Event]:
        batch = list(events)
        is_window = len(batch) > 1 and all(e.type.endswith(".delta") for e in batch)
        if is_window and not any(a.stored is None for a in store.attempts):
            store.fail_appends = True  # a flusher's batch: the store is briefly full
        try:
            return await original(run_id, batch, **fenced)
        finally:
            store.fail_appends = False

    store.append = append_once_failing  # type: ignore[method-assign]
    with pytest.raises(StoreError, match="injected"):
        await asyncio.wait_for(runtime.execute(run.run_id), 10)
    log = await store.read(run.run_id)
    stored_batches_are_whole(store.attempts, log)
    assert log[-1].type == EventType.RUN_FAILED and "injected" in log[-1].payload["error"]
    assert (await store.get_run(run.run_id)).status == "failed"
    for kind in "rt":
        steps = _delta_steps(log, kind)
        assert steps == list(range(len(steps))), "a delta after the hole was recorded"


class LosingEndStore(FailingStore):
    """The first ``lose`` tries to record a run's end fail as a killed connection would:
    before the statement (``committed=False``) or after its commit, the reply lost."""

    def __init__(self, inner: EventStore, lose: int, *, committed: bool = False) -> None:
        super().__init__(inner)
        self.lose = lose
        self.committed = committed
        self.tries = 0

    async def finish_run(
        self, run_id: str, events: Sequence[NewEvent], ending: RunEnding
    ) -> list[Event]:
        self.tries += 1
        if self.tries > self.lose:
            return await super().finish_run(run_id, events, ending)
        if self.committed:
            await self.inner.finish_run(run_id, events, ending)
        self.attempts.append(Attempt(list(events), None, unknown=True))
        raise StoreUnavailableError(f"cannot finish run {run_id!r}: connection lost (injected)")


@pytest.mark.parametrize("committed", [False, True], ids=["refused", "reply-lost"])
async def test_an_end_lost_with_its_connection_is_recorded_again_exactly_once(
    committed: bool,
) -> None:
    """Recording a run's end is tried again when the store connection is lost: the run ends
    with exactly one terminal event and the caller sees its real outcome -- also when the lost
    try had committed (the next one then finds the run closed and adds nothing)."""
    store = LosingEndStore(MemoryStore(), lose=2, committed=committed)
    runtime = Runtime(store)
    runtime.end_retry = (0.01, 0.01, 0.01)
    run = await runtime.create_run(
        RunRequest(ticker_prompt(3, 0), model="fake:ticker", chain_of_thought="surface")
    )
    ended = await asyncio.wait_for(runtime.execute(run.run_id), 10)
    assert ended.status == "completed"
    log = await store.read(run.run_id)
    assert [e.type for e in log if is_run_terminal(e.type)] == [EventType.RUN_SETTLEMENT_COMPLETED]
    assert log[-1].type == EventType.RUN_SETTLEMENT_COMPLETED
    assert [e.type for e in log].count(EventType.TASK_COMPLETED) == 1
    assert store.tries == 3  # two lost, the third answered


async def test_an_end_that_cannot_be_stored_is_not_reported_as_success() -> None:
    """Every try to record the end fails: the error reaches the caller, nothing in the store
    claims the run ended, and the run is left to the lease sweep (ADR 0009)."""
    store = LosingEndStore(MemoryStore(), lose=100)
    runtime = Runtime(store)
    runtime.end_retry = (0.01, 0.01, 0.01)
    run = await runtime.create_run(
        RunRequest(ticker_prompt(3, 0), model="fake:ticker", chain_of_thought="surface")
    )
    with pytest.raises(StoreUnavailableError, match="connection lost"):
        await asyncio.wait_for(runtime.execute(run.run_id), 10)
    assert store.tries == 4
    assert not any(is_run_terminal(e.type) for e in await store.read(run.run_id))
    assert (await store.get_run(run.run_id)).status == "running"


class LosingReadBackStore(FailingStore):
    """Once the run's end is stored, the next ``get_run`` fails as a killed connection would."""

    def __init__(self, inner: EventStore) -> None:
        super().__init__(inner)
        self.ended = False
        self.lost_reads = 0

    async def finish_run(
        self, run_id: str, events: Sequence[NewEvent], ending: RunEnding
    ) -> list[Event]:
        out = await super().finish_run(run_id, events, ending)
        self.ended = True
        return out

    async def get_run(self, run_id: str, *, apart: bool = True) -> RunRecord:
        if self.ended and not self.lost_reads:
            self.lost_reads += 1
            raise StoreUnavailableError(f"cannot read run {run_id!r}: connection lost (injected)")
        return await super().get_run(run_id, apart=apart)


async def test_a_read_back_lost_with_its_connection_after_the_end_still_returns_the_run() -> None:
    """The run's end is stored, then reading it back loses the connection: ``execute`` tries
    the read again and returns the completed run instead of reporting an error."""
    store = LosingReadBackStore(MemoryStore())
    runtime = Runtime(store)
    runtime.end_retry = (0.01, 0.01, 0.01)
    run = await runtime.create_run(
        RunRequest(ticker_prompt(3, 0), model="fake:ticker", chain_of_thought="surface")
    )
    ended = await asyncio.wait_for(runtime.execute(run.run_id), 10)
    assert store.lost_reads == 1
    assert ended.status == "completed"
    assert ended.run_id == run.run_id


async def test_a_cancelled_runs_interruption_lost_with_its_connection_is_recorded_again() -> None:
    """Cancelling a run (Ctrl-C, a daemon shutdown) records ``run.interrupted``; a try lost
    with its store connection is made again, so the run does not stay running."""
    store = LosingEndStore(MemoryStore(), lose=1)
    runtime = Runtime(store)
    runtime.end_retry = (0.01, 0.01, 0.01)
    run = await runtime.create_run(
        RunRequest(ticker_prompt(100_000, 20), model="fake:ticker", chain_of_thought="surface")
    )
    task = asyncio.create_task(runtime.execute(run.run_id))
    while not any(e.type == EventType.TASK_STARTED for e in await store.read(run.run_id)):
        assert not task.done()
        await asyncio.sleep(0.01)
    task.cancel("stopped by the test")
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 10)
    assert store.tries == 2  # one lost, the next recorded
    assert (await store.get_run(run.run_id)).status == "interrupted"
    log = await store.read(run.run_id)
    assert [e.type for e in log if is_run_terminal(e.type)] == [EventType.RUN_INTERRUPTED]


def _logged(batches: Sequence[list[NewEvent]]) -> list[list[Event]]:
    """``batches`` as the store numbers them when each one commits, in order."""
    out: list[list[Event]] = []
    seq = 0
    for batch in batches:
        out.append([Event(seq := seq + 1, "run_x", e.type, e.payload) for e in batch])
    return out


_DELTAS = [NewEvent(EventType.MESSAGE_DELTA, {"text": "a"}), NewEvent(EventType.MESSAGE_DELTA)]
_END = [NewEvent(EventType.RUN_FAILED, {"status": "failed", "error": "the connection was lost"})]


@pytest.mark.unit
def test_a_run_end_retried_after_a_lost_try_that_did_not_commit_is_the_retrys() -> None:
    """Seen under load: the close retry's first try lost its connection before committing, the
    second stored the end. The log's end is the second try's, not the first's."""
    deltas, end = _logged([_DELTAS, _END])
    attempts = [
        Attempt(_DELTAS, deltas),
        Attempt(_END, None, unknown=True, finishing=True),
        Attempt(_END, end, finishing=True),
    ]
    stored_batches_are_whole(attempts, deltas + end)


@pytest.mark.unit
def test_a_run_end_retried_after_a_lost_try_that_committed_stores_nothing_more() -> None:
    deltas, end = _logged([_DELTAS, _END])
    attempts = [
        Attempt(_DELTAS, deltas),
        Attempt(_END, None, unknown=True, finishing=True),
        Attempt(_END, [], finishing=True),  # the run had ended: its own lost try committed
    ]
    stored_batches_are_whole(attempts, deltas + end)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("attempts", "logged"),
    [
        pytest.param([(_DELTAS, "stored"), (_END, "stored")], [_DELTAS], id="a stored end lost"),
        pytest.param([(_END, "unknown"), (_END, "stored")], [_END, _END], id="the run ended twice"),
        pytest.param([(_DELTAS, "failed")], [_DELTAS], id="a failed batch left events"),
        pytest.param([(_DELTAS, "stored"), (_END, "none")], [_DELTAS], id="an open run's end lost"),
        pytest.param([(_END, "stored"), (_DELTAS, "stored")], [_DELTAS, _END], id="out of order"),
    ],
)
def test_the_log_checker_still_finds_a_lost_or_extra_batch(
    attempts: list[tuple[list[NewEvent], str]], logged: list[list[NewEvent]]
) -> None:
    log = [e for batch in _logged(logged) for e in batch]
    made: list[Attempt] = []
    for batch, outcome in attempts:
        stored = {"stored": _logged([batch])[0], "none": []}.get(outcome)
        made.append(Attempt(batch, stored, unknown=outcome == "unknown", finishing=batch is _END))
    with pytest.raises(AssertionError):
        stored_batches_are_whole(made, log)


async def _kill(admin: psycopg.AsyncConnection[Any], application_name: str) -> int:
    cur = await admin.execute(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = %s",
        (application_name,),
    )
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def _sweep(store: EventStore, run_id: str, *, tries: int) -> None:
    """Close the run as interrupted if it is still open, as the lease sweep does. A try on a
    connection a kill left for dead fails and the pool drops that connection, so ``tries`` of
    one more than the pool's size always reach a live one."""
    for _ in range(tries - 1):
        with contextlib.suppress(StoreUnavailableError):
            await close_run_interrupted(store, run_id, "its lease expired")
            return
    await close_run_interrupted(store, run_id, "its lease expired")


@pytest.mark.postgres
@pytest.mark.timeout(60)
async def test_postgres_connections_killed_mid_run_lose_nothing_and_tails_recover() -> None:
    with pg_schema_sync() as schema:
        admin = await psycopg.AsyncConnection.connect(PG_URL, autocommit=True)
        writer_inner = await PostgresStore.open(PG_URL, schema=schema, pool_size=3)
        reader = await PostgresStore.open(PG_URL, schema=schema, pool_size=2)
        reader.safety_poll = 60.0  # only NOTIFY or a listener reconnect can deliver in time
        writer = FailingStore(writer_inner)
        try:
            runtime = Runtime(writer)
            run = await runtime.create_run(
                RunRequest(ticker_prompt(80, 10), model="fake:ticker", chain_of_thought="surface")
            )
            got: list[Event] = []

            async def tail() -> None:
                async for event in reader.tail(run.run_id):
                    got.append(event)

            tailing = asyncio.create_task(tail())
            executing = asyncio.create_task(runtime.execute(run.run_id))
            killed = 0
            for _ in range(4):  # between and during appends: pools, listener, notifier alike
                await asyncio.sleep(0.15)
                killed += await _kill(admin, f"thoughtgate:{schema}")
                killed += await _kill(admin, f"thoughtgate-listen:{schema}")
                killed += await _kill(admin, f"thoughtgate-notify:{schema}")
            assert killed >= 4
            try:
                done = await asyncio.wait_for(executing, 20)
                outcome = done.status
            except StoreUnavailableError as exc:  # a kill landed on an in-flight call
                outcome = "failed"
                assert "connection was lost" in str(exc)
                # pg_terminate_backend only signals: a connection killed in the same round can
                # pass the pool's check and be lost under the run's end too. Such a run has no
                # end in its log and stays open until the lease sweep closes it (ADR 0009): sweep
                # now, after the kills, as a daemon would once the run's lease expired.
                await _sweep(writer, run.run_id, tries=3 + 1)  # the writer's pool_size, plus one
            await asyncio.wait_for(tailing, 20)  # the tail ends at the terminal event
            log = await writer.read(run.run_id)
            stored_batches_are_whole(writer.attempts, log)
            assert [e.seq for e in got] == [e.seq for e in log]  # the tail missed nothing
            assert got == log
            for kind in "rt":
                steps = _delta_steps(log, kind)
                assert steps == list(range(len(steps)))
            if outcome == "completed":
                assert _delta_steps(log, "t") == list(range(80))
            elif log[-1].type == EventType.RUN_INTERRUPTED:  # its end was lost: the sweep's
                assert log[-1].payload["reason"] == "its lease expired"
                assert not any(e.type == EventType.RUN_FAILED for e in log)
            else:
                assert log[-1].type == EventType.RUN_FAILED
                assert "connection was lost" in log[-1].payload["error"]
        finally:
            await writer_inner.close()
            await reader.close()
            await admin.close()


@pytest.mark.postgres
async def test_a_killed_idle_postgres_connection_costs_no_call() -> None:
    """A pooled connection the server dropped while idle (restart, failover, an operator's
    pg_terminate_backend) is noticed before it is used: the caller's append still works."""
    with pg_schema_sync() as schema:
        async with await psycopg.AsyncConnection.connect(PG_URL, autocommit=True) as admin:
            store = await PostgresStore.open(PG_URL, schema=schema, pool_size=2)
            try:
                run = make_run()
                await store.create_run(run)
                for i in range(3):
                    assert await _kill(admin, f"thoughtgate:{schema}") >= 1
                    await asyncio.sleep(0.05)  # the server's goodbye reaches our socket
                    delta = NewEvent(EventType.MESSAGE_DELTA, {"text": f"t{i} "})
                    assert (await store.append_one(run.run_id, delta)).seq == i + 1
            finally:
                await store.close()


# =============================================================================== load


@pytest.mark.slow
@pytest.mark.timeout(180)  # a daemon start (up to a minute on a loaded machine), then the readers
async def test_a_thousand_live_readers_each_get_every_event(tmp_path: Path) -> None:
    readers = 1000
    # One key holds every reader: the per-key stream limit (512 by default, ADR 0155) is lifted.
    server = ServeProcess(
        "--db",
        f"sqlite:///{tmp_path / 'load.db'}",
        *TOOLS_FLAG,
        env={"THOUGHTGATE_QUOTAS__MAX_LIVE_STREAMS_PER_KEY": str(readers)},
    ).start(expect_key=True)
    try:
        key = server.bootstrap_key
        assert key
        # The model says nothing until every reader is connected, then 2 s of deltas.
        hold = tmp_path / "hold"
        hold.touch()
        run_id, ticket = start_run(server.base_url, key, ticker_prompt(40, 50, hold))
        started = time.monotonic()
        connected = asyncio.Semaphore(0)
        following = asyncio.gather(
            *(
                follow(server.base_url, run_id, ticket, on_first=connected.release)
                for _ in range(readers)
            )
        )
        for _ in range(readers):
            got = asyncio.ensure_future(connected.acquire())
            await asyncio.wait([got, following], timeout=60, return_when=asyncio.FIRST_COMPLETED)
            if not got.done():
                got.cancel()
                following.cancel()
                await asyncio.gather(following, return_exceptions=True)
                raise AssertionError(f"a reader ended or none connected in 60 s: {following!r}")
        hold.unlink()  # the run speaks
        results = await following
        elapsed = time.monotonic() - started
        _, stored = stored_run(server.base_url, key, run_id)
        expected = [e["seq"] for e in stored]
        assert expected == list(range(1, len(stored) + 1)) and len(stored) > 80
        for frames in results:
            assert [f.id for f in event_frames(frames)] == expected
            assert [f.json() for f in frames] == stored
        first_delta = next(float(e["ts"]) for e in stored if e["type"] == "message.delta")
        live = sum(frames[0].at < first_delta for frames in results)
        assert live == readers, f"only {live} readers were connected before the run spoke"
        assert elapsed < 60
    finally:
        server.stop()
