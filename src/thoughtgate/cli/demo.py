"""``thoughtgate demo``: the main job on the embedded default, with no API key and no network.

The run itself (emulator, adapter, tools) is ``thoughtgate.demo``; this command records it in the
default store, shows it live as the local role may see it, then summarizes it. Always locally:
a daemon's address (``--url``, or ``THOUGHTGATE_URL`` without ``--local``) is refused (ADR
0162). Its exit code is the run's outcome, as for ``run`` (``cli.exit_codes``). The runtime and
the emulator are imported inside the command, so ``thoughtgate --help`` stays quick.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

import typer
from rich.markup import escape
from rich.text import Text

from thoughtgate.cli.common import Context, console, one_line_errors, run_async
from thoughtgate.cli.exit_codes import for_run_status
from thoughtgate.cli.options import ConfigOpt, DbOpt, JsonOpt, LocalOnlyUrlOpt, LocalOpt
from thoughtgate.cli.remote import local_only
from thoughtgate.errors import public_url
from thoughtgate.store.urls import describe_store

if TYPE_CHECKING:
    from thoughtgate.store.base import EventStore

__all__ = ["LOCAL_ONLY", "register", "run_demo"]

LOCAL_ONLY = (
    "it runs against an emulator it starts on this machine and records in the local store; "
    "`thoughtgate run` runs on a daemon"
)
"""Why ``demo`` refuses a daemon's address (``cli.remote.local_only``, ADR 0162)."""


async def run_demo(*, db: str | None, config_path: str | None, json_out: bool) -> str:
    """Run the demo; returns the run's status (the command's exit code follows it)."""
    from thoughtgate.cli.render import print_run
    from thoughtgate.cli.runs import execute_and_follow
    from thoughtgate.demo import DEMO_MODEL, DEMO_PROMPT, demo_config, demo_provider, demo_runtime
    from thoughtgate.orchestration.runtime import RunRequest

    ctx = Context(config_path=config_path, db=db, view_as=None)
    with demo_provider() as (url, provider):

        async def go(store: EventStore) -> str:
            runtime = demo_runtime(store, ctx.config, provider)
            if not json_out:
                console.print(
                    f"[bold]thoughtgate demo[/] · {DEMO_MODEL} via the emulator at {url}"
                    f" · store {escape(describe_store(ctx.db_url))} · role {ctx.role}",
                    soft_wrap=True,  # the emulator's URL and the store's path, unbroken
                )
                sources = ", ".join(demo_config(ctx.config).visible_reasoning.summarizers)
                console.print(f"[bold]visible steps from:[/] {sources}")
                console.print(f"[bold]prompt:[/] {DEMO_PROMPT}\n")
            view = await execute_and_follow(
                runtime,
                RunRequest(DEMO_PROMPT, model=DEMO_MODEL),
                role=ctx.role,
                chain_of_thought="surface",
                live=not json_out,
            )
            status = print_run(view, json_out=json_out, role=ctx.role.label)
            if not json_out:
                console.print(
                    _viewer_hint(view.run_id, ctx.db_url, db, config_path), soft_wrap=True
                )
            return status

        return await ctx.using(go)


def _viewer_hint(run_id: str, db_url: str, db: str | None, config_path: str | None) -> Text:
    """The command that shows the run as a viewer sees it, to copy: with the ``--db`` and
    ``--config`` this demo was given (without them it would look in another store), one line at
    any width. A password in ``--db`` is not printed (``--db URL`` stands for it), and a
    ``memory://`` run is gone once this command ends: said instead."""
    if db_url.startswith("memory:"):
        return Text(
            "\nThe run was in memory:// and is gone; run the demo on a SQLite file (the default) "
            "to read it back as a viewer."
        )
    words = ["thoughtgate", "events", run_id, "--view-as", "viewer"]
    if db is not None:
        # A server's URL with a user, a password or a query, or one that cannot be read, is not
        # shown: a password typed with a bare "/" or "?" is where urlsplit finds no password.
        local = db.startswith(("sqlite:", "memory:"))
        words += ["--db", db if local or public_url(db) == db else "URL"]
    if config_path is not None:
        words += ["--config", config_path]
    command = " ".join(shlex.quote(w) if w != "URL" else w for w in words)
    return Text.assemble("\nSee what a viewer gets: ", (command, "bold"))


def register(app: typer.Typer) -> None:
    @app.command()
    def demo(
        db: DbOpt = None,
        config: ConfigOpt = None,
        json_out: JsonOpt = False,
        local: LocalOpt = False,
        url: LocalOnlyUrlOpt = None,
    ) -> None:
        """The main job on the embedded default: no API key, no network."""
        with one_line_errors():
            local_only(url, local=local, command="demo", why=LOCAL_ONLY)
        raise typer.Exit(
            for_run_status(run_async(run_demo(db=db, config_path=config, json_out=json_out)))
        )
