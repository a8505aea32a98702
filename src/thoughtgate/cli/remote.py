"""The read commands, ``run`` and ``resume`` against a daemon (``--url`` / ``--key``, or
``THOUGHTGATE_URL`` / ``THOUGHTGATE_KEY``) instead of a local store.

Everything goes through the daemon's HTTP API with :class:`thoughtgate.client.ThoughtgateClient`,
so the key's role decides what is shown: the daemon's one output filter already applied it, and
nothing here filters again or asks for more. Output has the same shapes as the local commands
(``run --json``, ``status --json``, ``events --json`` ...), so a script works against either.

What the local commands take and a daemon decides itself is refused with a clear usage error
(exit 2): ``--db`` (the daemon's store), ``--view-as`` (the key's role), ``--base-url`` /
``--api-key`` (the daemon's provider settings), and ``--tools module:attr`` (name the tools the
daemon registered instead).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import typer
from rich.markup import escape

from thoughtgate.cli.common import console, err_console, print_json, run_async
from thoughtgate.cli.options import KeyFromEnvironment, UrlFromEnvironment
from thoughtgate.errors import (
    STORE_REFUSES_WRITES,
    AccessDeniedError,
    AuthenticationError,
    RunNotFoundError,
    UsageError,
    public_url,
)

if TYPE_CHECKING:
    from thoughtgate.client import ThoughtgateClient
    from thoughtgate.client.errors import DaemonError
    from thoughtgate.events.schema import Event

__all__ = [
    "RESUMED_BY_THE_DAEMON",
    "Remote",
    "local_only",
    "needs_role",
    "remote_or_local",
    "remote_resume",
    "remote_run",
    "resolve_on_daemon",
    "resolve_remote",
    "show_event",
    "wants_daemon",
]

FOLLOW_ONLY = "stopped following; the run goes on on the daemon"
KEY_NEEDS_URL = "--key needs --url (or THOUGHTGATE_URL)"
KEY_NOT_USED = (
    "note: THOUGHTGATE_KEY is not used without --url or THOUGHTGATE_URL (this command uses the "
    "local store)"
)


@dataclass(frozen=True, slots=True)
class Remote:
    """Where a command's daemon is, and the key it reads with."""

    url: str
    key: str

    @contextlib.asynccontextmanager
    async def client(self) -> AsyncIterator[ThoughtgateClient]:
        """A client for the daemon; a key it refuses is named as the one given here."""
        from thoughtgate.client import ThoughtgateClient
        from thoughtgate.client.errors import KEY_REFUSED, KeyRefusedError

        try:
            async with ThoughtgateClient(self.url, self.key) as client:
                yield client
        except KeyRefusedError:
            raise AuthenticationError(
                f"the daemon at {public_url(self.url)} refused this key (--key or "
                f"THOUGHTGATE_KEY): {KEY_REFUSED}"
            ) from None


def resolve_remote(
    url: str | None, key: str | None, *, why: Mapping[str, str] | None = None, **local_only: Any
) -> Remote | None:
    """The daemon to talk to (``None``: the local store), after refusing what a daemon decides.

    ``local_only`` maps each flag that makes sense only locally to its value (set = refused);
    ``why`` gives a command's own reason for refusing a flag, where it differs."""
    if not url:
        if key and not isinstance(key, KeyFromEnvironment):
            raise UsageError(KEY_NEEDS_URL)
        return None
    from thoughtgate.client.aio import check_daemon_address  # only when a daemon is named

    check_daemon_address(url, named="--url ")
    if not key:
        raise UsageError(
            f"--url {public_url(url)} needs an API key: pass --key or set THOUGHTGATE_KEY "
            "(create one with `thoughtgate keys create --local` on the daemon's host)"
        )
    for flag, value in local_only.items():
        if value:
            name = "--" + flag.replace("_", "-")
            reason = (why or {}).get(flag) or _WHY[flag]
            raise UsageError(f"{name} cannot be used with --url: {reason}")
    return Remote(url.rstrip("/"), key)


def remote_or_local(
    url: str | None, key: str | None, *, local: bool, **local_flags: Any
) -> Remote | None:
    """For a command that acts on a daemon where one is named and on the local store otherwise,
    with ``--local`` (``keys``): ``--local`` leaves an exported ``THOUGHTGATE_URL`` unused (the
    first key is made on the daemon's host, where the address may be exported), and refuses a
    ``--url`` given with it, which says the opposite. ``local_flags``: as ``resolve_remote``'s."""
    if local:
        if url and not isinstance(url, UrlFromEnvironment):
            raise UsageError("--local and --url contradict each other: pass one of them")
        return resolve_remote(None, key)
    return resolve_remote(url, key, **local_flags)


def local_only(url: str | None, *, local: bool, command: str, why: str) -> None:
    """Refuse a daemon's address for a ``command`` that has no daemon endpoint (``why``): a
    ``--url``, and an exported ``THOUGHTGATE_URL`` unless ``--local`` says the local store is
    meant. Without this, a user who exported the address would believe the command acted on
    the daemon when it acted on the local store (ADR 0162). A usage error: exit 2."""
    if not url:
        return
    if not isinstance(url, UrlFromEnvironment):
        raise UsageError(f"{command} cannot be used with --url: {why}")
    if not local:
        raise UsageError(
            f"{command} works on the local store only ({why}), and THOUGHTGATE_URL is set "
            f"({public_url(url)}): it would not act on that daemon. Pass --local to use the "
            "local store (--db, THOUGHTGATE_DB or store.url) on purpose, or unset THOUGHTGATE_URL."
        )


def wants_daemon(url: str | None, key: str | None) -> bool:
    """Whether the command talks to a daemon. A ``--key`` without ``--url`` is a usage error;
    a key from ``THOUGHTGATE_KEY`` alone (exported for a daemon) is not used, with a note: the
    local store is read, and the key is sent nowhere."""
    if not url and key:
        if isinstance(key, KeyFromEnvironment):
            err_console.print(KEY_NOT_USED, highlight=False, markup=False, soft_wrap=True)
        else:
            run_async(_refuse(KEY_NEEDS_URL))
    return bool(url)


async def _refuse(message: str) -> None:
    raise UsageError(message)


_WHY = {
    "db": "the daemon reads its own store",
    "view_as": "your key's role decides what the daemon shows",
    "base_url": "the daemon's provider settings apply",
    "api_key": "the daemon's provider keys apply",
    "tools": "name tools registered on the daemon (--tools NAME), not module:attr",
}

RESUMED_BY_THE_DAEMON: Mapping[str, str] = {
    "tools": "the daemon resumes the run with the tools it registered under the names the run uses"
}
"""``resume --url``'s reason for refusing ``--tools``: the daemon picks the tools."""


@contextlib.asynccontextmanager
async def _closing(stream: AsyncIterator[Event]) -> AsyncIterator[AsyncIterator[Event]]:
    """Close the live channel when the command stops reading it (an early ``--limit``, Ctrl-C)."""
    try:
        yield stream
    finally:
        close = getattr(stream, "aclose", None)
        if close is not None:
            await close()


def show_event(event: Event, *, json_lines: bool) -> None:
    """One event of ``events``: a JSON line (``--json --follow``) or a readable line."""
    if json_lines:
        print_json(event.to_dict())
        return
    task = f" [dim]{event.task_id}[/]" if event.task_id else ""
    console.print(
        f"[bold]{event.seq:>5}[/] {event.type}{task} {escape(str(dict(event.payload)))}",
        highlight=False,
    )


@contextlib.contextmanager
def needs_role(what: str, needed: str, role: str) -> Iterator[None]:
    """A daemon's refusal of the key's role in the words a local one uses, with the key's role:
    the daemon's own 403 is generic ("your role does not allow this"), naming no data."""
    try:
        yield
    except AccessDeniedError:
        raise AccessDeniedError(
            f"{what} requires role {needed} or above; this key's role is {role}"
        ) from None


# --------------------------------------------------------------------------- commands


async def resolve_on_daemon(tg: ThoughtgateClient, given: str) -> str:
    """A full run id from an id or a unique start of it (``git``-style), as the daemon lists
    runs to the key."""
    given = given.strip()
    prefix = given if given.startswith("run_") else f"run_{given}"
    try:
        return (await tg.get_run(prefix)).run_id
    except RunNotFoundError:
        pass
    found: list[str] = []
    for page in range(20):  # the newest 10,000 runs
        runs = await tg.list_runs(limit=500, offset=page * 500)
        found += [r.run_id for r in runs if r.run_id.startswith(prefix)]
        if len(runs) < 500 or len(found) > 5:
            break
    if len(found) == 1:
        return found[0]
    if not found:
        raise RunNotFoundError(given)
    shown = ", ".join(found[:5]) + (", …" if len(found) > 5 else "")
    raise UsageError(f"{given!r} matches several runs ({shown}); type more of the id")


async def remote_run(
    remote: Remote,
    prompt: Callable[[], str],
    *,
    model: str | None,
    system: str | None,
    chain_of_thought: str | None,
    tools: list[str],
    approve_all: bool,
    json_out: bool,
) -> str:
    """Start a run on the daemon, follow it live, print how it ended; returns its status.
    ``prompt`` is read once the daemon accepted the key (it may wait for standard input)."""
    async with remote.client() as tg:
        role = str((await tg.me())["role"])
        text = prompt()
        with needs_role("starting a run", "member", role):
            run_id = await tg.start_run(text, model, chain_of_thought, tools or None, system=system)
        if not json_out:
            err_console.print(
                f"run {run_id} on {public_url(remote.url)} (as {role})",
                highlight=False,
                soft_wrap=True,  # a run id and a URL are copied: never broken at the width
            )
        return await _follow_to_end(tg, remote, run_id, role, approve_all, json_out)


async def remote_resume(remote: Remote, given: str, *, approve_all: bool, json_out: bool) -> str:
    """Ask the daemon to resume a suspended run, follow it live from where it stopped, print how
    it ended; returns its status (a run that is not waiting to resume: the daemon's 409, a usage
    error)."""
    async with remote.client() as tg:
        role = str((await tg.me())["role"])
        run_id = await resolve_on_daemon(tg, given)
        shown = await tg.events(run_id)  # so far: the follow below shows what the resume adds
        with needs_role("resuming a run", "member", role):
            await tg.resume_run(run_id)
        if not json_out:
            err_console.print(
                f"resuming run {run_id} on {public_url(remote.url)} (as {role})",
                highlight=False,
                soft_wrap=True,
            )
        after = shown[-1].seq if shown else 0
        return await _follow_to_end(tg, remote, run_id, role, approve_all, json_out, after=after)


async def _follow_to_end(
    tg: ThoughtgateClient,
    remote: Remote,
    run_id: str,
    role: str,
    approve_all: bool,
    json_out: bool,
    *,
    after: int = 0,
) -> str:
    """Follow a run on the daemon to its end (printed live unless ``json_out``), answering the
    approvals it asks for; print how it ended and return its status.

    An answer the daemon refuses because its store refuses writes is sent again (``_Answer``);
    while one is, the live channel, which the daemon lets go for as long as its store refuses
    writes, is followed again from the last event rather than given up on. An answer that could
    not be given at all ends the command with its error: the approval waits on the daemon."""
    from thoughtgate.cli.render import LivePrinter, print_run
    from thoughtgate.client.errors import DaemonError

    printer = None if json_out else LivePrinter(console)
    answering: dict[asyncio.Task[None], _Answer] = {}
    failed: list[BaseException] = []
    this = asyncio.current_task()

    def answered(task: asyncio.Task[None]) -> None:
        answering.pop(task, None)
        error = None if task.cancelled() else task.exception()
        if error is not None and not failed:
            failed.append(error)
            if this is not None:
                this.cancel()  # the follow stops: the command ends with the answer's error

    last = after
    try:
        while True:
            try:
                async with _closing(tg.follow(run_id, after=last)) as events:
                    async for event in events:
                        last = event.seq
                        if printer is not None:
                            printer.show(event)
                        if event.type == "tool.approval_required":
                            answer = _Answer(tg, event, approve_all)
                            task = asyncio.create_task(answer.give())
                            answering[task] = answer
                            task.add_done_callback(answered)
                break
            except DaemonError:
                if not any(a.store_refuses for a in answering.values()):
                    raise
                # The daemon lets a follower go while its store refuses writes, and an answer
                # waits for it to take them: follow on from the last event, not give up.
    except asyncio.CancelledError:
        if failed:
            if this is not None:
                this.uncancel()  # the cancel was ours, to stop the follow
            raise failed[0] from None
        err_console.print(
            f"{FOLLOW_ONLY}: thoughtgate status {run_id} --url {public_url(remote.url)}",
            highlight=False,
            soft_wrap=True,  # a command to copy
        )
        raise
    finally:
        for task in list(answering):
            task.cancel()
    if printer is not None:
        printer.end()
    view = await tg.get_run(run_id)
    return print_run(view, json_out=json_out, role=role)


STORE_REFUSAL_WAIT_S = 120.0
"""How long an approval's answer is retried while the daemon's store refuses writes (its
``503 store_refuses_writes``: the answer was not given, the approval still pending)."""
STORE_RETRY_S = (1.0, 0.2, 10.0)
"""The wait between tries without a ``Retry-After`` (the daemon's readiness check is
renewed once a second), and the bounds a ``Retry-After`` is kept within."""


def retry_wait(retry_after: float | None) -> float:
    """How long to wait before answering again: the daemon's ``Retry-After`` within bounds."""
    plain, least, most = STORE_RETRY_S
    return plain if retry_after is None else min(max(retry_after, least), most)


class _Answer:
    """One approval the run waits for, answered from here (``give``)."""

    def __init__(self, tg: ThoughtgateClient, event: Event, approve_all: bool) -> None:
        self.tg, self.event, self.approve_all = tg, event, approve_all
        self.store_refuses = False
        """Whether the daemon refused the answer because its store refuses writes, and it is
        being tried again."""

    async def give(self) -> None:
        """Answer it: ``--approve-all``, else ask on the terminal (when there is one; without
        one the daemon's timeout decides)."""
        payload: Mapping[str, Any] = self.event.payload
        call_id = str(payload.get("call_id"))
        decision: str | None = "approve" if self.approve_all else None
        if decision is None and sys.stdin.isatty():
            shown = payload.get("input", "(arguments hidden from your role)")
            answer = await asyncio.to_thread(
                typer.confirm,
                f"Allow tool {payload.get('tool_key')} with {shown}?",
                default=False,
                err=True,
            )
            decision = "approve" if answer else "reject"
        if decision is not None:
            await self._send(call_id, decision, str(payload.get("tool_key") or call_id))

    async def _send(self, call_id: str, decision: str, tool: str) -> None:
        """Send the answer; while the daemon's store refuses writes it is refused and the
        approval stays pending (ADR 0165), so it is sent again, with a status line saying so,
        for up to ``STORE_REFUSAL_WAIT_S``; past that, the daemon's refusal, with what to do."""
        from thoughtgate.client.errors import DaemonError

        run_id = self.event.run_id
        waited = 0.0
        with contextlib.ExitStack() as shown:
            while True:
                try:
                    await self.tg.answer_approval(run_id, call_id, decision)
                except DaemonError as exc:
                    if exc.status != 503 or exc.code != STORE_REFUSES_WRITES:
                        raise
                    if waited >= STORE_REFUSAL_WAIT_S:
                        raise DaemonError(
                            f"{exc.message}; gave up after {waited:.0f} s: the answer ({decision}) "
                            f"to tool {tool} was not given, and run {run_id} still waits for it "
                            "on the daemon (until its approval timeout): answer it there once "
                            "its store takes writes",
                            status=exc.status,
                            code=exc.code,
                            body=exc.body,
                        ) from None
                    if not self.store_refuses:
                        self.store_refuses = True
                        shown.enter_context(_status(_retrying(exc, decision, tool)))
                    wait = retry_wait(exc.retry_after)
                    await asyncio.sleep(wait)
                    waited += wait
                    continue
                break
        if self.store_refuses:
            self.store_refuses = False
            err_console.print(
                f"the daemon's store takes writes again: the answer ({decision}) to tool "
                f"{tool} was given",
                highlight=False,
                markup=False,
                soft_wrap=True,
            )


def _retrying(exc: DaemonError, decision: str, tool: str) -> str:
    reason = _REASON.search(exc.message)
    why = f" ({reason.group(1)})" if reason else ""
    return (
        f"the daemon's store refuses writes{why}: the answer ({decision}) to tool {tool} is "
        f"not given yet; retrying for up to {STORE_REFUSAL_WAIT_S:.0f} s"
    )


_REASON = re.compile(r"refuses writes \((\w+)\)")
"""The reason word in the daemon's ``store_refuses_writes`` message (``/readyz``'s)."""


@contextlib.contextmanager
def _status(message: str) -> Iterator[None]:
    """A status line while retrying: rich's spinner on a terminal, else one line (a log, a
    pipe, a test) that says the same."""
    if err_console.is_terminal:
        with err_console.status(escape(message)):
            yield
        return
    err_console.print(message, highlight=False, markup=False, soft_wrap=True)
    yield
