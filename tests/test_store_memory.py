"""The memory backend against the shared conformance cases, one per store concern."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from support.durable_store_conformance import DurableStoreConformance
from support.listing_conformance import RunListingConformance
from support.store_conformance import EventLogConformance, KeyStoreConformance, RunIndexConformance

from thoughtgate.store.base import EventStore
from thoughtgate.store.memory import MemoryStore


class Memory:
    """Each conformance case below on a fresh memory store."""

    @pytest.fixture
    async def store(self) -> AsyncIterator[EventStore]:
        store = MemoryStore()
        yield store
        await store.close()


class TestMemoryEventLog(Memory, EventLogConformance):
    pass


class TestMemoryRunIndex(Memory, RunIndexConformance, RunListingConformance):
    pass


class TestMemoryKeyStore(Memory, KeyStoreConformance):
    pass


class TestMemoryDurableRuns(Memory, DurableStoreConformance):
    pass
