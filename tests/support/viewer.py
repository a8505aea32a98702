"""What a viewer reads of a run that failed: one run through the real runtime on a memory store,
its Anthropic adapter answered by a given transport, then its run view and its events as the one
output filter gives them to a viewer (the tests that look for a canary in a run's error)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass

import httpx

from support.replay import provider_with
from thoughtgate.access.filter import filter_events, filter_run
from thoughtgate.config import Config
from thoughtgate.orchestration.runtime import RunRequest, Runtime
from thoughtgate.store.urls import open_store

__all__ = ["ViewerRead", "viewer_reads"]


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
