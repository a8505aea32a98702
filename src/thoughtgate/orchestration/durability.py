"""Whether a process's runs are durable: ``durability.enabled`` and a store that keeps them.

Kept apart from ``orchestration.durable`` so that deciding costs no import of the engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from thoughtgate.orchestration.durable import DurableEngine
    from thoughtgate.orchestration.runtime import Runtime

__all__ = ["make_durable"]


def make_durable(runtime: Runtime) -> DurableEngine | None:
    """Attach the durable engine (ADR 0013) when the config enables it and the store is SQLite or
    PostgreSQL; ``None`` otherwise (``memory://`` keeps nothing another process could resume)."""
    from thoughtgate.store.memory import MemoryStore

    if not runtime.config.durability.enabled or isinstance(runtime.store, MemoryStore):
        return None
    from thoughtgate.orchestration.durable import DurableEngine

    return DurableEngine.attach(runtime, runtime.config.durability)
