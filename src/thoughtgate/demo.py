"""``thoughtgate demo``: the main job on the embedded default, with no API key and no network.

A two-tool agent run in ``surface`` mode, recorded in the default SQLite store, shown live as the
local role may see it, then summarized.
"""

from __future__ import annotations

from collections.abc import Iterator

from thoughtgate.cli.common import Context, console, print_json
from thoughtgate.engine.approvals import ApprovalBroker
from thoughtgate.engine.tools import ToolRegistry, tool
from thoughtgate.orchestration.runtime import RunRequest, Runtime
from thoughtgate.providers.base import Provider, TurnRequest
from thoughtgate.store.base import EventStore
from thoughtgate.telemetry import telemetry_sinks
from thoughtgate.testing.fake import FakeProvider, reasoning, text, tool_call
from thoughtgate.types import Chunk

__all__ = ["DEMO_PROMPT", "demo_tools", "run_demo"]

DEMO_PROMPT = "What is the largest city in my country?"


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


def _script(request: TurnRequest, turn: int) -> Iterator[Chunk | list[Chunk]]:
    if turn == 0:
        yield reasoning("To name the largest city I first need the user's country. ")
        yield reasoning("I will call get_country.")
        yield text("Let me look up your country.")
        yield tool_call("get_country", {}, call_id="call_1")
    elif turn == 1:
        yield reasoning("The country is Mexico; now the largest city there.")
        yield tool_call("largest_city", {"country": "Mexico"}, call_id="call_2")
    else:
        yield reasoning("I have both facts; answer in one sentence.")
        yield text("The largest city in your country, Mexico, is Mexico City.")


def demo_provider(_: str) -> Provider:
    return FakeProvider(_script, model="demo")


async def run_demo(*, db: str | None, config_path: str | None, json_out: bool) -> None:
    from thoughtgate.cli.render import render_run
    from thoughtgate.cli.runs import execute_and_follow, run_view_json

    ctx = Context(config_path=config_path, db=db, view_as=None)

    async def go(store: EventStore) -> None:
        runtime = Runtime(
            store,
            ctx.config,
            provider_factory=demo_provider,
            tools=demo_tools(),
            approvals=ApprovalBroker(),
            sinks=telemetry_sinks(ctx.config),
        )
        if not json_out:
            console.print(f"[bold]thoughtgate demo[/] · store {ctx.db_url} · role {ctx.role}")
            console.print(f"[bold]prompt:[/] {DEMO_PROMPT}\n")
        view = await execute_and_follow(
            runtime,
            RunRequest(DEMO_PROMPT, model="fake:demo"),
            role=ctx.role,
            chain_of_thought="surface",
            live=not json_out,
        )
        if json_out:
            print_json(run_view_json(view))
        else:
            render_run(console, view, role=ctx.role.label)
            console.print(f"\nTry: [bold]thoughtgate events {view['run_id']} --view-as viewer[/]")

    await ctx.using(go)
