"""``thoughtgate keys create | list | revoke``: API keys for the daemon, straight in the store.

Managing keys needs local role ``admin`` or above (``access.local_role``, default ``owner``), and
a key is never given a role above the local one.

Only ``create`` creates a store that is not there (``cli.missing_store``): ``list`` lists
no keys and names the path on stderr, as ``runs`` does, and ``revoke`` fails naming it (exit 2,
as for a key that is not found).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from thoughtgate.access.filter import require_role
from thoughtgate.access.keys import create_key, key_view, revoke_key
from thoughtgate.access.roles import ROLE_NAMES, Role
from thoughtgate.cli.common import Context, console, err_console, print_json, run_async
from thoughtgate.cli.missing_store import missing_store, note_no_store, nothing_there
from thoughtgate.cli.options import ArgumentsByName, ConfigOpt, DbOpt, JsonOpt
from thoughtgate.errors import UsageError
from thoughtgate.store.base import EventStore
from thoughtgate.store.records import ApiKeyRecord

__all__ = ["register"]


def _when(ts: float | None) -> str:
    if ts is None:
        return ""
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


_TABLE_OVERHEAD = 16  # five columns' borders and padding


def _render_keys(records: list[ApiKeyRecord]) -> None:
    """A table, or where it does not fit (an 80-column terminal, a pipe) two lines a key: its id,
    role and name, then when it was created and revoked. The id and the name are what ``keys
    revoke`` takes: never cut to an ellipsis, as ``runs`` never cuts a run id."""
    rows = [(k.name, k.role, k.key_id, _when(k.created_at), _when(k.revoked_at)) for k in records]
    headers = ("name", "role", "id", "created", "revoked")
    widths = [max((len(r[i]) for r in rows), default=0) for i in range(len(headers))]
    needed = sum(max(w, len(h)) for w, h in zip(widths, headers, strict=True)) + _TABLE_OVERHEAD
    if rows and console.width < needed:
        id_w, role_w = widths[2], widths[1]
        console.print(
            Text(f"{'id'.ljust(id_w)}  {'role'.ljust(role_w)}  name", style="bold"), no_wrap=True
        )
        console.print(Text("  created · revoked", style="bold"), no_wrap=True)
        for name, role, key_id, created, revoked in rows:
            console.print(Text(f"{key_id}  {role.ljust(role_w)}  {name}"), soft_wrap=True)
            console.print(Text(f"  {created} · {revoked or '-'}", style="dim"), no_wrap=True)
        return
    table = Table(*headers)
    for name, role, key_id, created, revoked in rows:
        table.add_row(Text(name), role, key_id, created, revoked)
    console.print(table)


def _on_store(
    config: str | None,
    db: str | None,
    body: Callable[[Role, EventStore], Awaitable[None]],
    *,
    if_missing: Callable[[str], None] | None = None,
) -> None:
    """Run a key command's ``body`` on the store, as the local role (admin and above only).
    ``if_missing``: what the command does instead when the store is not there, a SQLite file
    or a PostgreSQL schema (None: create it, as a command that records does)."""

    async def main() -> None:
        ctx = Context(config_path=config, db=db, view_as=None)
        require_role(ctx.role, Role.ADMIN, "managing API keys")
        if if_missing is not None and (missing := await missing_store(ctx.db_url)) is not None:
            if_missing(missing)
            return
        await ctx.using(lambda store: body(ctx.role, store))

    run_async(main())


def register(app: typer.Typer) -> None:
    keys = typer.Typer(
        name="keys", help="API keys for the daemon (stored hashed).", no_args_is_help=True
    )
    app.add_typer(keys, name="keys")

    @keys.command("create")
    def create(
        role: Annotated[
            str,
            typer.Option(
                "--role", metavar="ROLE", help="The key's role: " + " | ".join(ROLE_NAMES)
            ),
        ],
        name: Annotated[
            str,
            typer.Option(
                "--name",
                metavar="NAME",
                help="Unique among active keys; may not start with key_.",
            ),
        ],
        db: DbOpt = None,
        config: ConfigOpt = None,
        json_out: JsonOpt = False,
    ) -> None:
        """Create a key and print it once (only its SHA-256 is stored)."""

        async def body(local: Role, store: EventStore) -> None:
            created = await create_key(store, name=name, role=role, by=local)
            if json_out:
                print_json(created.to_dict())
                return
            console.print(
                f"created {created.record.role} key [bold]{escape(created.record.name)}[/] "
                f"({created.record.key_id}); it is shown only now:",
                highlight=False,
            )
            console.print(created.key, highlight=False, soft_wrap=True)

        _on_store(config, db, body)

    @keys.command("list")
    def list_(
        db: DbOpt = None,
        config: ConfigOpt = None,
        json_out: JsonOpt = False,
    ) -> None:
        """List keys (never their secrets), revoked ones too."""

        def show(records: list[ApiKeyRecord], *, store_there: bool = True) -> None:
            if json_out:
                print_json([key_view(k) for k in records])
            elif records:
                _render_keys(records)
            elif store_there:  # not an empty table (where there is no store, the note said so)
                err_console.print("no keys yet (thoughtgate keys create --role ROLE --name NAME)")

        async def body(local: Role, store: EventStore) -> None:
            show(await store.list_api_keys())

        def no_keys(path: str) -> None:
            note_no_store(path)
            show([], store_there=False)

        _on_store(config, db, body, if_missing=no_keys)

    @keys.command("revoke", cls=ArgumentsByName)
    def revoke(
        key: Annotated[
            str,
            typer.Argument(
                metavar="ID_OR_NAME",
                help="The key's exact id (key_…), or a name one active key has.",
            ),
        ],
        db: DbOpt = None,
        config: ConfigOpt = None,
        json_out: JsonOpt = False,
    ) -> None:
        """Revoke a key by id, or by a name that one active key has; requests with it get 401
        from then on, and its open live streams end within a few seconds."""

        async def body(local: Role, store: EventStore) -> None:
            revoked = await revoke_key(store, key, by=local)
            if revoked is None:
                raise UsageError(f"no active key with id or name {key!r}")
            if json_out:
                print_json({"revoked": key, "key_id": revoked.key_id, "name": revoked.name})
            else:
                err_console.print(
                    f"revoked {revoked.role} key {escape(revoked.name)} ({revoked.key_id})",
                    highlight=False,
                )

        def no_key(path: str) -> None:
            raise nothing_there(path, f"key {key!r}")

        _on_store(config, db, body, if_missing=no_key)
