"""The store: the event log, the run index and the key store (ADR 0018), records and backends."""

from thoughtgate.store.base import EventStore
from thoughtgate.store.key_store import KeyStore
from thoughtgate.store.log import EventLog, RunEnding
from thoughtgate.store.memory import MemoryStore
from thoughtgate.store.records import ApiKeyRecord, RunRecord, TaskRecord, new_id
from thoughtgate.store.run_index import RunChange, RunIndex
from thoughtgate.store.urls import default_store_url, open_store

__all__ = [
    "ApiKeyRecord",
    "EventLog",
    "EventStore",
    "KeyStore",
    "MemoryStore",
    "RunChange",
    "RunEnding",
    "RunIndex",
    "RunRecord",
    "TaskRecord",
    "default_store_url",
    "new_id",
    "open_store",
]
