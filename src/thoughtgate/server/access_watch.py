"""Ends live streams whose key was revoked or lost the role their ticket carries.

A ticket is checked when a stream opens (``access.tickets.require_ticket_key``), but a stream can
stay open for as long as its run lasts. So while a daemon process has live streams it re-reads the
key table every ``interval_s`` seconds (one read for all of its streams: keys are few) and ends
each stream whose key is gone, revoked, or now below the ticket's role. Several daemons sharing a
PostgreSQL store each read the same table, so a key revoked through one replica (or with
``thoughtgate keys revoke``) ends its streams on every replica within one interval.

A failed read keeps the streams open and is retried at the next interval: a revocation is itself
a write to the same store, so while the store cannot be read nothing can have been revoked in it
that we would miss for longer than the outage.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass

from thoughtgate.access.roles import Role
from thoughtgate.access.tickets import key_access_problem
from thoughtgate.errors import StoreError
from thoughtgate.store.key_store import KeyStore

__all__ = ["AccessWatch", "OnAccessLost"]

log = logging.getLogger("thoughtgate.server")

OnAccessLost = Callable[[str], None]
"""Called once, on the event loop, with the reason in the reader's words."""


@dataclass(slots=True)
class _Watcher:
    key_id: str
    role: Role
    on_lost: OnAccessLost


class _Unwatch:
    """What ``AccessWatch.watch`` returns: called, it stops watching its stream. One object with
    slots, not a closure with a cell per variable: each open stream holds one (ADR 0171)."""

    __slots__ = ("token", "watchers")

    def __init__(self, watchers: dict[int, _Watcher], token: int) -> None:
        self.watchers = watchers
        self.token = token

    def __call__(self) -> None:
        self.watchers.pop(self.token, None)


class AccessWatch:
    """One per daemon process: ``watch(key_id, role, on_lost)`` for each open live stream."""

    def __init__(self, store: KeyStore, *, interval_s: float = 1.0) -> None:
        self.store = store
        self.interval_s = interval_s
        self._watchers: dict[int, _Watcher] = {}
        self._ids = itertools.count()
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def watching(self) -> int:
        """Open streams being watched."""
        return len(self._watchers)

    def watch(self, key_id: str, role: Role, on_lost: OnAccessLost) -> Callable[[], None]:
        """Call ``on_lost`` once if ``key_id`` is revoked or drops below ``role``; returns the
        function that stops watching (call it when the stream ends)."""
        token = next(self._ids)
        self._watchers[token] = _Watcher(key_id, role, on_lost)
        if not self._closed and (self._task is None or self._task.done()):
            self._task = asyncio.create_task(self._run(), name="access watch")
        return _Unwatch(self._watchers, token)

    async def check(self) -> None:
        """One pass: read the keys once and end every stream whose key no longer backs it."""
        if not self._watchers:
            return
        keys = {k.key_id: k for k in await self.store.list_api_keys()}
        for token, watcher in list(self._watchers.items()):
            problem = key_access_problem(keys.get(watcher.key_id), watcher.role)
            if problem is None or self._watchers.pop(token, None) is None:
                continue
            try:
                watcher.on_lost(str(problem))
            except Exception:  # one broken stream must not keep the others open
                log.exception("ending a live stream of key %s failed", watcher.key_id)

    async def _run(self) -> None:
        while self._watchers and not self._closed:
            await asyncio.sleep(self.interval_s)
            try:
                await self.check()
            except StoreError as exc:
                log.warning("cannot re-check the keys of live streams: %s", exc)

    async def close(self) -> None:
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
