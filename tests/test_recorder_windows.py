"""The recorders' delta windows, in a clock that moves only when the loop sleeps: however many
runs stream at once and however their deltas are spaced, no delta waits longer than a window,
the first delta of a burst goes out at once, and nothing is recorded out of order (ADR 0056)."""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from thoughtgate.access.filter import filter_events
from thoughtgate.errors import StoreError
from thoughtgate.events.schema import Event, NewEvent
from thoughtgate.orchestration.recorder import EventRecorder
from thoughtgate.store.base import Holder
from thoughtgate.store.memory import MemoryStore
from thoughtgate.store.records import RunRecord

T = TypeVar("T")
WINDOW = 0.02


class _Instant(selectors.SelectSelector):
    """Polls without blocking; the time the loop would have slept moves its clock instead."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 1000.007

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        if not ready:
            if timeout is None:
                raise RuntimeError("the loop waits for nothing that time could bring")
            self.now += timeout
        return ready


class _VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock moves only when it would sleep: what happens at which instant
    is exact and the same on any machine (the stores here never leave the loop's thread)."""

    def __init__(self) -> None:
        self._clock = _Instant()
        super().__init__(self._clock)

    def time(self) -> float:
        return self._clock.now


def in_virtual_time(main: Callable[[], Awaitable[T]]) -> T:
    loop = _VirtualTimeLoop()
    try:
        return loop.run_until_complete(main())
    finally:
        loop.close()


def delta(i: int) -> NewEvent:
    """A delta of its own part (``turn`` = ``i``): never joined to its neighbours."""
    return NewEvent("message.delta", {"text": str(i), "turn": i})


def progress(i: int) -> NewEvent:
    card = {"call_id": "c", "tool_key": "t", "turn": i, "label": "t"}
    return NewEvent("tool.progress", {**card, "message": "working"})


class TimedStore(MemoryStore):
    """Notes the loop's clock at every append, with the ``turn`` of each event it carries."""

    def __init__(self) -> None:
        super().__init__()
        self.appends: list[tuple[str, float, list[int]]] = []

    async def append(
        self, run_id: str, events: Sequence[NewEvent], *, held_by: Holder | None = None
    ) -> list[Event]:
        now = asyncio.get_running_loop().time()
        self.appends.append((run_id, now, [e.payload["turn"] for e in events]))
        return await super().append(run_id, events, held_by=held_by)


# One run's plan: (pause before, is it a delta) per event; pauses of 0 make bursts.
_PLAN = st.lists(
    st.tuples(st.sampled_from([0.0, 0.0, 0.003, 0.007, 0.019, 0.02, 0.031]), st.booleans()),
    max_size=25,
)


@settings(max_examples=60)
@given(st.lists(_PLAN, min_size=1, max_size=5))
@pytest.mark.unit
def test_concurrent_recorders_keep_order_first_byte_and_the_window(
    plans: list[list[tuple[float, bool]]],
) -> None:
    """For any runs streaming at once: each run's log is its emission order; a delta is
    appended at most one window after it was emitted; a delta that starts a burst (the run
    appended nothing in the two windows before) is appended the moment it is emitted."""
    emitted: dict[str, list[tuple[int, float, bool]]] = {}

    async def stream(store: TimedStore, run_id: str, plan: list[tuple[float, bool]]) -> None:
        rec = EventRecorder(store, run_id, flush_interval=WINDOW)
        loop = asyncio.get_running_loop()
        mine = emitted.setdefault(run_id, [])
        for i, (pause, is_delta) in enumerate(plan):
            await asyncio.sleep(pause)
            mine.append((i, loop.time(), is_delta))
            await (rec.emit_delta(delta(i)) if is_delta else rec.emit(progress(i)))
        await asyncio.sleep(WINDOW)  # the last window closes on its own, before ``close``
        await rec.close()

    async def main() -> TimedStore:
        store = TimedStore()
        for n in range(len(plans)):
            await store.create_run(RunRecord(f"run_{n}", "p"))
        await asyncio.gather(*(stream(store, f"run_{n}", p) for n, p in enumerate(plans)))
        return store

    store = in_virtual_time(main)
    for n, plan in enumerate(plans):
        run_id = f"run_{n}"
        appends = [(at, turns) for rid, at, turns in store.appends if rid == run_id]
        assert [t for _, turns in appends for t in turns] == list(range(len(plan)))
        appended_at = {t: at for at, turns in appends for t in turns}
        for i, at, is_delta in emitted[run_id]:
            if not is_delta:
                continue
            assert appended_at[i] - at <= WINDOW + 1e-9, "a delta waited past its window"
            quiet = all(appended_at[j] < at - 2 * WINDOW for j in range(i))
            if quiet:  # (a window's end is never two windows after the run's last append)
                assert appended_at[i] == at, "the first delta of a burst was held back"


@pytest.mark.unit
def test_a_windowed_flush_that_fails_fails_the_next_emit() -> None:
    class Failing(TimedStore):
        async def append(
            self, run_id: str, events: Sequence[NewEvent], *, held_by: Holder | None = None
        ) -> list[Event]:
            if len(self.appends) == 1:  # the window's flush, after the first delta
                self.appends.append((run_id, 0.0, []))
                raise StoreError("database or disk is full")
            return await super().append(run_id, events, held_by=held_by)

    async def main() -> list[Event]:
        store = Failing()
        await store.create_run(RunRecord("run_1", "p"))
        rec = EventRecorder(store, "run_1", flush_interval=WINDOW)
        await rec.emit_delta(delta(0))
        await rec.emit_delta(delta(1))
        await asyncio.sleep(2 * WINDOW)  # the window closes, its flush fails, nobody awaits it
        with pytest.raises(StoreError, match="disk is full"):
            await rec.emit_delta(delta(2))
        with pytest.raises(StoreError, match="disk is full"):
            await rec.close()
        return await store.read("run_1")

    assert [e.payload["turn"] for e in in_virtual_time(main)] == [0]


@pytest.mark.unit
def test_deltas_that_arrive_while_a_window_flushes_get_the_next_window() -> None:
    """A delta emitted while its window's append is still in flight waits for the next window,
    not for whatever the run emits next (a provider may stay silent for long)."""

    class Slow(TimedStore):
        def __init__(self) -> None:
            super().__init__()
            self.in_flight = asyncio.Event()
            self.release = asyncio.Event()

        async def append(
            self, run_id: str, events: Sequence[NewEvent], *, held_by: Holder | None = None
        ) -> list[Event]:
            out = await super().append(run_id, events, held_by=held_by)
            if len(self.appends) == 2:  # the window's flush: its commit takes a while
                self.in_flight.set()
                await self.release.wait()
            return out

    async def main() -> tuple[Slow, float]:
        store = Slow()
        await store.create_run(RunRecord("run_1", "p"))
        rec = EventRecorder(store, "run_1", flush_interval=WINDOW)
        loop = asyncio.get_running_loop()
        await rec.emit_delta(delta(0))
        await rec.emit_delta(delta(1))
        await store.in_flight.wait()
        late = loop.time()
        await rec.emit_delta(delta(2))
        await asyncio.sleep(0.005)
        store.release.set()
        await asyncio.sleep(10)  # the run goes quiet
        await rec.close()
        return store, late

    store, late = in_virtual_time(main)
    assert [turns for _, _, turns in store.appends] == [[0], [1], [2]]
    assert store.appends[2][1] - late <= 0.005 + WINDOW


def _step(kind: str, i: int, size: int) -> NewEvent:
    """One emitted event of a run: a piece of reasoning ``size`` characters long, a piece of the
    answer, or a tool's progress."""
    if kind == "reasoning":
        payload = {"text": "r" * size, "reasoning_kind": "raw", "index": 0, "turn": 0}
        return NewEvent("reasoning.delta", payload, task_id="t")
    if kind == "text":
        return NewEvent("message.delta", {"text": f"a{i} ", "turn": 0}, task_id="t")
    return progress(i)


# One run's plan: (pause before, what is emitted, and two sizes for a piece of reasoning).
_SIZED_PLAN = st.lists(
    st.tuples(
        st.sampled_from([0.0, 0.0, 0.0, 0.004, 0.019, 0.021, 0.05]),
        st.sampled_from(["reasoning", "reasoning", "text", "progress"]),
        st.integers(1, 100_000),
        st.integers(1, 100_000),
    ),
    max_size=60,
)


@settings(max_examples=60)
@given(_SIZED_PLAN)
@pytest.mark.unit
def test_what_a_viewer_can_count_of_a_runs_reasoning_does_not_grow_with_its_size(
    plan: list[tuple[float, str, int, int]],
) -> None:
    """Two runs that emit the same events at the same instants, their pieces of reasoning of
    any two sizes, record events a viewer sees under the same numbers: the gaps in a viewer's
    ``seq`` (the SSE ``id:``, ``next_after``) count the windows in which the model reasoned,
    never how much it wrote in them (ADR 0154; ADR 0069 keeps the gaps themselves)."""

    async def record(sizes: list[int]) -> list[Event]:
        store = MemoryStore()
        await store.create_run(RunRecord("run_1", "p"))
        rec = EventRecorder(store, "run_1", flush_interval=WINDOW)
        for i, ((pause, kind, _, _), size) in enumerate(zip(plan, sizes, strict=True)):
            await asyncio.sleep(pause)
            event = _step(kind, i, size)
            await (rec.emit(event) if kind == "progress" else rec.emit_delta(event))
        await asyncio.sleep(WINDOW)
        await rec.close()
        return await store.read("run_1")

    one = in_virtual_time(lambda: record([s for _, _, s, _ in plan]))
    other = in_virtual_time(lambda: record([s for _, _, _, s in plan]))
    assert len(one) == len(other)
    for role in ("viewer", "member"):
        seen_one = filter_events(one, role, mode="surface")
        seen_other = filter_events(other, role, mode="surface")
        assert [(e.seq, e.type, dict(e.payload)) for e in seen_one] == [
            (e.seq, e.type, dict(e.payload)) for e in seen_other
        ]
