"""What a viewer reads of a run: one run through the real runtime on a memory store, its adapter
answered by a given transport or server, then its run view and its events as the one output
filter gives them to a role (the tests that look for a canary in a run's error or answer)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from support.replay import provider_with
from thoughtgate.access.filter import filter_events, filter_run
from thoughtgate.config import Config
from thoughtgate.orchestration.runtime import RunRequest, Runtime
from thoughtgate.store.urls import open_store

__all__ = ["ViewerRead", "role_reads", "viewer_reads"]


@dataclass(frozen=True, slots=True)
class ViewerRead:
    status: str
    view: str
    """The run view, as JSON text."""
    events: str
    """The run's events, as JSON text."""


def viewer_reads(transport: httpx.AsyncBaseTransport, mode: str) -> ViewerRead:
    """Run one prompt on ``anthropic:claude-sonnet-4-5`` over ``transport`` in ``mode`` (however
    it ends: the run records it), and read it back as a viewer."""

    async def main() -> ViewerRead:
        store = await open_store("memory://")
        try:
            runtime = Runtime(
                store, Config(), provider_factory=lambda model: provider_with(transport)
            )
            request = RunRequest("Why?", model="anthropic:claude-sonnet-4-5")
            with contextlib.suppress(Exception):  # a run that errors raises; it is recorded
                await runtime.run(request, chain_of_thought=mode)
            (record,) = await store.list_runs(limit=1)
            log = await store.read(record.run_id)
            return ViewerRead(
                record.status,
                json.dumps(filter_run(record, "viewer").to_json()),
                json.dumps([e.to_dict() for e in filter_events(log, "viewer", mode=mode)]),
            )
        finally:
            await store.close()

    return asyncio.run(main())


async def role_reads(
    provider_factory: Callable[[str], Any],
    model: str,
    mode: str,
    roles: Sequence[str] = ("viewer", "developer"),
    config: Config | None = None,
) -> dict[str, str]:
    """Run one prompt on ``model`` (``PROVIDER:MODEL``) with the adapter ``provider_factory``
    makes, in ``mode`` (however it ends: the run records it), and read it back as each role:
    its run view and events as the one output filter gives them, as JSON text. ``config`` is the
    operator's (default: an empty one, which shows no provider summaries)."""
    store = await open_store("memory://")
    try:
        runtime = Runtime(store, config or Config(), provider_factory=provider_factory)
        with contextlib.suppress(Exception):  # a run that errors raises; it is recorded
            await runtime.run(RunRequest("Why?", model=model), chain_of_thought=mode)
        (record,) = await store.list_runs(limit=1)
        log = await store.read(record.run_id)
        return {
            role: json.dumps(
                [
                    filter_run(record, role).to_json(),
                    [e.to_dict() for e in filter_events(log, role, mode=mode)],
                ]
            )
            for role in roles
        }
    finally:
        await store.close()
