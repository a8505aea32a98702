"""Which runs ``list_runs`` asks the daemon for (``GET /v1/runs``): the filters as Python keywords,
turned into the query the daemon reads, and one page of its answer.

The daemon takes times as whole Unix seconds, so ``since`` is rounded down and ``until`` up: the
runs asked for are never fewer than the times say (at most one second more on either side).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TypedDict

from thoughtgate.events.views import RunView

__all__ = ["RunListFilters", "RunListPage", "run_list_params"]


class RunListFilters(TypedDict, total=False):
    """The filters of ``list_runs`` / ``runs_page``; they combine with AND, a filter's values
    with OR. Every run listed has passed the daemon's one output filter for the key's role."""

    status: str | Sequence[str]
    """Run statuses (``pending``, ``running``, ``completed``, ``partial``, ``failed``, ``error``,
    ``interrupted``)."""
    mode: str | Sequence[str]
    """Disclosure modes (``hidden``, ``surface``, ``telemetry_only``)."""
    model: str
    """``PROVIDER:MODEL``, exactly."""
    key: str
    """``"me"``: the runs this key started; another key's id needs admin."""
    since: float | datetime
    """Runs created at or after this (Unix seconds, or a datetime; naive means local time)."""
    until: float | datetime
    """Runs created before this."""
    search: str
    """A case-insensitive substring of the prompt (the daemon's ``q``)."""


@dataclass(frozen=True, slots=True)
class RunListPage:
    """One page of ``GET /v1/runs``: read on with ``before=next`` (``None``: the last page)."""

    runs: tuple[RunView, ...]
    next: str | None
    changes: int
    """The run list's change number when the page was read (where its live stream starts)."""


def _seconds(value: float | datetime) -> float:
    return value.timestamp() if isinstance(value, datetime) else float(value)


def _listed(value: str | Sequence[str]) -> str:
    return value if isinstance(value, str) else ",".join(value)


def run_list_params(filters: RunListFilters) -> dict[str, str | int]:
    """The query parameters of ``filters`` (unset filters are left out)."""
    params: dict[str, str | int] = {}
    if "status" in filters:
        params["status"] = _listed(filters["status"])
    if "mode" in filters:
        params["mode"] = _listed(filters["mode"])
    if "model" in filters:
        params["model"] = filters["model"]
    if "key" in filters:
        params["key"] = filters["key"]
    if "search" in filters:
        params["q"] = filters["search"]
    if "since" in filters:
        params["since"] = max(0, math.floor(_seconds(filters["since"])))
    if "until" in filters:
        params["until"] = max(0, math.ceil(_seconds(filters["until"])))
    return params
