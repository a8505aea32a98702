"""The memory backend against the shared conformance suite."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from support.durable_store_conformance import DurableStoreConformance
from support.listing_conformance import RunListingConformance
from support.store_conformance import StoreConformance

from thoughtgate.store.base import EventStore
from thoughtgate.store.memory import MemoryStore


class TestMemoryStore(StoreConformance, RunListingConformance):
    @pytest.fixture
    async def store(self) -> AsyncIterator[EventStore]:
        store = MemoryStore()
        yield store
        await store.close()


class TestMemoryDurableRuns(DurableStoreConformance):
    @pytest.fixture
    async def store(self) -> AsyncIterator[EventStore]:
        store = MemoryStore()
        yield store
        await store.close()
