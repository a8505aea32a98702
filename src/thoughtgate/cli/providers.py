"""``emulate`` (serve the provider emulator) and ``smoke`` (live capability check)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from thoughtgate.cli.common import (
    Context,
    console,
    inert_text,
    one_line_errors,
    print_json,
    run_async,
)
from thoughtgate.cli.exit_codes import ExitCode
from thoughtgate.cli.options import ApiKeyOpt, BaseUrlOpt, ConfigOpt, JsonOpt
from thoughtgate.errors import UsageError

if TYPE_CHECKING:
    from thoughtgate.engine.smoke import Verdict

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    @app.command()
    def emulate(
        host: Annotated[
            str, typer.Option("--host", metavar="HOST", help="Address to listen on.")
        ] = "127.0.0.1",
        port: Annotated[
            int, typer.Option("--port", metavar="PORT", min=0, max=65535, help="Port to listen on.")
        ] = 8766,
        scenario: Annotated[
            str,
            typer.Option(
                "--scenario",
                metavar="NAME",
                help="The scenario for requests that name none (x-emulator-scenario picks one).",
            ),
        ] = "think-and-answer",
    ) -> None:
        """Serve the four provider wire formats from scripted scenarios, offline."""
        from thoughtgate.testing.emulator import Emulator, serve_emulator
        from thoughtgate.testing.emulator.scenarios import builtin_scenarios

        scenarios = builtin_scenarios()
        if scenario not in scenarios:
            with one_line_errors():
                known = ", ".join(sorted(scenarios))
                raise UsageError(f"unknown scenario {scenario!r}; known: {known}")
        emulator = Emulator()
        for item in scenarios.values():
            emulator.add(item)
        emulator.default = scenario
        with one_line_errors(), serve_emulator(emulator, host=host, port=port) as server:
            console.print(
                f"emulator on {server.url} (Anthropic base URL) and {server.v1} "
                f"(OpenAI / OpenRouter / compatible); default scenario {scenario!r}; "
                "pick another with the x-emulator-scenario header. Ctrl-C stops."
            )
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                console.print("stopped")

    @app.command()
    def smoke(
        model: Annotated[
            str,
            typer.Option("--model", metavar="PROVIDER:MODEL", help="The model to check."),
        ],
        base_url: BaseUrlOpt = None,
        api_key: ApiKeyOpt = None,
        config: ConfigOpt = None,
        json_out: JsonOpt = False,
    ) -> None:
        """Live check with your key: which capabilities are proven, and why (costs a few tokens).

        Exits 0 when every check the adapter claims for the model was proven; 1 when a request
        to the provider failed (a check could not be made); 5 when the provider answered and a
        claimed check was not proven. The last line (on stderr with --json) says which."""
        from thoughtgate.engine.smoke import smoke as run_smoke
        from thoughtgate.engine.smoke import verdict
        from thoughtgate.orchestration.runtime import provider_settings_from_config

        async def body() -> Verdict:
            ctx = Context(config_path=config, db="memory://", view_as=None)
            settings = provider_settings_from_config(
                ctx.config, model, base_url=base_url, api_key=api_key
            )
            results = await run_smoke(model, settings)
            said = verdict(results)
            if json_out:
                print_json([r.to_dict() for r in results])
                typer.echo(said.summary, err=True)
                return said
            for r in results:
                if r.proven:
                    mark = "[green]proven[/]"
                elif r.claimed is False:  # not claimed for this model either: no failure
                    mark = "[dim]not claimed[/]"
                else:
                    mark = "[red]not proven[/]"
                # the detail quotes the provider ("[anthropic 529 ...] Overloaded"): not markup
                console.print(
                    f"{r.name:<20} {mark}  {escape(inert_text(r.detail))}", highlight=False
                )
            # the verdict is the last line a script reads (`tail -1`): never wrapped
            console.print(escape(inert_text(said.summary)), highlight=False, soft_wrap=True)
            return said

        said = run_async(body())
        if not said.ok:
            raise typer.Exit(ExitCode.FAILED if said.unreached else ExitCode.NOT_PROVEN)
