"""Route modules; each declares ``ENDPOINTS`` (see :class:`thoughtgate.server.api.Endpoint`)."""

from __future__ import annotations

from thoughtgate.server.api import Endpoint
from thoughtgate.server.routes import agui, keys, live, meta, run_list, runs

__all__ = ["all_endpoints"]


def all_endpoints() -> tuple[Endpoint, ...]:
    # The run list first: its /v1/runs/stream must win over /v1/runs/{run_id}.
    return (
        *run_list.ENDPOINTS,
        *runs.ENDPOINTS,
        *live.ENDPOINTS,
        *agui.ENDPOINTS,
        *keys.ENDPOINTS,
        *meta.ENDPOINTS,
    )
