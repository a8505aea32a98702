"""``thoughtgate check-index``: does the run index say what the event log says, and ``--repair``.

The run index's status, usage, error and task fields are a projection of the append-only log
(ADR 0020): every append keeps them so in its transaction. A row can still disagree -- written
by a version before that, edited by hand, or beside a log restored from a backup -- and nothing
else looks. This command walks runs (all, the ones named, or those ``runs``' filters select, in
keyset pages of :data:`PAGE` so its memory stays flat over any number of runs), compares each
row with the projection of its log (``store.projection.check_index``, which folds the log's
lifecycle events page by page, never its deltas), and lists each disagreement: the field, the
index's value, the log's.

``--repair`` rewrites each disagreeing row with the store's ``rebuild_run_index`` (one
transaction, serialised with the run's appends) and checks it again: what the rebuild fixed is
``repaired``, what it does not write (a run's prompt, model, modes, number of tasks: the fields
``create_run`` stores) is ``left``. A run whose log has no ending yet is *open*: it may be
executing in another process right now. It is reported but not rebuilt unless
``--include-open``: its check can see a difference an append is about to settle (the row is
read before the log), and a rebuild can only say ``pending`` or ``running`` for it -- reopening,
in the index, a run a row says has ended, which lease recovery then acts on. That is the
operator's decision, not a default.

Who: local role admin and above (``access.local_role``), as ``keys``: it reads every run and
rewrites rows. Where: the local store only (``--db``, ``THOUGHTGATE_DB``, ``store.url``); a
daemon has no endpoint for it, so ``--url`` is refused, and so is an exported
``THOUGHTGATE_URL`` unless ``--local`` says the local store is meant (ADR 0162). Run it where
the daemon's store is reachable; the daemon may keep running.

What it prints: run and task ids, field names, and the values of the fields :data:`SHOWN_FIELDS`
names (statuses, usage, models, modes, counts). Any other value -- a prompt, an answer, an error
message, or a field a later projection compares -- is never printed, only its length: an error
can quote a provider's message or a tool's output, and an answer is the model's; this command is
about where the index is wrong, not what a run said.
Reasoning is not compared at all (no event holds it whole).

A store that does not exist (a SQLite file, a PostgreSQL schema) is not created
(``cli.missing_store``): with no run named, nothing is checked and where it looked is noted on
stderr; a named run is a usage error naming it.

Exit codes (``cli.exit_codes``): 0 the index agrees (after ``--repair``: every disagreement was
repaired); 4 a disagreement was found (after ``--repair``: one is left); 2 usage; 1 failure.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal

import typer
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from thoughtgate.cli.common import Context, console, err_console, print_json, run_async
from thoughtgate.cli.exit_codes import ExitCode
from thoughtgate.cli.missing_store import missing_store, note_no_store, nothing_there
from thoughtgate.cli.options import (
    ArgumentsByName,
    ConfigOpt,
    DbOpt,
    JsonOpt,
    LocalOnlyUrlOpt,
    LocalOpt,
    a_run_id,
)
from thoughtgate.cli.remote import local_only
from thoughtgate.cli.run_selection import EVERY_RUN, RunFilters, RunSelection, with_run_filters
from thoughtgate.errors import UsageError

if TYPE_CHECKING:
    from thoughtgate.store.base import EventStore
    from thoughtgate.store.projection import Difference

__all__ = ["LOCAL_ONLY", "PAGE", "SHOWN_FIELDS", "register"]

PAGE: Final = 200
"""Runs read per keyset page of the walk."""

SHOWN_FIELDS: Final = frozenset(
    {"status", "usage", "task_count", "task", "index", "model", "chain_of_thought"}
    | {"worker_backend", "backend"}
)
"""Fields whose values are printed: states, counts, token usage and names the operator chose.
Any other field (a prompt, an answer, an error, which may quote a provider or a tool, and any
field a later projection compares) is withheld and shown by its length only: fail closed."""

LOCAL_ONLY: Final = (
    "a daemon has no endpoint for it; run it where the daemon's store is reachable (the daemon "
    "may keep running)"
)
"""Why ``check-index`` refuses a daemon's address (``cli.remote.local_only``)."""

Result = Literal["disagrees", "repaired", "left", "skipped: open"]


@dataclass(frozen=True, slots=True)
class RunOutcome:
    """One run whose index disagreed with its log, and what became of it."""

    run_id: str
    open: bool
    """Its log has no ending yet: it may be executing somewhere."""
    found: list[Difference]
    left: list[Difference]
    """What still differs: ``found`` unless a rebuild ran, then what it did not fix."""
    result: Result
    mode: str = "hidden"
    """The run's disclosure mode (its row's): what its usage may show (:func:`_usage`)."""


@dataclass(slots=True)
class Tally:
    reader: str = "owner"
    """The local role, whose view of each run's usage is printed (:func:`_usage`)."""
    checked: int = 0
    disagreeing: int = 0
    repaired: int = 0
    skipped_open: int = 0
    left: int = 0
    runs: list[RunOutcome] = field(default_factory=list)

    def add(self, outcome: RunOutcome) -> None:
        self.disagreeing += 1
        self.repaired += outcome.result == "repaired"
        self.skipped_open += outcome.result == "skipped: open"
        self.left += outcome.result == "left"
        self.runs.append(outcome)

    def exit_code(self, repair: bool) -> ExitCode:
        still = self.skipped_open + self.left if repair else self.disagreeing
        return ExitCode.INDEX_DISAGREES if still else ExitCode.COMPLETED


async def check_one(
    store: EventStore, run_id: str, *, repair: bool, include_open: bool
) -> RunOutcome | None:
    """Check one run and, with ``repair``, rebuild its row if it disagrees (an open run only
    with ``include_open``); ``None`` when it agrees."""
    from thoughtgate.store.projection import check_index

    check = await check_index(store, run_id)
    if check.differences and not check.log_ended:
        # An executing run's row may have been read just before an append moved it on: the
        # difference is settled by the time of a second look, a real one is still there.
        check = await check_index(store, run_id)
    if not check.differences:
        return None
    is_open = not check.log_ended
    found = check.differences
    mode = check.record.chain_of_thought
    if not repair:
        return RunOutcome(run_id, is_open, found, found, "disagrees", mode)
    if is_open and not include_open:
        return RunOutcome(run_id, is_open, found, found, "skipped: open", mode)
    await store.rebuild_run_index(run_id)
    left = (await check_index(store, run_id)).differences
    return RunOutcome(run_id, is_open, found, left, "left" if left else "repaired", mode)


async def walk(
    store: EventStore, named: Sequence[str], selection: RunSelection
) -> AsyncIterator[str]:
    """The ids of the runs to check: the ``named`` ones, else every run ``selection`` selects,
    newest first, a keyset page at a time (a run created meanwhile neither shifts nor repeats
    one; a repair changes no run's place)."""
    if named:
        for run_id in named:
            yield run_id
        return
    query = selection.store_query(PAGE)
    while True:
        page = await store.query_runs(query)
        for run in page.runs:
            yield run.run_id
        if page.next is None:
            return
        query = dataclasses.replace(query, before=page.next)


@contextlib.contextmanager
def _progress(total: int | None) -> Iterator[Callable[[], None]]:
    """A progress line on stderr, when it is a terminal (it goes away at the end)."""
    with Progress(
        SpinnerColumn(),
        TextColumn("checking the run index: {task.completed} runs"),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
        disable=not err_console.is_terminal,
    ) as progress:
        task = progress.add_task("check", total=total)
        yield lambda: progress.advance(task)


def _usage(value: object, reader: str, mode: str) -> object:
    """Token usage as ``reader`` may read it on a run of ``mode``, by ``TokenUsage``'s own
    declaration (display surface): billed counts to developers and above (ADR 0163), reasoning
    tokens only where reasoning is shown (a ``surface`` run), a count no declaration names never. A withheld count keeps its key, so a
    difference in it still shows as one."""
    from thoughtgate.access.filter import shows
    from thoughtgate.access.roles import parse_role
    from thoughtgate.events.payloads import TokenUsage
    from thoughtgate.events.visibility import declared_fields

    if not isinstance(value, dict):
        return value
    declared = declared_fields(TokenUsage)
    role = parse_role(reader)
    out: dict[str, object] = {}
    for key, count in value.items():
        spec = declared.get(key)
        shown = spec is not None and shows(spec.cls, role, mode)
        out[key] = count if shown else {"withheld": spec.cls.value if spec else "undeclared"}
    return out


def _value(name: str, value: object, reader: str = "owner", mode: str = "hidden") -> Any:
    """A value as it may be shown: usage through its declaration (:func:`_usage`), a field
    :data:`SHOWN_FIELDS` does not name by its length only (``None`` stays ``None``: the side
    that lacks the value says so)."""
    if value is None:
        return value
    if name == "usage":
        return _usage(value, reader, mode)
    if name in SHOWN_FIELDS:
        return value
    return {"withheld": "text", "chars": len(value if isinstance(value, str) else str(value))}


def _count(value: object) -> str:
    return "<withheld>" if isinstance(value, dict) else str(value)


def _shown(name: str, value: object, reader: str = "owner", mode: str = "hidden") -> str:
    """A value for the table: text by length, usage as its non-zero counts (``k=v``)."""
    shown = _value(name, value, reader, mode)
    if isinstance(shown, dict) and shown.get("withheld") == "text":
        return f"<text, {shown['chars']} chars>"
    if name == "usage" and isinstance(shown, dict):
        return " ".join(f"{k}={_count(v)}" for k, v in shown.items() if v) or "{}"
    return json.dumps(shown, ensure_ascii=False, default=str)


def _states(outcome: RunOutcome) -> list[tuple[Difference, str]]:
    """Each difference found with what became of it, then any a rebuild left that was not
    found before (a run that moved on meanwhile)."""
    if outcome.result == "disagrees":
        return [(d, "found") for d in outcome.found]
    if outcome.result == "skipped: open":
        return [(d, "skipped: open") for d in outcome.found]
    left = {(d.field, d.task_id) for d in outcome.left}
    states = [(d, "left" if (d.field, d.task_id) in left else "repaired") for d in outcome.found]
    before = {(d.field, d.task_id) for d in outcome.found}
    return states + [(d, "left") for d in outcome.left if (d.field, d.task_id) not in before]


def _document(tally: Tally, repair: bool) -> dict[str, Any]:
    return {
        "checked": tally.checked,
        "disagreeing": tally.disagreeing,
        "repair": repair,
        "repaired": tally.repaired,
        "skipped_open": tally.skipped_open,
        "left": tally.left,
        "runs": [
            {
                "run_id": o.run_id,
                "open": o.open,
                "result": o.result,
                "differences": [
                    {
                        "field": d.field,
                        "task_id": d.task_id,
                        "index": _value(d.field, d.index, tally.reader, o.mode),
                        "log": _value(d.field, d.log, tally.reader, o.mode),
                        "state": state,
                    }
                    for d, state in _states(o)
                ],
            }
            for o in tally.runs
        ],
    }


def _summary(tally: Tally, repair: bool) -> str:
    head = f"checked {tally.checked} run{'' if tally.checked == 1 else 's'}: "
    if not tally.disagreeing:
        return head + "the index agrees with the log"
    text = (
        head + f"{tally.disagreeing} disagree{'s' if tally.disagreeing == 1 else ''} with the log"
    )
    if not repair:
        return text + " (--repair rebuilds them)"
    parts = [f"{tally.repaired} repaired"]
    if tally.skipped_open:
        parts.append(f"{tally.skipped_open} open, skipped (--include-open rebuilds them too)")
    if tally.left:
        parts.append(f"{tally.left} still disagree after a rebuild")
    return f"{text}: {', '.join(parts)}"


def _render(tally: Tally, repair: bool) -> None:
    """Each disagreeing run: its id, then a table of its differences; then the summary."""
    for outcome in tally.runs:
        note = " (open: its log has no ending yet)" if outcome.open else ""
        console.print(Text(outcome.run_id, style="bold") + Text(note))
        table = Table("task", "field", "index", "log", "state")
        table.columns[0].overflow = "fold"
        for d, state in _states(outcome):
            index, log = (_shown(d.field, v, tally.reader, outcome.mode) for v in (d.index, d.log))
            table.add_row(*(Text(c) for c in (d.task_id or "", d.field, index, log, state)))
        console.print(table)
    console.print(_summary(tally, repair), highlight=False, markup=False, soft_wrap=True)


def run_ids_given(values: list[str] | None) -> list[str] | None:
    """``[RUN_ID]...``: each a run id (an empty one is a usage error, as for ``RUN_ID``)."""
    for value in values or ():
        a_run_id(value)
    return values


def register(app: typer.Typer) -> None:
    @app.command("check-index", cls=ArgumentsByName)
    @with_run_filters
    def check_index_command(
        run_ids: Annotated[
            list[str] | None,
            typer.Argument(
                metavar="[RUN_ID]...",
                help="Only these runs (ids, or unique starts of them); default: every run the "
                "filters select.",
                show_default=False,
                callback=run_ids_given,
            ),
        ] = None,
        repair: Annotated[
            bool,
            typer.Option(
                "--repair",
                help="Rewrite each disagreeing run's index row from its log (rebuild_run_index).",
            ),
        ] = False,
        include_open: Annotated[
            bool,
            typer.Option(
                "--include-open",
                help="With --repair, rebuild open runs too (their log has no ending yet: they "
                "may be executing); skipped otherwise.",
            ),
        ] = False,
        *,
        filters: RunFilters,
        db: DbOpt = None,
        config: ConfigOpt = None,
        json_out: JsonOpt = False,
        local: LocalOpt = False,
        url: LocalOnlyUrlOpt = None,
    ) -> None:
        """Check that the run index says what the event log says (admin and above; the local
        store only): each disagreeing run, field, index value and log value, never any text.

        Exit 0 when it agrees, 4 when a run disagrees (with --repair: when one still does).
        Filters select by the index's own values, the ones being checked."""
        named = list(run_ids or ())

        async def main() -> ExitCode:
            from thoughtgate.access.filter import require_role
            from thoughtgate.access.roles import Role
            from thoughtgate.cli.common import resolve_run_id

            local_only(url, local=local, command="check-index", why=LOCAL_ONLY)
            if include_open and not repair:
                raise UsageError("--include-open goes with --repair (a check reads only)")
            selection = filters.select(now=time.time())
            if named and selection != EVERY_RUN:
                raise UsageError("name runs or select them with filters, not both")
            ctx = Context(config_path=config, db=db, view_as=None)
            reader = require_role(ctx.role, Role.ADMIN, "checking the run index")
            tally = Tally(reader=reader.label)
            if (missing := await missing_store(ctx.db_url)) is not None:
                if named:
                    raise nothing_there(missing, f"run {named[0]!r}")
                note_no_store(missing)
            else:

                async def body(store: EventStore) -> None:
                    ids = [await resolve_run_id(store, given) for given in named]
                    with _progress(len(ids) or None) as advance:
                        async for run_id in walk(store, ids, selection):
                            found = await check_one(
                                store, run_id, repair=repair, include_open=include_open
                            )
                            tally.checked += 1
                            if found is not None:
                                tally.add(found)
                            advance()

                await ctx.using(body)
            if json_out:
                print_json(_document(tally, repair))
            else:
                _render(tally, repair)
            return tally.exit_code(repair)

        raise typer.Exit(run_async(main()))
