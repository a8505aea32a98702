"""The run-list capability (``thoughtgate.store.listing.RunListing``), checked on every backend.

A backend's test module subclasses :class:`RunListingConformance` next to its store conformance
class and gives it the same ``store`` fixture (an open, empty store).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from typing import Any

import pytest

from support.store_conformance import make_run
from thoughtgate.errors import UsageError
from thoughtgate.events.schema import EventType, NewEvent
from thoughtgate.store.base import EventStore, RunEnding
from thoughtgate.store.listing import RunCursor, RunQuery
from thoughtgate.store.records import RunRecord

__all__ = ["RunListingConformance"]

T0 = 1_700_000_000.0


async def page_ids(store: EventStore, query: RunQuery) -> list[str]:
    return [r.run_id for r in (await store.query_runs(query)).runs]


async def all_pages(
    store: EventStore, size: int, *, before: RunCursor | None = None, **filters: Any
) -> list[str]:
    """Every run of a filtered list, read page by page through the cursors."""
    seen: list[str] = []
    cursor = before
    for _ in range(1000):
        page = await store.query_runs(RunQuery(limit=size, before=cursor, **filters))
        seen.extend(r.run_id for r in page.runs)
        if page.next is None:
            return seen
        assert len(page.runs) == size, "only the last page is short"
        cursor = page.next
    raise AssertionError("the cursor never ended")


async def seeded(store: EventStore, runs: list[RunRecord]) -> list[str]:
    """Create ``runs`` in a shuffled order; their ids newest first."""
    for run in random.Random(7).sample(runs, len(runs)):
        await store.create_run(run)
    return [r.run_id for r in sorted(runs, key=lambda r: r.created_at, reverse=True)]


class RunListingConformance:
    #: Whether change numbers go 1, 2, 3, ... (SQLite, memory). PostgreSQL numbers a change by its
    #: transaction (ADR 0140): increasing, with gaps.
    dense_change_numbers = True

    @pytest.fixture
    async def store(self) -> AsyncIterator[EventStore]:
        raise NotImplementedError("a backend's test class must override the `store` fixture")
        yield  # pragma: no cover

    async def settled(self, store: EventStore) -> None:
        """Return once every committed change can be read: at once, but on PostgreSQL, once
        no older transaction still running (in any test) holds them back (ADR 0140)."""

    async def test_deltas_change_no_run_list_row(self, store: EventStore) -> None:
        """The run list's stream sends a run each time its row changes (its change number, its
        ``updated_at``); a run's deltas change neither, so a reader of the list gets no frame
        per window of reasoning, nor a time that moved with one (ADR 0154)."""
        run = make_run(tasks=1)
        task = run.tasks[0].task_id
        await store.create_run(run)
        started = {"index": 0, "prompt": "task 0", "backend": "provider", "model": "fake:m"}
        await store.append(run.run_id, [NewEvent(EventType.TASK_STARTED, started, task_id=task)])
        await self.settled(store)  # PostgreSQL: no other test's transaction holds it back
        change, row = await store.latest_run_change(), await store.get_run(run.run_id)
        for i in range(40):
            payload = {"text": "r" * (i * 100 + 1), "reasoning_kind": "raw", "index": 0, "turn": 0}
            await store.append(
                run.run_id,
                [
                    NewEvent(EventType.REASONING_DELTA, payload, task_id=task),
                    NewEvent(EventType.MESSAGE_DELTA, {"text": f"a{i}", "turn": 0}, task_id=task),
                ],
            )
        await self.settled(store)
        assert await store.latest_run_change() == change
        assert (await store.get_run(run.run_id)).updated_at == row.updated_at

    # -- pages ---------------------------------------------------------------------------
    async def test_keyset_pages_walk_the_list_newest_first(self, store: EventStore) -> None:
        newest_first = await seeded(store, [make_run(created_at=T0 + i) for i in range(11)])
        assert await page_ids(store, RunQuery()) == newest_first
        for size in (1, 3, 4, 11, 12):
            assert await all_pages(store, size) == newest_first

    async def test_a_full_last_page_says_it_is_the_last(self, store: EventStore) -> None:
        await seeded(store, [make_run(created_at=T0 + i) for i in range(4)])
        assert (await store.query_runs(RunQuery(limit=4))).next is None
        assert (await store.query_runs(RunQuery(limit=3))).next is not None

    async def test_runs_created_at_the_same_instant_are_paged_newest_stored_first(
        self, store: EventStore
    ) -> None:
        runs = [make_run(created_at=T0) for _ in range(5)]
        for run in runs:
            await store.create_run(run)
        newest_stored_first = [r.run_id for r in reversed(runs)]
        for size in (1, 2, 5):
            assert await all_pages(store, size) == newest_stored_first

    async def test_pages_hold_while_runs_are_created_and_change(self, store: EventStore) -> None:
        """Page 1, then new runs and status changes, then page 2: it continues exactly where
        page 1 ended (an offset would shift by the new runs and repeat rows)."""
        newest_first = await seeded(store, [make_run(created_at=T0 + i) for i in range(10)])
        first = await store.query_runs(RunQuery(limit=4))
        for i in range(3):
            await store.create_run(make_run(created_at=T0 + 100 + i))
        await store.update_run(newest_first[5], status="running")
        rest = await all_pages(store, 4, before=first.next)
        assert [r.run_id for r in first.runs] + rest == newest_first

    async def test_a_page_carries_each_runs_tasks(self, store: EventStore) -> None:
        run = make_run(tasks=3)
        await store.create_run(run)
        (got,) = (await store.query_runs(RunQuery())).runs
        assert [t.index for t in got.tasks] == [0, 1, 2]
        assert got == await store.get_run(run.run_id)

    async def test_cursors_survive_encoding_and_refuse_anything_else(
        self, store: EventStore
    ) -> None:
        await seeded(store, [make_run(created_at=T0 + i / 7) for i in range(3)])
        page = await store.query_runs(RunQuery(limit=1))
        assert page.next is not None
        assert RunCursor.decode(page.next.encode()) == page.next
        for bad in ("", "x", "W10", "WzEsMl0x", "WyJhIiwxXQ", "W251bGwsMV0", "WzEsLTFd"):
            with pytest.raises(UsageError, match="cursor"):
                RunCursor.decode(bad)

    # -- filters -------------------------------------------------------------------------
    async def test_filters_combine_and_each_takes_several_values(self, store: EventStore) -> None:
        runs = [
            make_run(created_at=T0 + 1, status="completed", chain_of_thought="surface"),
            make_run(created_at=T0 + 2, status="failed", model="anthropic:claude-x"),
            make_run(created_at=T0 + 3, status="error", chain_of_thought="telemetry_only"),
            make_run(created_at=T0 + 4, status="running", model="anthropic:claude-x"),
            make_run(created_at=T0 + 5, status="partial", started_by="key_a"),
            make_run(created_at=T0 + 6, status="failed", started_by="key_b"),
        ]
        await seeded(store, runs)
        ids = [r.run_id for r in runs]

        async def ids_of(**filters: Any) -> list[str]:
            return await all_pages(store, 2, **filters)

        assert await ids_of(statuses=("failed", "error")) == [ids[5], ids[2], ids[1]]
        assert await ids_of(statuses=("interrupted",)) == []
        assert await ids_of(modes=("surface", "telemetry_only")) == [ids[2], ids[0]]
        assert await ids_of(model="anthropic:claude-x") == [ids[3], ids[1]]
        assert await ids_of(model="anthropic:claude") == []  # exact, not a prefix
        assert await ids_of(started_by="key_b") == [ids[5]]
        assert await ids_of(since=T0 + 2, until=T0 + 4) == [ids[2], ids[1]]  # [since, until)
        assert await ids_of(statuses=("failed",), model="anthropic:claude-x") == [ids[1]]
        assert await ids_of(statuses=("failed",), since=T0 + 3) == [ids[5]]

    async def test_search_finds_prompt_text_case_insensitively_and_literally(
        self, store: EventStore
    ) -> None:
        prompts = [
            "Plan a day trip from Lisbon to Porto",
            "Summarize yesterday's INCIDENT report",
            "Grow revenue 100% in a week",
            "rename snake_case to camelCase",
            "back\\slash and 50_50",
            "Ünïcode prompt: naïve café",
        ]
        runs = [RunRecord(make_run().run_id, p, created_at=T0 + i) for i, p in enumerate(prompts)]
        await seeded(store, runs)

        async def found(text: str) -> list[str]:
            return [
                prompts[[r.run_id for r in runs].index(i)]
                for i in await all_pages(store, 2, text=text)
            ]

        assert await found("porto") == [prompts[0]]
        assert await found("incident REPORT") == [prompts[1]]
        assert await found("100%") == [prompts[2]]
        assert await found("0% ") == [prompts[2]]
        assert await found("%") == [prompts[2]]  # % is a character, not a wildcard
        assert await found("e_c") == [prompts[3]]  # _ too
        assert await found("_") == [prompts[4], prompts[3]]
        assert await found("k\\s") == [prompts[4]]
        assert await found("naïve café") == [prompts[5]]
        assert await found("a day trip to") == []
        assert await all_pages(store, 2, text="") == await all_pages(store, 10)  # no search
        page = await store.query_runs(RunQuery(limit=1, text="o"))
        assert len(page.runs) == 1 and page.next is not None

    async def test_search_text_is_bounded(self, store: EventStore) -> None:
        with pytest.raises(UsageError, match="200 characters"):
            RunQuery(text="x" * 201)

    @pytest.mark.parametrize("odd", ["\x00", "\ud800"], ids=["nul", "surrogate"])
    async def test_a_filter_holding_what_no_index_holds_is_refused_alike(
        self, store: EventStore, odd: str
    ) -> None:
        """No run's index holds NUL or a surrogate (U+FFFD stands there, ADRs 0114, 0120): a
        search, a model or a key id holding one is a ``UsageError`` on every store, where
        PostgreSQL failed (``StoreError``) and SQLite raised ``UnicodeEncodeError``."""
        await store.create_run(make_run(created_at=1.0))
        for query in ({"text": f"a{odd}"}, {"model": f"m{odd}"}, {"started_by": f"key_{odd}"}):
            with pytest.raises(UsageError):
                await store.query_runs(RunQuery(**query))

    # -- the change feed -----------------------------------------------------------------
    async def test_an_empty_store_has_no_changes(self, store: EventStore) -> None:
        assert await store.latest_run_change() == 0
        assert (await store.run_changes(after=0)).changes == []

    async def test_changes_list_each_changed_run_once_in_its_latest_state(
        self, store: EventStore
    ) -> None:
        a, b, c = (make_run(created_at=T0 + i) for i in range(3))
        for run in (a, b, c):
            await store.create_run(run)
        await self.settled(store)
        start = await store.latest_run_change()
        await store.update_run(a.run_id, status="running")
        await store.finish_run(
            b.run_id, [NewEvent(EventType.RUN_FAILED, {"status": "failed"})], RunEnding("failed")
        )
        await store.update_run(a.run_id, usage={"input_tokens": 5})
        await store.append(c.run_id, [NewEvent(EventType.MESSAGE_DELTA, {"text": "x"})])
        await store.renew_leases(
            "nobody", 10, [a.run_id, c.run_id]
        )  # neither appends nor leases are list changes

        await self.settled(store)
        changes = (await store.run_changes(after=start)).changes
        assert [(run.run_id, run.status, run.usage) for _, run in changes] == [
            (b.run_id, "failed", {}),
            (a.run_id, "running", {"input_tokens": 5}),
        ]
        numbers = [n for n, _ in changes]
        assert numbers == sorted(numbers) and numbers[-1] == await store.latest_run_change()
        assert (await store.run_changes(after=numbers[0])).changes == changes[1:]
        assert (await store.run_changes(after=numbers[-1])).changes == []
        every = (await store.run_changes(after=0, limit=2)).changes
        assert [run.run_id for _, run in every] == [c.run_id, b.run_id]

    async def test_concurrent_changes_each_get_their_own_number(self, store: EventStore) -> None:
        runs = [make_run(created_at=T0 + i) for i in range(8)]
        await asyncio.gather(*(store.create_run(r) for r in runs))
        await asyncio.gather(
            *(store.update_run(r.run_id, status="running") for r in runs),
            *(store.update_run(r.run_id, usage={"input_tokens": 1}) for r in runs),
        )
        await self.settled(store)
        changes = (await store.run_changes(after=0)).changes
        numbers = [n for n, _ in changes]
        assert sorted({r.run_id for _, r in changes}) == sorted(r.run_id for r in runs)
        assert numbers == sorted(set(numbers)) and numbers[-1] == await store.latest_run_change()
        if self.dense_change_numbers:
            assert await store.latest_run_change() == 3 * len(runs)

    async def test_a_finish_that_does_nothing_is_no_change(self, store: EventStore) -> None:
        run = make_run()
        await store.create_run(run)
        end = [NewEvent(EventType.RUN_FAILED, {"status": "failed"})]
        await store.finish_run(run.run_id, end, RunEnding("failed"))
        await self.settled(store)
        before = await store.latest_run_change()
        assert await store.finish_run(run.run_id, end, RunEnding("failed")) == []
        await self.settled(store)
        assert await store.latest_run_change() == before

    async def test_the_key_that_started_a_run_is_kept(self, store: EventStore) -> None:
        run = make_run(started_by="key_0123")
        await store.create_run(run)
        assert (await store.get_run(run.run_id)).started_by == "key_0123"
        await self.settled(store)
        (_, changed), *_ = (await store.run_changes(after=0)).changes
        assert changed.started_by == "key_0123"

    async def test_a_change_wakes_a_waiting_list_reader(self, store: EventStore) -> None:
        await store.create_run(make_run())
        await self.settled(store)
        after = await store.latest_run_change()
        waiting = asyncio.create_task(store.wait_for_run_changes(after, poll_s=30))
        # one loop step, not a pause: the waiter arms its wake-up before its first await
        await asyncio.sleep(0)
        await store.create_run(make_run())
        await asyncio.wait_for(waiting, 5)  # woken by the change, not the 30 s poll
        await self.settled(store)
        latest = await store.latest_run_change()
        assert latest == after + 1 if self.dense_change_numbers else latest > after
