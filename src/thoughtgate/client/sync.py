"""A blocking wrapper over :class:`~thoughtgate.client.aio.ThoughtgateClient`.

It owns one private event loop (``asyncio.Runner``) and runs every call on it, so it must not be
used from inside a running event loop: use the async client there.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine, Iterator, Mapping, Sequence
from typing import Any, TypeVar, Unpack

from thoughtgate.client.aio import EventPage, ThoughtgateClient, Ticket
from thoughtgate.client.run_list import RunListFilters, RunListPage
from thoughtgate.events.schema import Event
from thoughtgate.events.thread import ThreadView
from thoughtgate.events.views import RunView

__all__ = ["SyncThoughtgateClient"]

T = TypeVar("T")


async def _next(iterator: AsyncIterator[T]) -> T:
    return await anext(iterator)


class SyncThoughtgateClient:
    """The same calls as the async client, blocking. ``follow`` and ``watch`` are iterators.

    >>> with SyncThoughtgateClient("http://127.0.0.1:8765", key) as tg:
    ...     for event in tg.follow(tg.start_run("Say hello", "fake:echo")):
    ...         print(event.seq, event.type)
    """

    def __init__(self, base_url: str, api_key: str, **options: Any) -> None:
        self._runner = asyncio.Runner()
        self.aio = ThoughtgateClient(base_url, api_key, **options)

    def __enter__(self) -> SyncThoughtgateClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        try:
            self._run(self.aio.aclose())
        finally:
            self._runner.close()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._runner.run(coro)

    def _iterate(self, iterator: AsyncIterator[T]) -> Iterator[T]:
        try:
            while True:
                try:
                    yield self._run(_next(iterator))
                except StopAsyncIteration:
                    return
        finally:
            aclose = getattr(iterator, "aclose", None)
            if aclose is not None:
                self._run(aclose())

    def me(self) -> dict[str, Any]:
        return self._run(self.aio.me())

    def create_key(self, *, name: str, role: str) -> dict[str, Any]:
        return self._run(self.aio.create_key(name=name, role=role))

    def list_keys(self) -> list[dict[str, Any]]:
        return self._run(self.aio.list_keys())

    def revoke_key(self, key: str) -> dict[str, Any]:
        return self._run(self.aio.revoke_key(key))

    def start_run(
        self,
        prompt: str,
        model: str | None,
        chain_of_thought: str | None = None,
        tools: Sequence[str] | None = None,
        *,
        system: str | None = None,
        tasks: Sequence[Mapping[str, Any]] | None = None,
    ) -> str:
        return self._run(
            self.aio.start_run(prompt, model, chain_of_thought, tools, system=system, tasks=tasks)
        )

    def get_run(self, run_id: str) -> RunView:
        return self._run(self.aio.get_run(run_id))

    def list_runs(
        self, *, limit: int = 50, offset: int = 0, **filters: Unpack[RunListFilters]
    ) -> list[RunView]:
        return self._run(self.aio.list_runs(limit=limit, offset=offset, **filters))

    def runs_page(
        self, *, limit: int = 50, before: str | None = None, **filters: Unpack[RunListFilters]
    ) -> RunListPage:
        return self._run(self.aio.runs_page(limit=limit, before=before, **filters))

    def resume_run(self, run_id: str) -> str:
        return self._run(self.aio.resume_run(run_id))

    def events_page(self, run_id: str, *, after: int = 0, limit: int = 500) -> EventPage:
        return self._run(self.aio.events_page(run_id, after=after, limit=limit))

    def events(self, run_id: str, *, after: int = 0) -> list[Event]:
        return self._run(self.aio.events(run_id, after=after))

    def trace(self, run_id: str) -> list[Event]:
        return self._run(self.aio.trace(run_id))

    def answer_approval(self, run_id: str, call_id: str, decision: str) -> dict[str, Any]:
        return self._run(self.aio.answer_approval(run_id, call_id, decision))

    def ticket(self, run_id: str) -> Ticket:
        return self._run(self.aio.ticket(run_id))

    def follow(self, run_id: str, *, after: int = 0) -> Iterator[Event]:
        return self._iterate(self.aio.follow(run_id, after=after))

    def watch(self, run_id: str) -> Iterator[ThreadView]:
        return self._iterate(self.aio.watch(run_id))

    def thread(self, run_id: str, *, live: bool = True) -> ThreadView:
        return self._run(self.aio.thread(run_id, live=live))
