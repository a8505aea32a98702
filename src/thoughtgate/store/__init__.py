"""The append-only event log: interface, records and backends."""

from thoughtgate.store.base import EventStore
from thoughtgate.store.memory import MemoryStore
from thoughtgate.store.records import ApiKeyRecord, RunRecord, TaskRecord, new_id
from thoughtgate.store.urls import default_store_url, open_store

__all__ = [
    "ApiKeyRecord",
    "EventStore",
    "MemoryStore",
    "RunRecord",
    "TaskRecord",
    "default_store_url",
    "new_id",
    "open_store",
]
