"""``thoughtgate store move-apart``: move the reasoning of rows written before ADR 0160 apart.

ADR 0160 keeps an event's reasoning (its fields of class reasoning or trace, a whole
``reasoning.delta``, a continuity carrier's bytes) apart from its row, so a read for a reader
who may not see it never loads it. Rows written before that version keep it inline: a viewer's
read of them still loads it, and takes longer the more there is. This command stores those rows
as the store writes an event now (ADR 0167): the event read whole, by any reader, is what it was
-- its number, type, task, time and payload -- and only where the payload's bytes sit changes.

It walks the log in windows of rows and moves them in short transactions (``--batch`` rows, a
few megabytes at most): the daemon may keep running and appending meanwhile (SQLite's one
writer takes turns with it; PostgreSQL locks only the rows being moved). Stopped or failed
midway, it loses nothing -- the transaction it was in is rolled back, what earlier ones moved
stays moved -- and run again it moves the rest; a row already apart is passed over.
``--dry-run`` reads and counts what would move, writing nothing.

Who: local role admin and above (``access.local_role``), as ``check-index``: it reads every row
and rewrites some. Where: the local store only (``--db``, ``THOUGHTGATE_DB``, ``store.url``); a
daemon has no endpoint for it (``--url`` refused, an exported ``THOUGHTGATE_URL`` too unless
``--local``). It prints counts and the ``(run, seq)`` of a row it could not read, never a
payload.

Exit codes (``cli.exit_codes``): 0 done (or counted); 1 a row could not be moved (named), or the
store failed; 2 usage.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Annotated, Any, Final

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from thoughtgate.cli.common import Context, console, err_console, print_json, run_async
from thoughtgate.cli.exit_codes import ExitCode
from thoughtgate.cli.missing_store import missing_store, note_no_store
from thoughtgate.cli.options import ConfigOpt, DbOpt, JsonOpt, LocalOnlyUrlOpt, LocalOpt
from thoughtgate.cli.remote import local_only

if TYPE_CHECKING:
    from thoughtgate.store.apart_backfill import ApartPage, ApartTotals
    from thoughtgate.store.base import EventStore

__all__ = ["LOCAL_ONLY", "register"]

LOCAL_ONLY: Final = (
    "a daemon has no endpoint for it; run it where the daemon's store is reachable (the daemon "
    "may keep running)"
)
"""Why ``store move-apart`` refuses a daemon's address (``cli.remote.local_only``)."""


@contextlib.contextmanager
def _progress(total: int, dry_run: bool) -> Iterator[Callable[[ApartPage], None]]:
    """A progress bar on stderr, when it is a terminal (it goes away at the end): rows looked
    at of those that may hold reasoning inline (counted before the walk; rows appended
    meanwhile hold none), and how many moved."""
    verb = "would move" if dry_run else "moved"
    with Progress(
        TextColumn("moving reasoning apart"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(f"{verb} {{task.fields[moved]}}"),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
        disable=not err_console.is_terminal,
    ) as progress:
        task = progress.add_task("move", total=total, moved=0)
        moved = 0

        def advance(page: ApartPage) -> None:
            nonlocal moved
            moved += page.moved
            progress.update(task, advance=page.looked_at, moved=moved)

        yield advance


def _document(totals: ApartTotals, dry_run: bool, candidates: int) -> dict[str, Any]:
    return {
        "dry_run": dry_run,
        "candidates": candidates,
        "looked_at": totals.looked_at,
        "moved": 0 if dry_run else totals.moved,
        "to_move": totals.moved if dry_run else 0,
        "refused": [{"run_id": r, "seq": s} for r, s in totals.refused],
    }


def _summary(totals: ApartTotals, dry_run: bool) -> str:
    rows = f"{totals.moved} row{'' if totals.moved == 1 else 's'}"
    looked = f"looked at {totals.looked_at} whole rows of the types that keep reasoning apart"
    if dry_run and totals.moved:  # (no "run without --dry-run" when there is nothing to move)
        keep = "keeps" if totals.moved == 1 else "keep"
        text = f"{looked}: {rows} {keep} reasoning inline (run without --dry-run to move them)"
    elif totals.moved:
        text = f"{looked}: moved the reasoning of {rows} apart"
    else:
        text = f"{looked}: none keeps reasoning inline, nothing to move"
    if totals.refused:
        shown = ", ".join(f"{r}#{s}" for r, s in totals.refused[:10])
        more = ", ..." if len(totals.refused) > 10 else ""
        text += (
            f"; {len(totals.refused)} left as they are: their stored payload is not a JSON "
            f"object this version wrote ({shown}{more})"
        )
    return text


def register(app: typer.Typer) -> None:
    store = typer.Typer(
        help="Maintain the local store (admin and above; the daemon may keep running).",
        no_args_is_help=True,
    )
    app.add_typer(store, name="store")

    @store.command("move-apart")
    def move_apart_command(
        dry_run: Annotated[
            bool,
            typer.Option("--dry-run", help="Count the rows that would move; write nothing."),
        ] = False,
        batch: Annotated[
            int,
            typer.Option(
                "--batch",
                metavar="N",
                min=1,
                max=10_000,
                help="Rows moved per transaction, at most (each also stops at a few MB).",
            ),
        ] = 100,
        *,
        db: DbOpt = None,
        config: ConfigOpt = None,
        json_out: JsonOpt = False,
        local: LocalOpt = False,
        url: LocalOnlyUrlOpt = None,
    ) -> None:
        """Move the reasoning of events recorded before ADR 0160 out of their rows (admin and
        above; the local store only), so a reader who may not see it never loads it.

        Online: small transactions, the daemon may keep running. Resumable: stopped or failed,
        run it again. The events read whole are unchanged; only where their bytes sit moves."""

        async def main() -> ExitCode:
            from thoughtgate.access.filter import require_role
            from thoughtgate.access.roles import Role
            from thoughtgate.store.apart_backfill import ApartTotals, move_all_apart

            local_only(url, local=local, command="store move-apart", why=LOCAL_ONLY)
            ctx = Context(config_path=config, db=db, view_as=None)
            require_role(ctx.role, Role.ADMIN, "moving reasoning apart in the store")
            totals, candidates = ApartTotals(), 0
            if (missing := await missing_store(ctx.db_url)) is not None:
                note_no_store(missing)
            else:

                async def body(store: EventStore) -> ApartTotals:
                    nonlocal candidates
                    candidates = await store.inline_candidates()
                    with _progress(candidates, dry_run) as advance:
                        return await move_all_apart(
                            store, dry_run=dry_run, batch=batch, each=advance
                        )

                totals = await ctx.using(body)
            if json_out:
                print_json(_document(totals, dry_run, candidates))
            else:
                console.print(
                    _summary(totals, dry_run), highlight=False, markup=False, soft_wrap=True
                )
            return ExitCode.FAILED if totals.refused else ExitCode.COMPLETED

        raise typer.Exit(run_async(main()))
