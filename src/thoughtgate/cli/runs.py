"""``run``, ``resume``, ``status``, ``runs``, ``events`` and ``trace`` (``demo`` is in ``cli.demo``).

``run`` exits with the run's outcome (``cli.exit_codes``): 0 only when it completed. Ctrl-C,
SIGTERM or SIGHUP (its terminal closed) while it runs closes the run ``interrupted`` -- its
unfinished tasks first -- before the command exits (130); ``--json`` still prints the run's
document. On a SQLite or PostgreSQL store the run is durable (ADR 0013): if the process is
killed instead (``kill -9``, a crash, a closed laptop lid that never reopens), the run stays
open, suspended, and ``resume RUN_ID`` continues it from its last completed step.

A process started with SIGINT ignored (a script's background job, ``nohup``) keeps ignoring
Ctrl-C, as POSIX asks: the shell ignores it so that a Ctrl-C at the terminal leaves background
jobs alone. SIGTERM still interrupts such a run. Likewise a process started with SIGHUP ignored
(``nohup thoughtgate run ...``) runs on when its terminal closes, as ``nohup`` asks (ADR 0165).

Before the run is begun -- the config read, the store opened, ``--tools`` loaded, a durable
engine launched -- SIGTERM and SIGHUP keep their default action: the process is killed (a
shell reports 143 or 129) and nothing of a run was stored, so there is nothing to end (a SQLite
or PostgreSQL transaction cut there is rolled back). From the moment the run is created the
handlers are in place: a stop that lands while it is being recorded closes it ``interrupted``
if it was stored and shows it (exit 130), or says nothing was stored (exit 130; ADR 0170).

Heavy modules (the runtime, providers, telemetry) are imported inside the commands, so
``thoughtgate --help`` stays quick.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import typer

from thoughtgate.cli.common import (
    Context,
    console,
    err_console,
    one_line_errors,
    print_json,
    run_async,
    terminal_closed,
    terminals,
)
from thoughtgate.cli.exit_codes import for_run_status
from thoughtgate.cli.missing_store import missing_store, nothing_there
from thoughtgate.cli.options import (
    ApiKeyOpt,
    ApproveAllOpt,
    ArgumentsByName,
    BaseUrlOpt,
    ConfigOpt,
    DbOpt,
    JsonOpt,
    KeyOpt,
    ReadOptions,
    RunIdArg,
    ToolsOpt,
    UrlOpt,
    ViewAsOpt,
    with_read_options,
    within_store_ints,
)
from thoughtgate.cli.readers import NoStoreReader, RunReader, read_command
from thoughtgate.cli.remote import (
    RESUMED_BY_THE_DAEMON,
    remote_resume,
    remote_run,
    resolve_remote,
    show_event,
    wants_daemon,
)
from thoughtgate.cli.run_selection import (
    EVERY_RUN,
    MINE_NEEDS_DAEMON,
    RunFilters,
    with_run_filters,
)
from thoughtgate.errors import RunTakenOverError, UsageError

if TYPE_CHECKING:
    from thoughtgate.access.roles import Role
    from thoughtgate.engine.approvals import Decision
    from thoughtgate.events.schema import Event
    from thoughtgate.events.views import RunView
    from thoughtgate.orchestration.runtime import RunRequest, Runtime
    from thoughtgate.store.base import EventStore
    from thoughtgate.store.records import RunRecord

__all__ = ["execute_and_follow", "read_prompt", "register", "resume_and_follow"]

INTERRUPTED_BY_USER = "interrupted from the terminal (Ctrl-C)"
STOPPED_BY_SIGNAL = "thoughtgate run was stopped (SIGTERM)"
TERMINAL_CLOSED = "thoughtgate run was stopped (SIGHUP: its terminal was closed)"


EMPTY_PROMPT = (
    "the prompt is empty: say what to ask (PROMPT, or '-' to read it from standard input)"
)


def read_prompt(prompt: str) -> str:
    """``-`` means: read the prompt from standard input (``echo hi | thoughtgate run -``). An
    empty or blank prompt is refused the same way given either way."""
    text = sys.stdin.read() if prompt == "-" else prompt
    if not text.strip():
        raise UsageError(EMPTY_PROMPT)
    return text.rstrip("\n") if prompt == "-" else text


def _cli_decider(approve_all: bool, timeout_s: float) -> Any:
    async def decide(call_id: str, tool_name: str, arguments: Mapping[str, Any]) -> Decision | None:
        if approve_all:
            return "approve"
        if not sys.stdin.isatty():
            # Said, or a script's run sits silent for approval_timeout_s (5 minutes by default)
            # and its author cannot tell a wait from a hang.
            err_console.print(
                f"note: tool {tool_name} asks for approval and there is no terminal to ask on: "
                f"it waits up to {timeout_s:g} s (orchestration.approval_timeout_s) for an answer "
                "from elsewhere (the web page, MCP or the HTTP API on this store), then is not run; "
                "--approve-all approves every call",
                highlight=False,
                markup=False,
                soft_wrap=True,
            )
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


async def _print_live(events: AsyncIterator[Event]) -> None:
    """A run's filtered events as they are recorded, for people (``LivePrinter``)."""
    from thoughtgate.cli.render import LivePrinter

    printer = LivePrinter(console)
    async for event in events:
        printer.show(event)
    printer.end()


async def _until_done(
    done: Awaitable[Any], stop: Callable[[str], Awaitable[None]]
) -> Exception | None:
    """Wait for ``done`` (shielded). Ctrl-C (a cancel of the calling task), SIGTERM or SIGHUP
    instead calls ``stop`` with the reason, which must see the run recorded as interrupted; the
    command then goes on to print the run's view instead of propagating the cancel. Returns the
    failure ``done`` ended with, if any, for :func:`_ended_or_raise`.

    SIGHUP (the terminal closed) is a stop like SIGTERM, not the kill its default action is: the
    run's end is recorded now, with its cause, instead of whatever the next process on the store
    makes of a run left open (ADR 0165). What is still printed to that terminal then goes
    nowhere (:func:`terminal_closed`). A process started with SIGHUP ignored (``nohup``) keeps
    ignoring it, as a shell's background job keeps ignoring SIGINT."""
    main = asyncio.current_task()
    loop = asyncio.get_running_loop()
    reason = INTERRUPTED_BY_USER
    ttys = terminals()

    def on_signal(why: str) -> None:
        nonlocal reason
        reason = why
        if why == TERMINAL_CLOSED:
            terminal_closed(ttys)
        if main is not None:
            main.cancel()

    handled = {signal.SIGTERM: STOPPED_BY_SIGNAL}
    hangup = getattr(signal, "SIGHUP", None)  # none on Windows
    if hangup is not None and signal.getsignal(hangup) is not signal.SIG_IGN:
        handled[hangup] = TERMINAL_CLOSED
    for signum, why in handled.items():
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, on_signal, why)
    try:
        await asyncio.shield(done)
    except asyncio.CancelledError:
        await stop(reason)
        if main is not None:
            main.uncancel()
    except RunTakenOverError:
        raise  # its end is another execution's: this process must not show it as ended here
    except Exception as exc:  # recorded on the run (run.failed / run.error); its view says what
        return exc
    finally:
        for signum in handled:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(signum)
    return None


def _ended_or_raise(run: RunRecord, failure: Exception | None) -> RunRecord:
    """``run`` as read after its execution here ended, when that recorded its end. An execution
    that left the run open could not record the end (the store refused it: full, locked past
    its timeout, its file removed, its server gone; ADR 0149): printing the view would show the
    run still ``running`` after this process is gone, with nothing saying why, so the command
    fails instead (exit 1), with the failure when the execution raised it (a durable one logs it
    on stderr, as its workflow's outcome, and returns)."""
    from thoughtgate.errors import RuntimeFailure, failure_text
    from thoughtgate.store.records import OPEN_RUN_STATUSES

    if run.status not in OPEN_RUN_STATUSES:
        return run
    said = f"run {run.run_id} stopped without recording its end, and the store still shows it "
    if failure is None:
        raise RuntimeFailure(said + run.status)
    raise RuntimeFailure(f"{said}{run.status}: {failure_text(failure)}") from failure


async def execute_and_follow(
    runtime: Runtime,
    request: RunRequest,
    *,
    role: Role,
    chain_of_thought: str | None,
    live: bool,
) -> RunView:
    """Create and execute a run, returning its filtered view however it ended.

    When ``live``, its filtered events are printed as they are recorded. A cancellation of the
    calling task (Ctrl-C; SIGTERM is turned into one here) interrupts the run, waits until it is
    recorded as interrupted, and returns its view instead of propagating.
    """
    from thoughtgate.access.filter import filter_run
    from thoughtgate.cli.readers import StoreReader

    reader = StoreReader(runtime.store, role)
    created: list[RunRecord] = []
    named: list[str] = []
    stopped: list[str] = []
    followers: list[asyncio.Task[None]] = []

    def follow(run: RunRecord) -> None:
        created.append(run)
        if live:
            followers.append(asyncio.create_task(_print_live(reader.follow(run.run_id))))

    # Created and executed in one task: a cancel of it ends the run interrupted wherever it
    # lands, its admission included, and one before the task ran finds no run (ADR 0072).
    job = asyncio.create_task(
        runtime.run(request, chain_of_thought=chain_of_thought, created=follow, named=named.append)
    )

    async def stop(reason: str) -> None:
        # The run is cancelled once, with the reason, and given the time to record its end.
        stopped.append(reason)
        job.cancel(reason)
        with contextlib.suppress(BaseException):
            await job

    try:
        failure = await _until_done(job, stop)
    finally:
        for follower in followers:
            try:
                await asyncio.wait_for(follower, timeout=5)
            except TimeoutError:
                follower.cancel()
    if not created and not (stopped and job.cancelled()):
        await job  # no run: its error (the request refused)
    run_id = created[0].run_id if created else await _stopped_in_admission(runtime, named, stopped)
    run = _ended_or_raise(await runtime.store.get_run(run_id), failure)
    return filter_run(run, role)


async def _stopped_in_admission(runtime: Runtime, named: list[str], stopped: list[str]) -> str:
    """The id of a run whose admission the command's stop (Ctrl-C, SIGTERM, SIGHUP) cancelled:
    if it was stored all the same, the admission closed it ``interrupted`` with the stop's
    reason (ADR 0072), and the command shows it as any interrupted run (exit 130). If it was
    not -- the stop landed before the store took it, or before the run had an id -- nothing
    was recorded, which is said, and the command exits 130 too (ADR 0170). Before, the
    cancel escaped as a traceback (exit 1), and a run it closed went unshown."""
    from thoughtgate.cli.exit_codes import ExitCode
    from thoughtgate.errors import RunNotFoundError

    if named:
        try:
            return (await runtime.store.get_run(named[0])).run_id
        except RunNotFoundError:
            pass
    err_console.print(
        f"interrupted before the run was recorded ({stopped[0]}): nothing was stored",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )
    raise typer.Exit(ExitCode.INTERRUPTED)


async def resume_and_follow(runtime: Runtime, run_id: str, *, role: Role, live: bool) -> RunView:
    """Put a suspended durable run on this process's queue, execute it here (or wherever a
    replica with the same tools takes it first), and follow it to its end. Ctrl-C interrupts it
    like ``run`` does."""
    from thoughtgate.access.filter import filter_run
    from thoughtgate.cli.readers import StoreReader
    from thoughtgate.orchestration.resume import check_resumable
    from thoughtgate.store.durable import DurableRunStore
    from thoughtgate.store.records import OPEN_RUN_STATUSES

    engine, store = runtime.durable, runtime.store
    if engine is None or engine.queue is None or not isinstance(store, DurableRunStore):
        raise UsageError(
            "resume needs durable runs: a SQLite or PostgreSQL store with durability.enabled"
        )
    run = await store.get_run(run_id)
    await check_resumable(store, run, [t.name for t in runtime.tools], hint="add --tools")
    if not await store.release_run(run_id, owner=None, queue=True):
        raise UsageError(
            f"run {run_id} is not waiting to resume: another process is executing it (a killed "
            "process's run is suspended once its lease expires, within "
            f"{runtime.leases.ttl_s:.0f} s)"
        )
    after = (await store.read(run_id))[-1].seq
    try:
        await engine.resume(run_id, engine.queue)
    except Exception as exc:  # no workflow to resume, or another version's: never left open
        from thoughtgate.errors import failure_detail, failure_text
        from thoughtgate.store.leases import close_run_interrupted

        # Public: thoughtgate's words; the failure's own go to error_detail (ADR 0073).
        reason = f"it could not resume: {failure_text(exc)}"
        await close_run_interrupted(store, run_id, reason, detail=failure_detail(exc))
        raise UsageError(f"run {run_id} {reason}; it was closed") from exc
    events = StoreReader(store, role).follow(run_id, after=after)
    if live:
        follower = asyncio.create_task(_print_live(events))
    else:
        follower = asyncio.create_task(_drain(events))

    async def stop(reason: str) -> None:
        # The run executes here (or on a replica with the same tools): stop it with the reason.
        while not runtime.cancel(run_id, reason):
            if (await store.get_run(run_id)).status not in OPEN_RUN_STATUSES:
                break
            await asyncio.sleep(0.05)
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(follower, timeout=10)

    await _until_done(follower, stop)
    return filter_run(await store.get_run(run_id), role)


async def _drain(events: AsyncIterator[Event]) -> None:
    async for _ in events:
        pass


def _provider_factory(ctx: Context, base_url: str | None, api_key: str | None) -> Any:
    from thoughtgate.orchestration.runtime import provider_settings_from_config
    from thoughtgate.providers.base import Provider, create_provider

    def factory(name: str) -> Provider:
        settings = provider_settings_from_config(
            ctx.config, name, base_url=base_url, api_key=api_key
        )
        return create_provider(name, settings)

    return factory


@dataclass(frozen=True, slots=True)
class LocalRun:
    """The options ``run`` and ``resume`` share for a run executed in this process, in the order
    both commands declare them (and ``--help`` lists them): one value, so neither command can
    pass the runtime something the other does not."""

    base_url: str | None
    api_key: str | None
    tools: list[str] | None
    approve_all: bool
    view_as: str | None
    db: str | None
    config: str | None
    json_out: bool


def _local_command(
    body: Callable[[Runtime, Context], Awaitable[RunView]],
    options: LocalRun,
    *,
    listen_for_tools: bool = False,
    recorded_run: str | None = None,
) -> str:
    """``run`` and ``resume`` in this process: a runtime on the local store with the ``--tools``
    and the terminal's approvals, durable when the store is; prints the run's view as ``body``
    left it and returns its status. ``recorded_run``: the id of a run ``body`` needs recorded
    already (``resume``'s): a store that is not there is then not created, and the
    command fails naming its path (``cli.missing_store``)."""
    o = options

    async def go(ctx: Context, store: EventStore) -> str:
        from thoughtgate.engine.approvals import ApprovalBroker
        from thoughtgate.engine.tools import ToolRegistry, load_tools
        from thoughtgate.orchestration.durability import make_durable
        from thoughtgate.orchestration.runtime import Runtime
        from thoughtgate.telemetry import telemetry_sinks

        runtime = Runtime(
            store,
            ctx.config,
            provider_factory=_provider_factory(ctx, o.base_url, o.api_key),
            tools=load_tools(o.tools) if o.tools else ToolRegistry(),
            approvals=ApprovalBroker(
                decider=_cli_decider(o.approve_all, ctx.config.orchestration.approval_timeout_s)
            ),
            sinks=telemetry_sinks(ctx.config),
        )
        engine = make_durable(runtime)
        try:
            if engine is not None:
                # ``resume`` listens on the queue of its tools, so the run comes back here
                listen = [t.name for t in runtime.tools] if listen_for_tools else None
                await engine.launch(listen=listen)
            view = await body(runtime, ctx)
        finally:
            if engine is not None:
                await engine.close()
        from thoughtgate.cli.render import print_run

        return print_run(view, json_out=o.json_out, role=ctx.role.label)

    async def main() -> str:
        from thoughtgate.events.pipeline import check_summarizer_model

        ctx = Context(config_path=o.config, db=o.db, view_as=o.view_as)
        check_summarizer_model(ctx.config.visible_reasoning)  # before a run is made to fail
        if recorded_run is not None and (missing := await missing_store(ctx.db_url)) is not None:
            raise nothing_there(missing, f"run {recorded_run!r}")
        return await ctx.using(lambda store: go(ctx, store))

    return run_async(main())


def register(app: typer.Typer) -> None:
    @app.command(cls=ArgumentsByName)
    @with_read_options
    def run(
        prompt: Annotated[
            str,
            typer.Argument(metavar="PROMPT", help="What to ask; '-' reads it from standard input."),
        ],
        model: Annotated[
            str | None,
            typer.Option(
                "--model",
                metavar="PROVIDER:MODEL",
                help="e.g. anthropic:claude-sonnet-4-5 (default: orchestration.default_model).",
            ),
        ] = None,
        system: Annotated[
            str | None,
            typer.Option("--system", metavar="TEXT", help="A system prompt for the model."),
        ] = None,
        base_url: BaseUrlOpt = None,
        api_key: ApiKeyOpt = None,
        cot: Annotated[
            str | None,
            typer.Option(
                "--cot",
                metavar="MODE",
                help="Disclosure mode: hidden | surface | telemetry_only (default: config, "
                "else hidden).",
            ),
        ] = None,
        tools: ToolsOpt = None,
        approve_all: ApproveAllOpt = False,
        *,
        read: ReadOptions,
    ) -> None:
        """Run a prompt through a model and record everything; the exit code is the outcome.

        With --url the daemon runs it (--tools then names tools registered on the daemon)."""
        if wants_daemon(read.url, read.key):
            # The daemon's address and the key are checked before a prompt is read: a user
            # typing it into standard input learns first that it would go nowhere.
            with one_line_errors():
                remote = resolve_remote(
                    read.url,
                    read.key,
                    db=read.db,
                    view_as=read.view_as,
                    base_url=base_url,
                    api_key=api_key,
                    tools=any(":" in t for t in tools or ()),
                )
            assert remote is not None

            async def on_daemon() -> str:
                return await remote_run(
                    remote,
                    lambda: read_prompt(prompt),
                    model=model,
                    system=system,
                    chain_of_thought=cot,
                    tools=list(tools or ()),
                    approve_all=approve_all,
                    json_out=read.json_out,
                )

            raise typer.Exit(for_run_status(run_async(on_daemon())))

        with one_line_errors():  # an empty prompt opens nothing
            text = read_prompt(prompt)

        async def body(runtime: Runtime, ctx: Context) -> RunView:
            from thoughtgate.orchestration.runtime import RunRequest

            return await execute_and_follow(
                runtime,
                RunRequest(text, model=model, system=system),
                role=ctx.role,
                chain_of_thought=cot,
                live=not read.json_out,
            )

        r = read
        local = LocalRun(
            base_url, api_key, tools, approve_all, r.view_as, r.db, r.config, r.json_out
        )
        status = _local_command(body, local)
        raise typer.Exit(for_run_status(status))

    @app.command(cls=ArgumentsByName)
    def resume(
        run_id: RunIdArg,
        base_url: BaseUrlOpt = None,
        api_key: ApiKeyOpt = None,
        tools: ToolsOpt = None,
        approve_all: ApproveAllOpt = False,
        view_as: ViewAsOpt = None,
        db: DbOpt = None,
        config: ConfigOpt = None,
        json_out: JsonOpt = False,
        url: UrlOpt = None,
        key: KeyOpt = None,
    ) -> None:
        """Continue a run whose process was killed, from its last completed step (a completed
        tool call is never run again); the exit code is its outcome.

        With --url the daemon resumes it (with its tools) and this follows it to its end."""
        if wants_daemon(url, key):

            async def on_daemon() -> str:
                remote = resolve_remote(
                    url,
                    key,
                    why=RESUMED_BY_THE_DAEMON,
                    db=db,
                    view_as=view_as,
                    base_url=base_url,
                    api_key=api_key,
                    tools=bool(tools),
                )
                assert remote is not None
                return await remote_resume(
                    remote, run_id, approve_all=approve_all, json_out=json_out
                )

            raise typer.Exit(for_run_status(run_async(on_daemon())))

        async def body(runtime: Runtime, ctx: Context) -> RunView:
            from thoughtgate.cli.common import resolve_run_id

            full_id = await resolve_run_id(runtime.store, run_id)
            return await resume_and_follow(runtime, full_id, role=ctx.role, live=not json_out)

        local = LocalRun(base_url, api_key, tools, approve_all, view_as, db, config, json_out)
        status = _local_command(body, local, listen_for_tools=True, recorded_run=run_id)
        raise typer.Exit(for_run_status(status))

    @app.command(cls=ArgumentsByName)
    @with_read_options
    def status(
        run_id: RunIdArg,
        *,
        read: ReadOptions,
    ) -> None:
        """Show one run with its tasks (as your role may see it)."""

        async def body(reader: RunReader) -> None:
            from thoughtgate.cli.render import render_run
            from thoughtgate.events.thread import rebuild

            full_id = await reader.resolve(run_id)
            view = await reader.view(full_id)
            if read.json_out:
                print_json(view.to_json())
                return
            thread = rebuild(await reader.events(full_id))
            render_run(console, view, role=await reader.role(), thread=thread)

        read_command(body, read)

    @app.command()
    @with_read_options
    @with_run_filters
    def runs(
        limit: Annotated[
            int,
            typer.Option(
                "--limit",
                metavar="N",
                help="Show at most N runs.",
                min=1,
                callback=within_store_ints,
            ),
        ] = 20,
        *,
        filters: RunFilters,
        mine: Annotated[
            bool,
            typer.Option("--mine", help="Only runs started with your --key (needs --url)."),
        ] = False,
        read: ReadOptions,
    ) -> None:
        """List recent runs, newest first, with their full ids and when they started.

        Filters combine with AND, one filter's values with OR; alike on a daemon (--url)."""
        with one_line_errors():
            selection = filters.select(mine=mine, now=time.time())
            if mine and not read.url:
                raise UsageError(MINE_NEEDS_DAEMON)

        async def body(reader: RunReader) -> None:
            from thoughtgate.cli.render import render_runs_table

            views = await reader.runs(limit, selection)
            if read.json_out:
                print_json([v.to_json() for v in views])
            elif views:
                render_runs_table(console, views)
            elif not isinstance(reader, NoStoreReader):  # (that one said there is no store)
                # not an empty table: say whether the filters or the store found nothing
                filtered = selection != EVERY_RUN
                err_console.print("no runs match these filters" if filtered else "no runs yet")

        read_command(body, read)

    @app.command(cls=ArgumentsByName)
    @with_read_options
    def events(
        run_id: RunIdArg,
        after: Annotated[
            int,
            typer.Option(
                "--after",
                metavar="SEQ",
                help="Only events after this sequence number.",
                min=0,
                callback=within_store_ints,
            ),
        ] = 0,
        limit: Annotated[
            int | None,
            typer.Option(
                "--limit",
                metavar="N",
                help="At most N events (default: all of them).",
                min=1,
                callback=within_store_ints,
            ),
        ] = None,
        follow: Annotated[
            bool,
            typer.Option(
                "--follow",
                "-f",
                help="Keep printing new events as they are recorded, until the run ends "
                "(with --json: one JSON object per line).",
            ),
        ] = False,
        *,
        read: ReadOptions,
    ) -> None:
        """Print a run's events after a sequence number (filtered for your role)."""

        async def body(reader: RunReader) -> None:
            full_id = await reader.resolve(run_id)
            if follow:
                shown = 0
                async with contextlib.aclosing(reader.follow(full_id, after=after)) as live:
                    async for event in live:
                        show_event(event, json_lines=read.json_out)
                        shown += 1
                        if limit is not None and shown >= limit:
                            return
                return
            listed = await reader.events(full_id, after=after, limit=limit)
            if read.json_out:
                print_json([e.to_dict() for e in listed])
                return
            for event in listed:
                show_event(event, json_lines=False)

        read_command(body, read)

    @app.command(cls=ArgumentsByName)
    @with_read_options
    def trace(
        run_id: RunIdArg,
        *,
        read: ReadOptions,
    ) -> None:
        """A run's trace metadata (worker.completed with reasoning) as one JSON document:
        developer and above."""

        async def body(reader: RunReader) -> None:
            document = [e.to_dict() for e in await reader.trace(await reader.resolve(run_id))]
            if read.json_out:
                print_json(document)
            else:
                console.print_json(data=document)

        read_command(body, read)
