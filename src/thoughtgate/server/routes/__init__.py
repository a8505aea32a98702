"""Route modules; each declares ``ENDPOINTS`` (see :class:`thoughtgate.server.api.Endpoint`)."""

from __future__ import annotations

from thoughtgate.server.api import Endpoint
from thoughtgate.server.routes import agui, keys, live, meta, runs

__all__ = ["all_endpoints"]


def all_endpoints() -> tuple[Endpoint, ...]:
    return (
        *runs.ENDPOINTS,
        *live.ENDPOINTS,
        *agui.ENDPOINTS,
        *keys.ENDPOINTS,
        *meta.ENDPOINTS,
    )
