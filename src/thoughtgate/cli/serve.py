"""``thoughtgate serve``: the HTTP daemon (its stack is imported only when it starts)."""

from __future__ import annotations

import sys
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Annotated

import typer

from thoughtgate.access.roles import Role
from thoughtgate.cli.common import Context, err_console, one_line_errors, run_async
from thoughtgate.cli.options import ConfigOpt, DbOpt
from thoughtgate.errors import UsageError
from thoughtgate.log_records import exception_summary

if TYPE_CHECKING:
    from thoughtgate.engine.tools import ToolRegistry
    from thoughtgate.store.base import EventStore

__all__ = ["register"]

BOOTSTRAP_KEY_NAME = "bootstrap-owner"
TOOLS_ENTRY_POINT_GROUP = "thoughtgate.tools"
LOG_LEVELS = ("debug", "info", "warning", "error")


def daemon_tools(references: list[str] | None, *, words: bool = False) -> ToolRegistry:
    """The tools runs may name: ``--tools module:attr`` plus installed ``thoughtgate.tools``
    entry points (each a tool, a function, or a list of them). Callers pick by name; they can
    never send code.

    A broken plug-in is named, not fatal. Its exception's text is its author's and may hold
    anything, so the warning names its class (and a code its library gives), and its words only
    with ``words`` (``--log-level debug``), as every log line does (ADR 0104). Printed without
    console markup: a ``[/x]`` in the text must not stop the daemon."""
    from thoughtgate.engine.tools import ToolRegistry, load_tools

    registry = load_tools(references or [])
    for entry in entry_points(group=TOOLS_ENTRY_POINT_GROUP):
        try:
            target = entry.load()
        except Exception as exc:
            said = f"{type(exc).__name__}: {exc}" if words else exception_summary(exc)
            err_console.print(
                f"warning: cannot load tools from entry point {entry.name}: {said}",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )
            continue
        for item in target if isinstance(target, list | tuple | ToolRegistry) else [target]:
            registry.add(item)
    return registry


async def bootstrap_key(store: EventStore, local_role: Role) -> tuple[str, str] | None:
    """``(name, key)`` of a key made when the store has never held one (a fresh database or
    ``memory://``), with the local user's role (``access.local_role``, owner by default): whoever
    starts the daemon gets no key above the role they have on the command line, where ``keys
    create`` needs admin and ``mcp --role`` stops at it (ADR 0121)."""
    from thoughtgate.access.keys import create_key

    if await store.list_api_keys():
        return None
    name = BOOTSTRAP_KEY_NAME if local_role is Role.OWNER else f"bootstrap-{local_role.label}"
    return name, (await create_key(store, name=name, role=local_role.label)).key


def register(app: typer.Typer) -> None:
    @app.command()
    def serve(
        host: Annotated[
            str | None,
            typer.Option(
                "--host",
                metavar="HOST",
                help=(
                    "Address to listen on (default: server.host, else 127.0.0.1); any other "
                    "than loopback (0.0.0.0, a LAN address) needs server.allowed_hosts."
                ),
            ),
        ] = None,
        port: Annotated[
            int | None,
            typer.Option(
                "--port",
                metavar="PORT",
                min=0,
                max=65535,
                help="Port to listen on (default: server.port, else 8765); 0 picks a free one.",
            ),
        ] = None,
        db: DbOpt = None,
        config: ConfigOpt = None,
        tools: Annotated[
            list[str] | None,
            typer.Option("--tools", metavar="MODULE:ATTR", help="Tools runs may use (repeatable)."),
        ] = None,
        shutdown_grace: Annotated[
            float,
            typer.Option(
                "--shutdown-grace",
                metavar="SECONDS",
                min=0.0,
                help=(
                    "How long in-flight runs may finish on SIGTERM, SIGHUP or Ctrl+C; then"
                    " durable runs are left to resume elsewhere (or here at the next start),"
                    " others are interrupted."
                ),
            ),
        ] = 3.0,
        bootstrap: Annotated[
            bool,
            typer.Option(
                "--bootstrap-key/--no-bootstrap-key",
                help="Print a one-time key with your local role (access.local_role, owner by "
                "default) when the store has no keys at all.",
            ),
        ] = True,
        log_level: Annotated[
            str,
            typer.Option("--log-level", metavar="LEVEL", help=" | ".join(LOG_LEVELS)),
        ] = "info",
    ) -> None:
        """Serve the HTTP API (runs, events, live SSE, keys) until SIGTERM, SIGHUP or Ctrl+C."""
        if log_level.lower() not in LOG_LEVELS:
            # checked before the daemon starts: logging would raise a traceback at start-up
            with one_line_errors():
                raise UsageError(
                    f"unknown --log-level {log_level!r}; allowed: {', '.join(LOG_LEVELS)}"
                )

        async def body() -> None:
            from thoughtgate.events.pipeline import check_summarizer_model
            from thoughtgate.listening import host_port, listen
            from thoughtgate.orchestration.durability import make_durable
            from thoughtgate.orchestration.runtime import Runtime
            from thoughtgate.server.app import create_app
            from thoughtgate.server.hosts import check_exposure
            from thoughtgate.server.logs import configure_logging
            from thoughtgate.server.serve import serve_app
            from thoughtgate.store.urls import describe_store
            from thoughtgate.telemetry import telemetry_sinks

            ctx = Context(config_path=config, db=db, view_as=None)
            check_summarizer_model(ctx.config.visible_reasoning)  # not each surface run failing
            bind_host = host or ctx.config.server.host
            bind_port = ctx.config.server.port if port is None else port
            # Bound before anything else (the process's logging, the store): a port in use stops
            # here, in one line, before start-up ran or a bootstrap key was made that nobody
            # would be shown.
            sockets = listen(bind_host, bind_port)
            engine = None
            try:
                # An address other than loopback without server.allowed_hosts: refused before
                # the store is opened or a key made (ADR 0164). With no file and no variable
                # the source is "defaults", which names no place to look: the key says it all.
                source = "" if ctx.config.source == "defaults" else ctx.config.source
                check_exposure(sockets, ctx.config.server.allowed_hosts, source=source)
                configure_logging(log_level.lower())
                registry = daemon_tools(tools, words=log_level.lower() == "debug")
                store = await ctx.store()
                runtime = Runtime(
                    store, ctx.config, tools=registry, sinks=telemetry_sinks(ctx.config)
                )
                engine = make_durable(runtime)
                if engine is not None:
                    # Launched before the app starts (which finds it launched) and before a
                    # bootstrap key is made: a launch that fails is one error line and exit 1,
                    # not a start-up traceback after a key nobody is shown (ADR 0125).
                    await engine.launch(listen=[t.name for t in registry])
                first_key = await bootstrap_key(store, ctx.role) if bootstrap else None
                application = create_app(runtime, ctx.config, shutdown_grace_s=shutdown_grace)

                def ready(bound_host: str, bound_port: int) -> None:
                    err_console.print(
                        f"thoughtgate listening on http://{host_port(bound_host, bound_port)} "
                        f"(store {describe_store(ctx.db_url)})",
                        highlight=False,
                        soft_wrap=True,
                    )
                    if first_key:
                        name, key = first_key
                        err_console.print(
                            f"no API keys in this store yet; created {ctx.role.label} key "
                            f"'{name}' (shown once, keep it):\n{key}",
                            highlight=False,
                            soft_wrap=True,
                        )
                    sys.stderr.flush()

                await serve_app(
                    application,
                    host=bind_host,
                    port=bind_port,
                    log_level=log_level.lower(),
                    on_ready=ready,
                    sockets=sockets,
                )
            finally:
                for sock in sockets:
                    sock.close()
                if engine is not None:  # (the app's shut-down closed it, unless it never ran)
                    await engine.close()
                await ctx.close()

        from thoughtgate.server.serve import daemon_runner

        run_async(body(), runner=daemon_runner())
