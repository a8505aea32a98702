"""In-memory event store: for tests and throwaway runs; everything is gone when the process ends."""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Unpack

from thoughtgate.errors import RunClosedError, RunNotFoundError
from thoughtgate.events.schema import Event, NewEvent
from thoughtgate.store import durable, listing
from thoughtgate.store.base import EventStore, Holder, OpenRun, OpenRuns, RunEnding
from thoughtgate.store.projection import (
    apply_to_record,
    batch_update,
    rebuilt,
    refuse_unstorable_columns,
    storable_run,
    storable_task,
    storable_text,
)
from thoughtgate.store.records import (
    OPEN_RUN_STATUSES,
    ApiKeyRecord,
    RunRecord,
    TaskRecord,
)
from thoughtgate.store.run_index import RunChange

__all__ = ["MemoryStore"]


def _refuse_unstorable(events: Sequence[NewEvent]) -> None:
    """What the SQL stores refuse before storing anything (``refuse_unstorable_columns``), this
    one refuses too, before changing anything: the same event gets the same answer (ADR 0114)."""
    refuse_unstorable_columns([e.task_id for e in events], [e.type for e in events])


class MemoryStore(EventStore, durable.DurableRunStore):
    """Dict-backed store. Returns copies so callers cannot mutate what is stored."""

    def __init__(self) -> None:
        super().__init__()
        self._runs: dict[str, RunRecord] = {}
        self._events: dict[str, list[Event]] = {}
        self._keys: dict[str, ApiKeyRecord] = {}
        self._secrets: dict[str, str] = {}
        self._closed: set[str] = set()
        self._specs: dict[str, durable.RunSpecRecord] = {}
        self._queues: dict[str, durable.RunQueueRecord] = {}
        self._lock = asyncio.Lock()
        self._order: dict[str, int] = {}
        """Each run's place in creation order (the list's tie-break among equal times)."""
        self._change: dict[str, int] = {}
        """Each run's latest change number (``store.listing``)."""
        self._last_change = 0

    def _changed(self, run_id: str) -> None:
        self._last_change += 1
        self._change[run_id] = self._last_change

    def _run(self, run_id: str) -> RunRecord:
        try:
            return self._runs[run_id]
        except KeyError:
            raise RunNotFoundError(run_id) from None

    async def create_run(self, run: RunRecord) -> None:
        async with self._lock:
            self._runs[run.run_id] = copy.deepcopy(storable_run(run))
            self._events[run.run_id] = []
            self._order[run.run_id] = len(self._order) + 1
            self._close_if_ended(run.run_id)
            self._changed(run.run_id)
        self.wakeups.notify(listing.RUN_LIST_WAKEUP)

    async def get_run(self, run_id: str, *, apart: bool = True) -> RunRecord:
        run = copy.deepcopy(self._run(run_id))  # (``apart`` ignored: nothing is decoded)
        run.tasks.sort(key=lambda t: t.index)
        return run

    async def list_runs(
        self, *, limit: int = 50, offset: int = 0, apart: bool = True
    ) -> list[RunRecord]:
        runs = sorted(self._runs.values(), key=lambda r: r.created_at, reverse=True)
        return [copy.deepcopy(r) for r in runs[offset : offset + limit]]

    async def query_runs(self, query: listing.RunQuery, *, apart: bool = True) -> listing.RunPage:
        # (``apart`` ignored: nothing is decoded)
        found = sorted(
            (r for r in self._runs.values() if listing.matches(r, query, self._order[r.run_id])),
            key=lambda r: (r.created_at, self._order[r.run_id]),
            reverse=True,
        )
        page = [self._copy(r) for r in found[: query.limit]]
        last = found[query.limit - 1] if len(found) > query.limit else None
        cursor = (
            None if last is None else listing.RunCursor(last.created_at, self._order[last.run_id])
        )
        return listing.RunPage(page, cursor)

    async def run_changes(
        self, *, after: int, limit: int = 100, apart: bool = True
    ) -> listing.RunChanges:
        changed = sorted((n, rid) for rid, n in self._change.items() if n > after)[:limit]
        return listing.RunChanges([(n, self._copy(self._runs[rid])) for n, rid in changed])

    async def latest_run_change(self) -> int:
        return self._last_change

    @staticmethod
    def _copy(run: RunRecord) -> RunRecord:
        out = copy.deepcopy(run)
        out.tasks.sort(key=lambda t: t.index)
        return out

    async def update_run(
        self, run_id: str, *, held_by: Holder | None = None, **change: Unpack[RunChange]
    ) -> None:
        async with self._lock:
            run = self._run(run_id)
            if held_by is not None:
                self._check_held(run_id, held_by, "run record")
            status, usage, error = change.get("status"), change.get("usage"), change.get("error")
            if status is not None:
                run.status = status
            if usage is not None:
                run.usage = dict(usage)
            if error is not None:
                run.error = storable_text(error)
            run.metadata = {**run.metadata, **(change.get("metadata") or {})}
            run.updated_at = time.time()
            self._close_if_ended(run_id)
            self._changed(run_id)
        self.wakeups.notify(listing.RUN_LIST_WAKEUP)

    async def save_task(self, task: TaskRecord, *, held_by: Holder | None = None) -> None:
        kept = copy.deepcopy(storable_task(task))  # its ids refused first, as the SQL stores do
        async with self._lock:
            run = self._run(task.run_id)
            if held_by is not None:
                self._check_held(task.run_id, held_by, "task record")
            run.tasks = [t for t in run.tasks if t.task_id != task.task_id]
            run.tasks.append(kept)

    def _check_held(self, run_id: str, held_by: Holder, recording: str) -> None:
        """Under the store's lock: ``held_by.check`` of the run as it is (ADR 0094)."""
        run, spec = self._runs[run_id], self._specs.get(run_id)
        ended = None if self._is_open(run_id) else True
        held_by.check(
            run_id, (ended, run.owner, None if spec is None else spec.attempts), recording
        )

    async def find_run_ids(self, prefix: str, *, limit: int = 10) -> list[str]:
        return sorted(r for r in self._runs if r.startswith(prefix))[:limit]

    async def append(
        self, run_id: str, events: Sequence[NewEvent], *, held_by: Holder | None = None
    ) -> list[Event]:
        _refuse_unstorable(events)
        async with self._lock:
            out, changed = self._append(run_id, events, held_by)
        if changed:
            self.wakeups.notify(listing.RUN_LIST_WAKEUP)
        await self.wakeups.committed(run_id, out)
        return out

    def _append(
        self, run_id: str, events: Sequence[NewEvent], held_by: Holder | None = None
    ) -> tuple[list[Event], bool]:
        """Append and project the batch onto the index (ADR 0020); whether the run row changed.
        ``held_by``: the execution appending, which must hold the run (ADR 0090)."""
        run = self._run(run_id)
        if run_id in self._closed and events:
            raise RunClosedError(run_id)
        if held_by is not None and events:
            spec = self._specs.get(run_id)
            if not held_by.holds(run.owner, None if spec is None else spec.attempts):
                raise held_by.refused(run_id, run.owner)
        log = self._events[run_id]
        start = len(log)
        out = [
            Event(
                start + i + 1,
                run_id,
                e.type,
                copy.deepcopy(dict(e.payload)),
                task_id=e.task_id,
                ts=e.ts,
            )
            for i, e in enumerate(events)
        ]
        log.extend(out)
        update = batch_update(out)
        changed = bool(update) and apply_to_record(run, update)
        if changed:
            run.updated_at = time.time()
            self._close_if_ended(run_id)
            self._changed(run_id)
        return out, changed

    async def finish_run(
        self, run_id: str, events: Sequence[NewEvent], ending: RunEnding
    ) -> list[Event]:
        _refuse_unstorable(events)
        ended = [copy.deepcopy(storable_task(t)) for t in ending.tasks]  # before any change
        async with self._lock:
            run = self._run(run_id)
            if not self._is_open(run_id) or ending.lease_renewed(run.lease_expires_at):
                return []
            spec = self._specs.get(run_id)
            ending.check_holder(run_id, run.owner, None if spec is None else spec.attempts)
            for task in ended:
                run.tasks = [t for t in run.tasks if t.task_id != task.task_id]
                run.tasks.append(task)
            out, _ = self._append(run_id, events)
            run.status = ending.status
            if ending.usage is not None:
                run.usage = dict(ending.usage)
            if ending.error is not None:
                run.error = storable_text(ending.error)
            run.lease_expires_at = None
            run.updated_at = time.time()
            self._closed.add(run_id)
            self._changed(run_id)
        self.wakeups.notify(listing.RUN_LIST_WAKEUP)
        await self.wakeups.committed(run_id, out)
        return out

    async def rebuild_run_index(self, run_id: str) -> RunRecord:
        async with self._lock:
            run = self._run(run_id)
            new = rebuilt(run, self._events[run_id])
            changed = (new.status, new.usage, new.error) != (run.status, run.usage, run.error)
            run.status, run.usage, run.error, run.tasks = (
                new.status,
                new.usage,
                new.error,
                new.tasks,
            )
            if changed:
                run.updated_at = time.time()
                self._close_if_ended(run_id)
                self._changed(run_id)
        if changed:
            self.wakeups.notify(listing.RUN_LIST_WAKEUP)
        return await self.get_run(run_id)

    async def renew_leases(self, owner: str, ttl_s: float, run_ids: Collection[str]) -> list[str]:
        named = set(run_ids)
        async with self._lock:
            held = [r for r in self._open() if r.owner == owner and r.run_id in named]
            until = time.time() + ttl_s
            for run in held:
                run.lease_expires_at = until
            return [r.run_id for r in held]

    async def open_runs(
        self,
        *,
        limit: int = 1000,
        after: str | None = None,
        expired: bool = False,
        run_ids: Collection[str] | None = None,
    ) -> OpenRuns:
        now = time.time()
        named = None if run_ids is None else set(run_ids)
        runs: list[OpenRun] = []
        for run in sorted(self._open(), key=lambda r: r.run_id):
            if len(runs) >= limit:
                break
            lease = run.lease_expires_at
            if (
                (after is not None and run.run_id <= after)
                or (expired and (run.owner is None or lease is None or lease > now))
                or (named is not None and run.run_id not in named)
            ):
                continue
            spec = self._specs.get(run.run_id)
            queued_at = None if spec is None else spec.queued_at
            runs.append(OpenRun(run.run_id, run.owner, lease, queued_at))
        return OpenRuns(runs, now)

    def _open(self) -> list[RunRecord]:
        return [r for r in self._runs.values() if self._is_open(r.run_id)]

    # -- durable runs (store.durable) -------------------------------------------------------
    async def admit_run(
        self,
        run: RunRecord,
        spec: durable.RunSpecRecord,
        *,
        quota: durable.Quota | None = None,
        events: Sequence[NewEvent] = (),
        decided: Callable[[], None] | None = None,
        committed: Callable[[], None] | None = None,
    ) -> durable.Admission:
        _refuse_unstorable(events)
        async with self._lock:
            now = time.time()
            verdict = durable.Admission(True)
            if quota is not None:
                mine = [s for s in self._specs.values() if s.key_id == quota.key_id]
                open_runs = sum(1 for s in mine if self._is_open(s.run_id))
                recent = [s.created_at for s in mine if s.created_at > now - durable.WINDOW_S]
                usage = durable.KeyUsage.of_starts(quota, open_runs, recent)
                verdict = durable.quota_verdict(quota, usage, now)
                if not verdict.admitted:
                    return verdict
            self._runs[run.run_id] = copy.deepcopy(storable_run(run))
            self._events[run.run_id] = []
            self._order[run.run_id] = len(self._order) + 1
            self._close_if_ended(run.run_id)
            self._changed(run.run_id)
            stored = copy.deepcopy(spec)
            stored.created_at = now
            self._specs[run.run_id] = stored
            out, _ = self._append(run.run_id, events) if events else ([], False)
        self.wakeups.notify(listing.RUN_LIST_WAKEUP)
        if out:
            await self.wakeups.committed(run.run_id, out)
        return verdict

    def _close_if_ended(self, run_id: str) -> None:
        """A run given a terminal status is closed, by whatever wrote it (ADR 0134), as
        ``finish_run`` closes one: it takes no more events."""
        if self._runs[run_id].status not in OPEN_RUN_STATUSES:
            self._closed.add(run_id)

    def _is_open(self, run_id: str) -> bool:
        run = self._runs.get(run_id)
        return run is not None and run.status in OPEN_RUN_STATUSES and run_id not in self._closed

    async def get_run_spec(self, run_id: str) -> durable.RunSpecRecord | None:
        found = self._specs.get(run_id)
        return None if found is None else copy.deepcopy(found)

    async def get_run_specs(self, run_ids: Collection[str]) -> dict[str, durable.RunSpecRecord]:
        return {r: copy.deepcopy(self._specs[r]) for r in run_ids if r in self._specs}

    async def claim_run(
        self, run_id: str, owner: str, ttl_s: float, *, attempt: int | None = None
    ) -> int | None:
        async with self._lock:
            run = self._run(run_id)
            spec = self._specs.get(run_id)
            if not self._is_open(run_id) or run.owner not in (None, owner) or spec is None:
                return None
            if attempt is not None and (run.owner != owner or spec.attempts != attempt):
                return None
            run.owner = owner
            run.lease_expires_at = time.time() + ttl_s
            run.status = "running"
            self._changed(run_id)
            spec.attempts += 1
            spec.queued_at = None
            attempt = spec.attempts
        self.wakeups.notify(listing.RUN_LIST_WAKEUP)
        return attempt

    async def release_run(
        self,
        run_id: str,
        *,
        owner: str | None,
        queue: bool,
        lease_expired_by: float | None = None,
        attempt: int | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> bool:
        async with self._lock:
            run = self._run(run_id)
            spec = self._specs.get(run_id)
            if spec is None or not self._is_open(run_id) or run.owner != owner:
                return False
            if attempt is not None and spec.attempts != attempt:
                return False
            if owner is None and spec.queued_at is not None:
                return False
            lease = run.lease_expires_at
            if lease_expired_by is not None and lease is not None and lease > lease_expired_by:
                return False
            run.owner = None
            run.lease_expires_at = None
            spec.queued_at = time.time() if queue else None
            if metadata is not None:  # why it waits, with the release (ADR 0112)
                run.metadata = {**run.metadata, **metadata}
                run.updated_at = time.time()
                self._changed(run_id)
        if metadata is not None:
            self.wakeups.notify(listing.RUN_LIST_WAKEUP)
        return True

    async def requeue_run(self, run_id: str, *, queued_at: float) -> bool:
        async with self._lock:
            run = self._run(run_id)
            spec = self._specs.get(run_id)
            if spec is None or not self._is_open(run_id) or run.owner is not None:
                return False
            if spec.queued_at != queued_at:
                return False
            spec.queued_at = time.time()
            return True

    async def save_run_queue(self, queue: durable.RunQueueRecord) -> None:
        self._queues[queue.name] = durable.RunQueueRecord(
            queue.name, tuple(queue.tools), queue.concurrency, time.time()
        )

    async def list_run_queues(self, *, seen_within_s: float) -> list[durable.RunQueueRecord]:
        cutoff = time.time() - seen_within_s
        return sorted(
            (q for q in self._queues.values() if q.seen_at >= cutoff), key=lambda q: q.name
        )

    async def read(
        self, run_id: str, *, after: int = 0, limit: int | None = None, apart: bool = True
    ) -> list[Event]:
        # (``apart`` ignored: this store keeps events as objects and decodes nothing)
        self._run(run_id)
        log = self._events[run_id]
        end = len(log) if limit is None else min(len(log), max(after, 0) + limit)
        return log[max(after, 0) : end]

    async def read_types(
        self,
        run_id: str,
        types: Collection[str],
        *,
        after: int = 0,
        limit: int | None = None,
    ) -> list[Event]:
        self._run(run_id)
        wanted = set(types)
        found = [e for e in self._events[run_id][max(after, 0) :] if e.type in wanted]
        return found if limit is None else found[: max(limit, 0)]

    async def save_api_key(self, key: ApiKeyRecord) -> None:
        self._keys[key.key_id] = copy.deepcopy(key)

    async def list_api_keys(self) -> list[ApiKeyRecord]:
        return sorted((copy.deepcopy(k) for k in self._keys.values()), key=lambda k: k.created_at)

    async def get_api_key(self, key_id: str) -> ApiKeyRecord | None:
        key = self._keys.get(key_id)
        return None if key is None else copy.deepcopy(key)

    async def find_api_key(self, key_hash: str) -> ApiKeyRecord | None:
        for key in self._keys.values():
            if key.key_hash == key_hash and key.revoked_at is None:
                return copy.deepcopy(key)
        return None

    async def revoke_api_key(self, key_id: str) -> bool:
        key = self._keys.get(key_id)
        if key is None or key.revoked_at is not None:
            return False
        key.revoked_at = time.time()
        return True

    async def get_or_create_secret(self, name: str, candidate: str) -> str:
        return self._secrets.setdefault(name, candidate)
