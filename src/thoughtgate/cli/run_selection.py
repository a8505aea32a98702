"""Which runs ``thoughtgate runs`` lists: its filter options, checked once, here, into one
:class:`RunSelection` that the local store (a ``RunQuery``) and a daemon (``GET /v1/runs``'s
filters, through the client) both take, so a selection lists the same runs from either.

Times are resolved once, in whole seconds (the daemon takes whole Unix seconds): ``--since``
rounded down and ``--until`` up, so neither side lists fewer runs than the times say. Which runs
are listed is all this decides; what is shown of each still passes the one output filter.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Final, cast, get_args

import typer

from thoughtgate.cli.options import OptionSpec, option_group
from thoughtgate.disclosure import CHAIN_OF_THOUGHT_MODES
from thoughtgate.errors import UsageError
from thoughtgate.events.payloads import RunStatus
from thoughtgate.store.listing import MAX_SEARCH_CHARS, RunQuery

if TYPE_CHECKING:
    from thoughtgate.client import RunListFilters

__all__ = [
    "EVERY_RUN",
    "MINE_NEEDS_DAEMON",
    "RUN_STATUSES",
    "RunFilters",
    "RunSelection",
    "parse_when",
    "select_runs",
    "with_run_filters",
]

RUN_STATUSES: Final[tuple[str, ...]] = get_args(RunStatus)

# The filter options, declared once for the commands that select runs (``runs``,
# ``check-index``: ``with_run_filters``); ``select_runs`` checks what they were given.
StatusFilterOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--status",
        metavar="STATUS",
        help=f"Only runs in this status (repeatable, or a comma list): {', '.join(RUN_STATUSES)}.",
    ),
]
ModeFilterOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--mode",
        metavar="MODE",
        help="Only runs in this disclosure mode (repeatable, or a comma list): "
        f"{', '.join(CHAIN_OF_THOUGHT_MODES)}.",
    ),
]
ModelFilterOpt = Annotated[
    str | None,
    typer.Option("--model", metavar="PROVIDER:MODEL", help="Only runs of this model (exactly)."),
]
SearchFilterOpt = Annotated[
    str | None,
    typer.Option(
        "--search",
        metavar="TEXT",
        help="Only runs whose prompt contains TEXT (case-insensitive).",
    ),
]
SinceFilterOpt = Annotated[
    str | None,
    typer.Option(
        "--since",
        metavar="WHEN",
        help="Only runs started at or after WHEN: an ISO 8601 date or datetime "
        "(2026-12-01, 2026-12-01T09:30, 2026-12-01T09:30Z; local time unless it has an "
        "offset) or an age (30m, 2h, 7d).",
    ),
]
UntilFilterOpt = Annotated[
    str | None,
    typer.Option("--until", metavar="WHEN", help="Only runs started before WHEN (as --since)."),
]

_AGE = re.compile(r"(\d{1,9})\s*([smhdw])")
_UNIT_S: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_WHEN_FORMS: Final = (
    "an ISO 8601 date or datetime (2026-12-01, 2026-12-01T09:30, 2026-12-01T09:30Z) "
    "or an age (30m, 2h, 7d)"
)


@dataclass(frozen=True, slots=True)
class RunSelection:
    """Which runs to list; empty fields select everything. Filters combine with AND, the values
    of one filter with OR."""

    statuses: tuple[RunStatus, ...] = ()
    modes: tuple[str, ...] = ()
    model: str | None = None
    search: str | None = None
    since: int | None = None
    """Unix seconds: runs created at or after."""
    until: int | None = None
    """Unix seconds: runs created before."""
    mine: bool = False
    """Only runs started with the daemon key in use (a daemon's ``key=me``)."""

    def store_query(self, limit: int) -> RunQuery:
        """The local store's query (``mine`` has no meaning there: the command refuses it)."""
        return RunQuery(
            limit=limit,
            statuses=self.statuses,
            modes=self.modes,
            model=self.model,
            since=None if self.since is None else float(self.since),
            until=None if self.until is None else float(self.until),
            text=self.search,
        )

    def daemon_filters(self) -> RunListFilters:
        """The client's ``list_runs`` filters."""
        filters: RunListFilters = {}
        if self.statuses:
            filters["status"] = self.statuses
        if self.modes:
            filters["mode"] = self.modes
        if self.model is not None:
            filters["model"] = self.model
        if self.search is not None:
            filters["search"] = self.search
        if self.since is not None:
            filters["since"] = self.since
        if self.until is not None:
            filters["until"] = self.until
        if self.mine:
            filters["key"] = "me"
        return filters


EVERY_RUN: Final = RunSelection()
MINE_NEEDS_DAEMON: Final = (
    "--mine needs --url (or THOUGHTGATE_URL): it lists the runs your daemon key started, and "
    "the local store has no keys"
)


def _one_of(
    flag: str, given: Sequence[str] | None, allowed: tuple[str, ...], what: str
) -> tuple[str, ...]:
    """Values of a repeatable option that also takes comma lists, each checked."""
    values = [v.strip() for item in given or () for v in item.split(",")]
    chosen = tuple(dict.fromkeys(v for v in values if v))
    for value in chosen:
        if value not in allowed:
            raise UsageError(f"{flag} {value!r} is not {what}; use one of: {', '.join(allowed)}")
    return chosen


def parse_when(text: str, flag: str, *, now: float) -> float:
    """Unix seconds from an ISO 8601 date or datetime (local time unless it has an offset or
    ``Z``) or an age before ``now`` (``30m``, ``2h``, ``7d``; ``s`` and ``w`` too)."""
    given = text.strip()
    age = _AGE.fullmatch(given.lower())
    if age is not None:
        return now - int(age.group(1)) * _UNIT_S[age.group(2)]
    try:
        when = datetime.fromisoformat(given)
    except ValueError:
        raise UsageError(f"{flag} {text!r} is not a time: use {_WHEN_FORMS}") from None
    try:
        return when.timestamp()
    except (ValueError, OverflowError, OSError):
        # a local time the platform's clock functions cannot place (``0001-01-01``: its local
        # offset would move it into year 0): placed with today's local offset instead
        return when.replace(tzinfo=datetime.now().astimezone().tzinfo).timestamp()


def select_runs(
    *,
    statuses: Sequence[str] | None = None,
    modes: Sequence[str] | None = None,
    model: str | None = None,
    search: str | None = None,
    since: str | None = None,
    until: str | None = None,
    mine: bool = False,
    now: float,
) -> RunSelection:
    """The selection the options ask for; ``UsageError`` (exit 2) naming what is wrong."""
    if search is not None and len(search) > MAX_SEARCH_CHARS:
        raise UsageError(f"--search is limited to {MAX_SEARCH_CHARS} characters")
    start = None if since is None else max(0, math.floor(parse_when(since, "--since", now=now)))
    end = None if until is None else max(0, math.ceil(parse_when(until, "--until", now=now)))
    if start is not None and end is not None and start >= end:
        raise UsageError(f"--since {since} is not before --until {until}: no run can match")
    provider, colon, name = (model or "").partition(":")
    if model and not (provider.strip() and colon and name.strip()):
        # a run's model is always PROVIDER:MODEL: without both, no run could match
        raise UsageError(
            f"--model {model!r} is not PROVIDER:MODEL (for example anthropic:claude-sonnet-4-5), "
            "so no run can match it"
        )
    return RunSelection(
        statuses=cast(
            "tuple[RunStatus, ...]", _one_of("--status", statuses, RUN_STATUSES, "a run status")
        ),
        modes=_one_of("--mode", modes, CHAIN_OF_THOUGHT_MODES, "a disclosure mode"),
        model=model or None,
        search=search or None,
        since=start,
        until=end,
        mine=mine,
    )


@dataclass(frozen=True, slots=True)
class RunFilters:
    """The filter options as given (``with_run_filters``), before ``select_runs`` checks them."""

    status: list[str] | None
    mode: list[str] | None
    model: str | None
    search: str | None
    since: str | None
    until: str | None

    def select(self, *, now: float, mine: bool = False) -> RunSelection:
        """The selection they ask for; ``UsageError`` (exit 2) naming what is wrong."""
        return select_runs(
            statuses=self.status,
            modes=self.mode,
            model=self.model,
            search=self.search,
            since=self.since,
            until=self.until,
            mine=mine,
            now=now,
        )


_FILTER_OPTIONS: tuple[OptionSpec, ...] = (
    ("status", StatusFilterOpt, None),
    ("mode", ModeFilterOpt, None),
    ("model", ModelFilterOpt, None),
    ("search", SearchFilterOpt, None),
    ("since", SinceFilterOpt, None),
    ("until", UntilFilterOpt, None),
)

with_run_filters = option_group("filters", RunFilters, _FILTER_OPTIONS)
"""Give a command ``--status --mode --model --search --since --until`` in place of its keyword
parameter ``filters: RunFilters``."""
