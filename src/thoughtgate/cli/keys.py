"""``thoughtgate keys create | list | revoke``: API keys for the daemon, in its store or through it.

Managing keys needs local role ``admin`` or above (``access.local_role``, default ``owner``), and
a key is never given a role above the local one. With ``--url`` or ``THOUGHTGATE_URL`` the
commands act on that daemon instead (``/v1/keys``, as the ``--key``'s role, admin and above):
a user who exported a daemon's address manages its keys, not the local store's unawares;
``--local`` acts on the local store although the address is exported (ADR 0162).

Only ``create`` creates a store that is not there (``cli.missing_store``): ``list`` lists
no keys and names the path on stderr, as ``runs`` does, and ``revoke`` fails naming it (exit 2,
as for a key that is not found).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from thoughtgate.access.filter import require_role
from thoughtgate.access.keys import create_key, key_view, revoke_key
from thoughtgate.access.roles import ROLE_NAMES, Role, parse_role
from thoughtgate.cli.common import (
    Context,
    console,
    err_console,
    inert_text,
    one_line_errors,
    print_json,
    run_async,
)
from thoughtgate.cli.missing_store import missing_store, note_no_store, nothing_there
from thoughtgate.cli.options import (
    ArgumentsByName,
    ConfigOpt,
    DbOpt,
    JsonOpt,
    KeyOpt,
    LocalOpt,
    UrlOpt,
)
from thoughtgate.cli.remote import Remote, remote_or_local
from thoughtgate.errors import AccessDeniedError, UsageError, public_url
from thoughtgate.store.base import EventStore

if TYPE_CHECKING:
    from thoughtgate.client import ThoughtgateClient

__all__ = ["register"]


def _when(ts: float | None) -> str:
    if ts is None:
        return ""
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


_TABLE_OVERHEAD = 16  # five columns' borders and padding


def _render_keys(keys: list[dict[str, Any]]) -> None:
    """A table, or where it does not fit (an 80-column terminal, a pipe) two lines a key: its id,
    role and name, then when it was created and revoked. The id and the name are what ``keys
    revoke`` takes: never cut to an ellipsis, as ``runs`` never cuts a run id. ``keys``: as
    ``key_view`` shows them, the local store's or a daemon's (whose words are shown inert: a
    server at ``--url`` may not be ours)."""
    rows = [
        (
            inert_text(k["name"]),
            inert_text(k["role"]),
            inert_text(k["key_id"]),
            _when(k.get("created_at")),
            _when(k.get("revoked_at")),
        )
        for k in keys
    ]
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


@dataclass(frozen=True, slots=True)
class Where:
    """Where a key command acts: the daemon ``--url`` / ``THOUGHTGATE_URL`` names (with
    ``--key``'s role, admin and above, checked by the daemon), else the local store as the local
    role. A user who exported a daemon's address manages that daemon's keys, not the local
    store's unawares; ``--local`` says the local store is meant (ADR 0162)."""

    config: str | None
    db: str | None
    remote: Remote | None

    @classmethod
    def of(
        cls, *, db: str | None, config: str | None, url: str | None, key: str | None, local: bool
    ) -> Where:
        with one_line_errors():
            return cls(config, db, remote_or_local(url, key, local=local, db=db))

    def act(
        self,
        on_store: Callable[[Role, EventStore], Awaitable[None]],
        on_daemon: Callable[[ThoughtgateClient, str], Awaitable[None]],
        *,
        if_missing: Callable[[str], None] | None = None,
        above: str = "",
    ) -> None:
        """Run ``on_daemon`` with a client and the daemon's address as shown, or ``on_store`` on
        the store as the local role (admin and above only). ``if_missing``: what the command
        does instead when the store is not there, a SQLite file or a PostgreSQL schema (None:
        create it, as a command that records does). ``above``: the local store's words for a
        role above the key's own, when the daemon refuses an admin's key."""
        remote = self.remote

        async def main() -> None:
            if remote is not None:
                async with remote.client() as tg:
                    try:
                        await on_daemon(tg, public_url(remote.url))
                    except AccessDeniedError:
                        role = str((await tg.me())["role"])
                        raise AccessDeniedError(_refusal(role, above)) from None
                return
            ctx = Context(config_path=self.config, db=self.db, view_as=None)
            require_role(ctx.role, Role.ADMIN, "managing API keys")
            if if_missing is not None and (missing := await missing_store(ctx.db_url)) is not None:
                if_missing(missing)
                return
            await ctx.using(lambda store: on_store(ctx.role, store))

        run_async(main())


def _refusal(role: str, above: str) -> str:
    """A daemon's 403 on ``/v1/keys`` in the words the local store uses, with the key's role:
    the daemon's own is generic ("your role does not allow this"). Below admin the key may not
    manage keys at all; from admin up, only a role above its own was refused (``above`` says
    so as the local store would)."""
    if parse_role(role) < Role.ADMIN or not above:
        return f"managing API keys requires role admin or above; this key's role is {role}"
    return f"{above}; this key's role is {role}"


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
        url: UrlOpt = None,
        daemon_key: KeyOpt = None,
        local: LocalOpt = False,
    ) -> None:
        """Create a key and print it once (only its SHA-256 is stored)."""
        where = Where.of(db=db, config=config, url=url, key=daemon_key, local=local)

        def show(created: dict[str, Any], on: str) -> None:
            if json_out:
                print_json(created)
                return
            said = {k: escape(inert_text(v)) for k, v in created.items()}
            console.print(
                f"created {said['role']} key [bold]{said['name']}[/] "
                f"({said['key_id']}){on}; it is shown only now:",
                highlight=False,
            )
            console.print(inert_text(created["key"]), highlight=False, soft_wrap=True, markup=False)

        async def on_store(local_role: Role, store: EventStore) -> None:
            show((await create_key(store, name=name, role=role, by=local_role)).to_dict(), "")

        async def on_daemon(tg: ThoughtgateClient, shown: str) -> None:
            show(await tg.create_key(name=name, role=role), f" on {escape(shown)}")

        where.act(on_store, on_daemon, above="a key cannot be given a role above its creator's")

    @keys.command("list")
    def list_(
        db: DbOpt = None,
        config: ConfigOpt = None,
        json_out: JsonOpt = False,
        url: UrlOpt = None,
        daemon_key: KeyOpt = None,
        local: LocalOpt = False,
    ) -> None:
        """List keys (never their secrets), revoked ones too."""
        where = Where.of(db=db, config=config, url=url, key=daemon_key, local=local)

        def show(records: list[dict[str, Any]], *, store_there: bool = True) -> None:
            if json_out:
                print_json(records)
            elif records:
                _render_keys(records)
            elif store_there:  # not an empty table (where there is no store, the note said so)
                err_console.print("no keys yet (thoughtgate keys create --role ROLE --name NAME)")

        async def on_store(local_role: Role, store: EventStore) -> None:
            show([key_view(k) for k in await store.list_api_keys()])

        async def on_daemon(tg: ThoughtgateClient, shown: str) -> None:
            show(await tg.list_keys())

        def no_keys(path: str) -> None:
            note_no_store(path)
            show([], store_there=False)

        where.act(on_store, on_daemon, if_missing=no_keys)

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
        url: UrlOpt = None,
        daemon_key: KeyOpt = None,
        local: LocalOpt = False,
    ) -> None:
        """Revoke a key by id, or by a name that one active key has; requests with it get 401
        from then on, and its open live streams end within a few seconds."""
        where = Where.of(db=db, config=config, url=url, key=daemon_key, local=local)

        def show(key_id: str, name: str, what: str) -> None:
            if json_out:
                print_json({"revoked": key, "key_id": key_id, "name": name})
            else:
                err_console.print(f"revoked {what} ({escape(key_id)})", highlight=False)

        async def on_store(local_role: Role, store: EventStore) -> None:
            revoked = await revoke_key(store, key, by=local_role)
            if revoked is None:
                raise UsageError(f"no active key with id or name {key!r}")
            show(revoked.key_id, revoked.name, f"{revoked.role} key {escape(revoked.name)}")

        async def on_daemon(tg: ThoughtgateClient, shown: str) -> None:
            revoked = await tg.revoke_key(key)
            key_id, name = inert_text(revoked["key_id"]), inert_text(revoked["name"])
            show(key_id, name, f"key {escape(name)} on {escape(shown)}")

        def no_key(path: str) -> None:
            raise nothing_there(path, f"key {key!r}")

        where.act(
            on_store,
            on_daemon,
            if_missing=no_key,
            above="cannot revoke a key whose role is above yours",
        )
