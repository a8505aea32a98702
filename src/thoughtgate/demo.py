"""``thoughtgate demo``: the main job on the embedded default, with no API key and no network.

A multi-turn tool run in ``surface`` mode through the real ``anthropic`` adapter, talking HTTP over
loopback to the in-process provider emulator, recorded in the default SQLite store, shown live as
the local role may see it, then summarized.
"""

from __future__ import annotations

from thoughtgate.cli.common import Context, console, print_json
from thoughtgate.engine.approvals import ApprovalBroker
from thoughtgate.engine.tools import ToolRegistry, tool
from thoughtgate.orchestration.runtime import RunRequest, Runtime
from thoughtgate.providers.base import Provider, ProviderSettings, create_provider
from thoughtgate.store.base import EventStore
from thoughtgate.telemetry import telemetry_sinks
from thoughtgate.testing.emulator import Emulator, serve_emulator
from thoughtgate.testing.emulator.scenarios import builtin_scenarios

__all__ = ["DEMO_MODEL", "DEMO_PROMPT", "demo_tools", "run_demo"]

DEMO_PROMPT = "What is the largest city in my country?"
DEMO_MODEL = "anthropic:claude-sonnet-4-5"


def demo_tools() -> ToolRegistry:
    @tool
    def get_country() -> str:
        """The user's country, from their profile."""
        return "Mexico"

    @tool
    def largest_city(country: str) -> str:
        """The most populous city of a country."""
        return {"Mexico": "Mexico City"}.get(country, "unknown")

    return ToolRegistry([get_country, largest_city])


async def run_demo(*, db: str | None, config_path: str | None, json_out: bool) -> str:
    """Run the demo; returns the run's status (the command's exit code follows it)."""
    from thoughtgate.cli.render import render_run
    from thoughtgate.cli.runs import execute_and_follow, run_view_json

    ctx = Context(config_path=config_path, db=db, view_as=None)
    emulator = Emulator().add(builtin_scenarios()["tool-loop"], default=True)

    with serve_emulator(emulator) as server:

        def provider(model: str) -> Provider:
            return create_provider(
                model, ProviderSettings(base_url=server.url, api_key="emulator-no-key-needed")
            )

        async def go(store: EventStore) -> str:
            runtime = Runtime(
                store,
                ctx.config,
                provider_factory=provider,
                tools=demo_tools(),
                approvals=ApprovalBroker(),
                sinks=telemetry_sinks(ctx.config),
            )
            if not json_out:
                console.print(
                    f"[bold]thoughtgate demo[/] · {DEMO_MODEL} via the emulator at {server.url}"
                    f" · store {ctx.db_url} · role {ctx.role}"
                )
                console.print(f"[bold]prompt:[/] {DEMO_PROMPT}\n")
            view = await execute_and_follow(
                runtime,
                RunRequest(DEMO_PROMPT, model=DEMO_MODEL),
                role=ctx.role,
                chain_of_thought="surface",
                live=not json_out,
            )
            if json_out:
                print_json(run_view_json(view))
            else:
                render_run(console, view, role=ctx.role.label)
                console.print(
                    f"\nSee what a viewer gets: [bold]thoughtgate events {view['run_id']}"
                    " --view-as viewer[/]"
                )
            return str(view["status"])

        return await ctx.using(go)
