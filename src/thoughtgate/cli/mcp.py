"""``thoughtgate mcp``: serve the MCP tools over stdio for an MCP host."""

from __future__ import annotations

from typing import Annotated

import typer

from thoughtgate.cli.common import run_async
from thoughtgate.cli.options import ConfigOpt, DbOpt
from thoughtgate.config import load_config, resolve_store

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    @app.command("mcp")
    def mcp(
        db: DbOpt = None,
        config: ConfigOpt = None,
        role: Annotated[
            str | None,
            typer.Option(
                "--role",
                metavar="ROLE",
                help="Role the MCP host reads as (default: mcp.role, member).",
            ),
        ] = None,
        tools: Annotated[
            list[str] | None,
            typer.Option(
                "--tools",
                metavar="MODULE:ATTR",
                help="Python tools the model may call in the host's runs (repeatable).",
            ),
        ] = None,
        approve_all: Annotated[
            bool,
            typer.Option(
                "--approve-all",
                help="Approve every tool call that asks for approval (else it times out).",
            ),
        ] = False,
    ) -> None:
        """Serve orchestration_run, orchestration_status, orchestration_approve over stdio (MCP)."""
        # Imported here so `thoughtgate --help` does not pay for the MCP SDK (an extra).
        from thoughtgate.engine.tools import load_tools

        try:
            from thoughtgate.mcp_server import resolve_mcp_role, serve_stdio
        except ImportError as exc:
            from thoughtgate.cli.common import err_console
            from thoughtgate.cli.exit_codes import ExitCode

            err_console.print(
                f"error: thoughtgate mcp needs the MCP SDK: pip install 'thoughtgate[mcp]' ({exc})",
                highlight=False,
                markup=False,
                soft_wrap=True,  # one line, as every error (a script reads stderr)
            )
            raise typer.Exit(ExitCode.USAGE) from None

        async def body() -> None:
            from thoughtgate.events.pipeline import check_summarizer_model

            cfg = load_config(config)
            check_summarizer_model(cfg.visible_reasoning)  # not each surface run failing
            url = resolve_store(db, None, cfg.store.url)
            registry = load_tools(tools) if tools else None
            await serve_stdio(
                cfg,
                db_url=url,
                role=resolve_mcp_role(cfg, role),
                tools=registry,
                approve_all=approve_all,
            )

        run_async(body())
