"""``run``, ``status``, ``runs``, ``events`` and ``trace``."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Mapping
from typing import Annotated, Any

import typer

from thoughtgate.access.filter import filter_event, filter_events, filter_run, require_role
from thoughtgate.access.roles import Role
from thoughtgate.cli.common import Context, console, print_json, run_async, with_store
from thoughtgate.cli.render import LivePrinter, render_run, render_runs_table
from thoughtgate.engine.approvals import ApprovalBroker, Decision
from thoughtgate.engine.tools import ToolRegistry, load_tools
from thoughtgate.events.thread import rebuild
from thoughtgate.events.views import RunView
from thoughtgate.orchestration.runtime import (
    RunRequest,
    Runtime,
    provider_settings_from_config,
)
from thoughtgate.providers.base import Provider, create_provider
from thoughtgate.store.base import EventStore
from thoughtgate.telemetry import telemetry_sinks

__all__ = [
    "ConfigOpt",
    "DbOpt",
    "JsonOpt",
    "ViewAsOpt",
    "execute_and_follow",
    "register",
    "run_view_json",
]

DbOpt = Annotated[
    str | None, typer.Option("--db", help="sqlite:///PATH, postgresql://…, memory://")
]
ConfigOpt = Annotated[str | None, typer.Option("--config", help="Path to thoughtgate.toml.")]
ViewAsOpt = Annotated[str | None, typer.Option("--view-as", help="Preview what a lower role sees.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable JSON on stdout.")]


def run_view_json(view: RunView) -> dict[str, Any]:
    """The ``run --json`` shape: reasoning is null unless surface mode and developer+."""
    return {
        "run_id": view["run_id"],
        "status": view["status"],
        "chain_of_thought": view["chain_of_thought"],
        "tasks": [
            {"task_id": t["task_id"], "output": t["output"], "reasoning": t.get("reasoning")}
            for t in view["tasks"]
        ],
        "usage": view["usage"],
    }


def _cli_decider(approve_all: bool) -> Any:
    async def decide(call_id: str, tool_name: str, arguments: Mapping[str, Any]) -> Decision | None:
        if approve_all:
            return "approve"
        if not sys.stdin.isatty():
            return None
        # The question goes to stderr: stdout holds only the run's output (``--json`` must stay
        # one clean document even when the terminal answers the prompt).
        answer = await asyncio.to_thread(
            typer.confirm,
            f"Allow tool {tool_name} with {dict(arguments)}?",
            default=False,
            err=True,
        )
        return "approve" if answer else "reject"

    return decide


async def execute_and_follow(
    runtime: Runtime,
    request: RunRequest,
    *,
    role: Role,
    chain_of_thought: str | None,
    live: bool,
) -> RunView:
    """Create and execute a run; when ``live``, print its filtered events as they are recorded."""
    run = await runtime.create_run(request, chain_of_thought=chain_of_thought)
    printer = LivePrinter(console) if live else None

    async def follow() -> None:
        assert printer is not None
        async for event in runtime.store.tail(run.run_id):
            shown = filter_event(event, role, mode=run.chain_of_thought)
            if shown is not None:
                printer.show(shown)
        printer.end()

    follower = asyncio.create_task(follow()) if live else None
    try:
        finished = await runtime.execute(run.run_id)
    finally:
        if follower is not None:
            try:
                await asyncio.wait_for(follower, timeout=5)
            except TimeoutError:
                follower.cancel()
    return filter_run(finished, role)


def register(app: typer.Typer) -> None:
    @app.command()
    def run(
        prompt: Annotated[str, typer.Argument(help="What to ask.")],
        model: Annotated[
            str | None,
            typer.Option("--model", help="PROVIDER:MODEL, e.g. anthropic:claude-sonnet-4-5"),
        ] = None,
        base_url: Annotated[str | None, typer.Option("--base-url")] = None,
        api_key: Annotated[str | None, typer.Option("--api-key")] = None,
        cot: Annotated[
            str | None, typer.Option("--cot", help="hidden | surface | telemetry_only")
        ] = None,
        tools: Annotated[
            list[str] | None, typer.Option("--tools", help="module:attr of tools (repeatable)")
        ] = None,
        approve_all: Annotated[bool, typer.Option("--approve-all")] = False,
        view_as: ViewAsOpt = None,
        db: DbOpt = None,
        config: ConfigOpt = None,
        json_out: JsonOpt = False,
    ) -> None:
        """Run a prompt through a model and record everything."""

        async def body() -> None:
            ctx = Context(config_path=config, db=db, view_as=view_as)

            def factory(name: str) -> Provider:
                settings = provider_settings_from_config(
                    ctx.config, name, base_url=base_url, api_key=api_key
                )
                return create_provider(name, settings)

            async def go(store: EventStore) -> None:
                runtime = Runtime(
                    store,
                    ctx.config,
                    provider_factory=factory,
                    tools=load_tools(tools) if tools else ToolRegistry(),
                    approvals=ApprovalBroker(decider=_cli_decider(approve_all)),
                    sinks=telemetry_sinks(ctx.config),
                )
                view = await execute_and_follow(
                    runtime,
                    RunRequest(prompt, model=model),
                    role=ctx.role,
                    chain_of_thought=cot,
                    live=not json_out,
                )
                if json_out:
                    print_json(run_view_json(view))
                else:
                    render_run(console, view, role=ctx.role.label)

            await ctx.using(go)

        run_async(body())

    @app.command()
    def status(
        run_id: str,
        view_as: ViewAsOpt = None,
        db: DbOpt = None,
        config: ConfigOpt = None,
        json_out: JsonOpt = False,
    ) -> None:
        """Show one run with its tasks (as your role may see it)."""

        async def body(ctx: Context, store: EventStore) -> None:
            run = await store.get_run(run_id)
            view = filter_run(run, ctx.role)
            if json_out:
                print_json(view)
                return
            events = filter_events(await store.read(run_id), ctx.role, mode=run.chain_of_thought)
            render_run(console, view, role=ctx.role.label, thread=rebuild(events))

        with_store(config=config, db=db, view_as=view_as, body=body)

    @app.command()
    def runs(
        limit: Annotated[int, typer.Option("--limit")] = 20,
        view_as: ViewAsOpt = None,
        db: DbOpt = None,
        config: ConfigOpt = None,
        json_out: JsonOpt = False,
    ) -> None:
        """List recent runs, newest first."""

        async def body(ctx: Context, store: EventStore) -> None:
            views = [filter_run(r, ctx.role) for r in await store.list_runs(limit=limit)]
            if json_out:
                print_json(views)
            else:
                render_runs_table(console, views)

        with_store(config=config, db=db, view_as=view_as, body=body)

    @app.command()
    def events(
        run_id: str,
        after: Annotated[int, typer.Option("--after")] = 0,
        limit: Annotated[int | None, typer.Option("--limit")] = None,
        view_as: ViewAsOpt = None,
        db: DbOpt = None,
        config: ConfigOpt = None,
        json_out: JsonOpt = False,
    ) -> None:
        """Print a run's events after a sequence number (filtered for your role)."""

        async def body(ctx: Context, store: EventStore) -> None:
            run = await store.get_run(run_id)
            raw = await store.read(run_id, after=after, limit=limit)
            shown = filter_events(raw, ctx.role, mode=run.chain_of_thought)
            if json_out:
                print_json([e.to_dict() for e in shown])
                return
            for e in shown:
                task = f" [dim]{e.task_id}[/]" if e.task_id else ""
                console.print(
                    f"[bold]{e.seq:>5}[/] {e.type}{task} {dict(e.payload)}", highlight=False
                )

        with_store(config=config, db=db, view_as=view_as, body=body)

    @app.command()
    def trace(
        run_id: str,
        view_as: ViewAsOpt = None,
        db: DbOpt = None,
        config: ConfigOpt = None,
        json_out: JsonOpt = False,
    ) -> None:
        """Trace metadata of a run (worker.completed with reasoning): developer and above."""

        async def body(ctx: Context, store: EventStore) -> None:
            require_role(ctx.role, Role.DEVELOPER, "the trace")
            run = await store.get_run(run_id)
            raw = [e for e in await store.read(run_id) if e.type == "worker.completed"]
            shown = filter_events(raw, ctx.role, mode=run.chain_of_thought, surface="trace")
            if json_out:
                print_json([e.to_dict() for e in shown])
                return
            for e in shown:
                console.print_json(data=e.to_dict())

        with_store(config=config, db=db, view_as=view_as, body=body)
