"""The exception tree: caller mistakes versus runtime failures, translated once at each edge.

::

    ThoughtgateError
    ├── UsageError                 the caller asked for something invalid; fix the input
    │   ├── ConfigError            bad thoughtgate.toml / THOUGHTGATE_* value: one line per problem
    │   │   │                        (where, key, value, what is expected)
    │   │   └── ProviderNotConfiguredError  no key or base URL for a provider: the operator's
    │   │                            setting to fix; to a daemon's caller a 503 in neutral words
    │   ├── UnknownModeError       not hidden | surface | telemetry_only
    │   ├── UnknownRoleError       not viewer | member | developer | admin | owner
    │   ├── UnknownProviderError   ``--model PROVIDER:MODEL`` names no adapter
    │   ├── RunNotFoundError       no run with that id
    │   ├── ApprovalNotPendingError  nothing to answer: the run ended, the call was settled, or
    │   │                            no approval is pending for it (``reason`` says which)
    │   ├── QuotaExceededError     this key started too many runs (retry after ``retry_after`` s)
    │   ├── AuthenticationError    no credentials, or ones we do not accept (bad key, bad ticket)
    │   │   └── TicketError        a live-channel ticket that cannot open this stream (says why)
    │   └── AccessDeniedError      the reader's role may not read this
    └── RuntimeFailure             something outside the caller's control failed
        ├── ProviderError          provider status, error type, message, request id, partial turn
        │   ├── ProviderHTTPError        a non-2xx answer (400/401/403/404/408/429/5xx/529)
        │   ├── ProviderStreamError      an in-stream ``error`` event, or a stream cut mid-turn
        │   │                            (by the connection, or at the turn's output bound)
        │   ├── ProviderTimeoutError     connect or read timeout, or the turn's deadline
        │   ├── ProviderConnectionError  could not connect, or the connection dropped
        │   └── MalformedResponseError   bad JSON, missing fields, wrong content type
        ├── StoreError             the event log failed (the message says which database and why)
        │   ├── NotOurDatabaseError    the file exists but is not a thoughtgate store
        │   ├── StoreReadOnlyError     the database cannot be written
        │   ├── StoreRefusesWritesError  refused before trying: the store refuses writes now
        │   │                            (``reason``, its readiness word; ADR 0165)
        │   └── StoreUnavailableError  cannot reach / open the database
        ├── RunClosedError         the run already ended (another process closed it): no more events
        ├── RunTakenOverError      an end refused: another execution holds the run now (ADR 0072)
        └── WorkflowFailed         a run's durable workflow ended with an error, read back from the
                                     workflows database: named by the error's class (ADR 0082)

Beside the tree, ``ReplayedFailure`` (a ``RuntimeError``): a step's exception thoughtgate did not
write, raised again from its checkpoint by an execution that did not see it happen (ADR 0079).

Every adapter and store backend maps its vendor and driver exceptions into this tree in one place
and chains them with ``raise ... from exc`` so the original stays visible in tracebacks.
"""

from __future__ import annotations

import errno
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Final, TypeVar
from urllib.parse import urlsplit, urlunsplit

if TYPE_CHECKING:
    from thoughtgate.types import Turn

__all__ = [
    "STORE_REFUSES_WRITES",
    "AccessDeniedError",
    "ApprovalNotPendingError",
    "AuthenticationError",
    "ConfigError",
    "MalformedResponseError",
    "NotOurDatabaseError",
    "ProviderConnectionError",
    "ProviderError",
    "ProviderHTTPError",
    "ProviderNotConfiguredError",
    "ProviderStreamError",
    "ProviderTimeoutError",
    "QuotaExceededError",
    "ReplayedFailure",
    "RunClosedError",
    "RunNotFoundError",
    "RunTakenOverError",
    "RuntimeFailure",
    "StoreError",
    "StoreReadOnlyError",
    "StoreRefusesWritesError",
    "StoreUnavailableError",
    "ThoughtgateError",
    "TicketError",
    "UnknownModeError",
    "UnknownProviderError",
    "UnknownRoleError",
    "UsageError",
    "WorkflowFailed",
    "approval_refused",
    "exception_line",
    "failure_code",
    "failure_detail",
    "failure_kind",
    "failure_summary",
    "failure_text",
    "identifier",
    "own_words",
    "public_url",
    "quoted_words",
    "quoting",
    "store_outage",
]

_IDENTIFIER: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/-]{0,99}")


def identifier(value: str | None) -> str | None:
    """``value`` when it is an identifier (``overloaded_error``, ``429``, ``req_01ab``), else
    ``None``: a provider's error type, code or request id goes into a public error text only in
    that form, since a provider may put anything in them (ADR 0071)."""
    return value if value is not None and _IDENTIFIER.fullmatch(value) else None


def public_url(url: str) -> str:
    """``url`` as a message may show it: scheme, host, port and path, without a user and password
    (``http://user:secret@gateway/v1``) or a query (``?key=...``) that may hold a credential;
    ``<a URL that could not be read>`` when it cannot be split. For a provider's base URL in a
    run's error (which every reader sees), a daemon's ``--url`` on the terminal.

    An ``@`` past the host (``scheme://user:se/cret@host``, ``user:1?x@host``: a password's
    ``/``, ``?`` or ``#`` typed without its escape ends the host early) means the user, host and
    port read may be pieces of a password: such a URL is not shown either (ADR 0135)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "<a URL that could not be read>"
    past_host = url.partition("//")[2][len(parts.netloc) :] if parts.netloc else url
    if "@" in past_host:
        return "<a URL that could not be read>"
    if ":" in host:
        host = f"[{host}]"
    netloc = host if port is None else f"{host}:{port}"
    shown = urlunsplit((parts.scheme, netloc, parts.path, "", ""))
    if (parts.netloc and not netloc) or "@" in shown:  # ``user:secret@host`` with no ``//``
        return "<a URL that could not be read>"
    return shown


class ThoughtgateError(Exception):
    """Base of every error thoughtgate raises on purpose.

    ``public`` is set where the message quotes another exception's words (a driver's:
    :func:`quoting`): the message with that exception's class and code there instead, which is
    what every reader and every log is shown (ADR 0104)."""

    public: str | None = None


class UsageError(ThoughtgateError):
    """The caller asked for something invalid; the message says what and what is allowed."""


class QuotaExceededError(UsageError):
    """A per-key quota refused a new run (``quotas`` config); nothing was recorded."""

    def __init__(self, message: str, *, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ConfigError(UsageError):
    """A configuration key holds a bad value, or the configuration file cannot be used.

    One line per problem, compiler-style: where it is (the file, or the environment variable),
    the key path, the value, and what is expected -- ``thoughtgate.toml: server.port = 70000:
    expected a whole number from 0 to 65535``. ``problem`` replaces "expected ``allowed``" when
    the problem is not a wrong kind of value (an unknown key, keys that contradict each other);
    ``also`` are the other problems found at once, each on its own line after this one's."""

    def __init__(
        self,
        key: str,
        value: object,
        allowed: str,
        *,
        source: str = "",
        problem: str | None = None,
        also: Sequence[ConfigError] = (),
    ) -> None:
        self.key = key
        self.value = value
        self.allowed = allowed
        self.source = source
        self.problem = problem
        self.also = tuple(also)
        where = f"{source}: " if source else ""
        if value is None and problem is None:  # nothing was given: say what to set, not "= None"
            line = f"{where}{key} is not set; it needs {allowed}"
        else:
            # A whole table (an unknown section, keys that contradict each other) is not shown:
            # the key and the problem say which part of it is wrong.
            shown = "" if value is None or isinstance(value, Mapping) else f" = {value!r}"
            said = problem if problem is not None else f"expected {allowed}"
            line = f"{where}{key}{shown}: {said}" if key else f"{where}{said}"
        self.lines: tuple[str, ...] = (line, *(x for other in self.also for x in other.lines))
        super().__init__("\n".join(self.lines))


class ProviderNotConfiguredError(ConfigError):
    """This process has no key (or no usable base URL) for a provider a run needs: its
    operator's configuration, not the caller's request (ADR 0128).

    Its text is the operator's instruction (the setting and the environment variable to set),
    which a person at the command line, who is the operator, is shown; ``public`` names only the
    provider, and is what a daemon's caller and every reader of a run are shown: how the server
    is set up is not theirs to learn."""

    def __init__(self, provider: str, key: str, value: object, allowed: str) -> None:
        super().__init__(key, value, allowed)
        self.provider = provider
        self.public = f"this server is not configured for provider {provider!r}"


class UnknownModeError(UsageError):
    """A chain-of-thought mode outside the three known ones."""


class UnknownRoleError(UsageError):
    """A role name outside the five known ones (never silently defaulted)."""


class UnknownProviderError(UsageError):
    """A model string whose provider part names no adapter."""


class RunNotFoundError(UsageError):
    """No run with that id exists in the store."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"run {run_id!r} not found")


class ApprovalNotPendingError(UsageError):
    """An answer to a tool approval that has nothing to answer. ``reason``: ``run_ended`` (the
    run is over), ``settled`` (answered or timed out before), ``not_pending`` (never asked, or
    asked in no run this store knows). Every surface shows the same message."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class AuthenticationError(UsageError):
    """Missing, unknown or revoked API key; forged, expired or malformed live-channel ticket."""


class TicketError(AuthenticationError):
    """A live-channel ticket that cannot open this stream: missing, malformed, forged, expired,
    for another run, or minted by a key that was revoked or lost the role.

    Unlike a bad API key (a generic 401 that tells a guesser nothing), the message is shown to the
    caller: the holder of a ticket got it from us, and needs to know whether to ask for a new one
    or for another run. ``status`` is 401, or 403 for another run; ``code`` is machine-readable.
    """

    def __init__(self, message: str, *, code: str, status: int = 401) -> None:
        super().__init__(message)
        self.code = code
        self.status = status


class AccessDeniedError(UsageError):
    """The reader's role does not allow this read; carries no data about the resource."""


class RuntimeFailure(ThoughtgateError):
    """Something outside the caller's control failed."""


class ProviderError(RuntimeFailure):
    """A provider call failed. ``partial`` holds what arrived before the failure, if anything.

    ``message`` is what went wrong: thoughtgate's description, or, with ``by_provider``, the
    provider's own text (an HTTP error body's ``message``, OpenRouter's ``metadata.raw``, an
    in-stream ``error`` event). ``error_type`` is its error type (``rate_limit_error``,
    ``insufficient_quota``, ...) and ``code`` its machine code where it sends one apart from the
    type (OpenAI's ``code``, OpenRouter's numeric ``code``), so a caller can tell a quota or rate
    limit from an outage without parsing text.

    ``detail`` holds words thoughtgate did not write (the provider's, a library's): ``str()``
    shows them to the Python caller, but a recorded error keeps them apart, in the
    developer-only ``error_detail`` (:func:`failure_text`, :func:`failure_detail`; ADR 0071).
    A provider's text may quote the request it refused, earlier turns' reasoning included.
    """

    def __init__(
        self,
        message: str,
        *,
        provider: str = "",
        status: int | None = None,
        error_type: str | None = None,
        code: str | None = None,
        request_id: str | None = None,
        retryable: bool = False,
        retry_after: float | None = None,
        partial: Turn | None = None,
        by_provider: bool = False,
        detail: str | None = None,
    ) -> None:
        self.message = message
        self.by_provider = by_provider
        """Whether ``message`` is the provider's own text (then it is also the ``detail``)."""
        self.detail = message if by_provider and detail is None else detail
        self.provider = provider
        self.status = status
        self.error_type = error_type
        self.code = code
        self.request_id = request_id
        self.retryable = retryable
        self.retry_after = retry_after
        self.partial = partial
        super().__init__(message)

    def __str__(self) -> str:
        """``[provider status type code] message (request id X)``, from the current fields: an
        adapter may learn the request id (from the response headers) after the error was made."""
        shown_code = self.code if self.code and self.code != self.error_type else ""
        status = str(self.status) if self.status else ""
        bits = [b for b in (self.provider, status, self.error_type, shown_code) if b]
        prefix = f"[{' '.join(bits)}] " if bits else ""
        rid = f" (request id {self.request_id})" if self.request_id else ""
        detail = f": {self.detail}" if self.detail and not self.by_provider else ""
        return f"{prefix}{self.message}{detail}{rid}"

    def described(self) -> str:
        """What a run's, a task's or a turn's public ``error`` says: thoughtgate's words and the
        identifiers the provider sent (status, type, code, request id), never its text.

        ``provider anthropic returned HTTP 400 (invalid_request_error)``, ``provider openrouter
        reported an error in the stream (overloaded_error, code 502)``; an error thoughtgate
        described itself keeps its message (``[openai] the stream ended before ...``)."""
        kind = identifier(self.error_type)
        code = identifier(self.code)
        shown_code = code if code and code != kind else None
        rid = identifier(self.request_id)
        tail = f" (request id {rid})" if rid else ""
        name = identifier(self.provider)
        if self.by_provider:
            who = f"provider {name}" if name else "the provider"
            what = (
                f"returned HTTP {self.status}" if self.status else "reported an error in the stream"
            )
            ids = ", ".join(b for b in (kind, f"code {shown_code}" if shown_code else "") if b)
            return f"{who} {what}{f' ({ids})' if ids else ''}{tail}"
        status = str(self.status) if self.status else ""
        bits = [b for b in (name, status, kind, shown_code) if b]
        prefix = f"[{' '.join(bits)}] " if bits else ""
        return f"{prefix}{self.message}{tail}"


class ProviderHTTPError(ProviderError):
    """The provider answered with a non-2xx status."""


class ProviderStreamError(ProviderError):
    """The provider sent an error inside the stream, or the stream ended mid-turn (cut by the
    connection, or by thoughtgate once the turn's output passed its bound, ADR 0155)."""


class ProviderTimeoutError(ProviderError):
    """Connect or read timeout, a stream with no progress for as long, or a turn past its
    deadline (``providers.*.turn_timeout_s``, ADR 0155)."""


class ProviderConnectionError(ProviderError):
    """The connection could not be made or was dropped."""


class MalformedResponseError(ProviderError):
    """The provider sent something that is not its documented format."""


class StoreError(RuntimeFailure):
    """The event log failed."""


class NotOurDatabaseError(StoreError):
    """The database exists but was not created by thoughtgate (it is left untouched)."""


class StoreReadOnlyError(StoreError):
    """The database cannot be written."""


STORE_REFUSES_WRITES = "store_refuses_writes"
"""The error ``code`` of a daemon's answer refused because its store refuses writes (ADR 0151,
0165): the daemon sends it, a client (the CLI's approval, ADR 0170) compares it."""


class StoreRefusesWritesError(StoreError):
    """Something that must be recorded was refused before it was tried, because the store refuses
    writes now (``reason``: its word, ``EventStore.write_refusal``, as ``GET /readyz`` says it).

    An approval's answer is one (ADR 0165): delivered to the waiting execution, it would be lost
    with the run's next write, after its answerer was told it was taken. The message names no
    path and quotes no database: a daemon's caller reads it."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def approval_refused(reason: str) -> str:
    """What an approval's answerer is told while the store refuses writes (``reason``, its
    word): the same on every surface that answers one."""
    return (
        f"the event store refuses writes ({reason}), so the answer could not be recorded and was "
        "not given: the approval is still pending; answer it again once the store takes writes"
    )


class StoreUnavailableError(StoreError):
    """The database cannot be reached or opened.

    ``outage``: the store refused for a while and may answer again by itself -- a server
    unreachable or refusing connections, a connection lost, the pool's wait for a connection run
    out, a SQLite file locked by another connection past its busy timeout. Not a login refused,
    a database that does not exist, nor a file that cannot be opened: those wait for someone to
    act. A durable run waits out an outage and continues (ADR 0152)."""

    outage: bool = False


def store_outage(exc: BaseException) -> StoreUnavailableError | None:
    """The store outage (:attr:`StoreUnavailableError.outage`) ``exc`` is or was raised from,
    if any: what a durable run waits out instead of failing (ADR 0152)."""
    for cause in chained(exc):
        if isinstance(cause, StoreUnavailableError) and cause.outage:
            return cause
    return None


class RunClosedError(RuntimeFailure):
    """An append to a run that has already ended.

    Raised when a process that lost its run (its lease expired and another process closed the
    run as interrupted) tries to record more: nothing is ever appended after a run's end.
    """

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(
            f"run {run_id!r} has already ended (another thoughtgate process closed it); "
            "nothing more is recorded for it"
        )


class RunTakenOverError(RuntimeFailure):
    """An end or events the store refused: the process recording them no longer executes the run.

    Raised by ``EventLog.finish_run`` for an ending that names its executor
    (``RunEnding.held_by``), and by ``EventLog.append`` for events that do (``held_by``, ADR
    0090), when the run is open but held by another owner, by nobody (it waits to resume), or
    by a later claim of the same owner: this process stalled past its lease and another
    execution took the run over (ADR 0072). Nothing of them is stored, the execution stops, and
    the caller must not report an end as the run's: the run's end is the other execution's.
    """

    def __init__(self, run_id: str, holder: str | None, *, recording: str = "end") -> None:
        self.run_id = run_id
        self.holder = holder
        self.recording = recording
        """What was refused: the run's ``end``, ``events`` its execution appended (ADR 0090:
        its appends are fenced as its end is, and the execution stops at the first refused),
        or a ``task record`` or ``run record`` it wrote to the run index (ADR 0094)."""
        said = {"end": "its end here was not", "events": "its events here were not"}.get(
            recording, f"its {recording} here was not"
        )
        super().__init__(
            f"run {run_id!r} was taken over by another execution while this process stalled "
            f"past its lease; {said} recorded"
        )


class WorkflowFailed(RuntimeFailure):
    """A run's durable workflow ended with an error, as the workflows database recorded it: what
    DBOS raises where the workflow's outcome is awaited (``orchestration.durable``, ADR 0082).

    The record keeps the class of the exception the workflow raised and the words
    ``failure_text`` gave it (ADR 0065); both are read back from a database. The text names the
    class only -- ``kind``, anything but a Python identifier taken for ``Exception`` -- and never
    the recorded words (``said``, kept on the object for a debugger, never shown): a reader of a
    run's error or the daemon's log learns which failure ended the workflow, not the data it
    was about (ADR 0069)."""

    def __init__(self, kind: str, said: str | None = None) -> None:
        self.kind = kind if kind.isidentifier() else "Exception"
        self.said = said or None
        super().__init__(f"the run's workflow ended with an error ({self.kind})")


class ReplayedFailure(RuntimeError):
    """A step's exception thoughtgate did not write, raised again from its checkpoint in an
    execution that did not see it happen -- a resume, in this or another process (ADR 0079).

    The checkpoint keeps the exception's class name and, where the run's mode keeps a failure's
    words, its first line (ADR 0073); the object itself is gone. This stands in for it so that
    the readers' texts are the ones the first execution would have recorded: ``failure_text``
    names ``kind`` (``ValueError``), not this class, and ``failure_detail`` is ``kind: said``.
    ``kind`` is a name read back from a database: anything but a Python identifier (a class
    name) is taken for ``Exception`` rather than shown."""

    def __init__(self, kind: str, said: str | None) -> None:
        self.kind = kind if kind.isidentifier() else "Exception"
        self.said = said or None
        super().__init__(f"{self.kind}: {self.said}" if self.said else self.kind)


def failure_kind(exc: BaseException) -> str:
    """The class a reader is told an exception is: its own, or for a :class:`ReplayedFailure`
    the class of the exception it stands in for."""
    return exc.kind if isinstance(exc, ReplayedFailure) else type(exc).__name__


def failure_code(exc: BaseException) -> str | None:
    """An identifier the exception's library gives it, which quotes nothing of the data: a
    SQLSTATE (psycopg), an SQLite error name, an errno, an HTTP status, a validation's error
    count (pydantic)."""
    sqlstate = getattr(exc, "sqlstate", None)
    if isinstance(sqlstate, str) and _CODE.fullmatch(sqlstate):
        return f"SQLSTATE {sqlstate}"
    name = getattr(exc, "sqlite_errorname", None)
    if isinstance(name, str) and _CODE.fullmatch(name):
        return name
    if isinstance(exc, OSError) and isinstance(exc.errno, int):
        return errno.errorcode.get(exc.errno, f"errno {exc.errno}")
    status = getattr(getattr(exc, "response", None), "status_code", None)  # httpx
    if isinstance(status, int):
        return f"HTTP {status}"
    count = getattr(exc, "error_count", None)
    if callable(count):
        try:
            n = count()
        except Exception:
            return None
        if isinstance(n, int):
            return f"{n} validation error{'s' if n != 1 else ''}"
    return None


_CODE: Final = re.compile(r"[A-Za-z0-9_.-]{1,40}")


def own_words(exc: BaseException) -> bool:
    """thoughtgate wrote ``exc``'s text for every reader (ADR 0069); a provider's error and a
    replayed one hold someone else's."""
    return isinstance(exc, ThoughtgateError) and not isinstance(exc, ProviderError)


def failure_summary(exc: BaseException) -> str:
    """:func:`failure_text`, with a foreign exception's :func:`failure_code`
    (``CheckViolation (SQLSTATE 23514)``): what a log says of ``exc`` (ADR 0104)."""
    if own_words(exc) or isinstance(exc, ProviderError):
        return failure_text(exc)
    code = failure_code(exc)
    kind = failure_kind(exc)
    return f"{kind} ({code})" if code else kind


_SHORTEST_QUOTE: Final = 6
"""Shorter lines of an exception's text are not looked for in another text: they would replace
thoughtgate's own words (a ``KeyError('id')`` is not worth turning every ``id`` into its class)."""


def chained(exc: BaseException) -> list[BaseException]:
    """``exc``, the exceptions it was raised from or during, and a group's members."""
    found: list[BaseException] = []
    seen: set[int] = set()
    pending = [exc]
    while pending:
        e = pending.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        found.append(e)
        pending.extend(x for x in (e.__cause__, e.__context__) if x is not None)
        if isinstance(e, BaseExceptionGroup):
            pending.extend(e.exceptions)
    return found


def quoted_words(exceptions: Iterable[BaseException]) -> list[tuple[str, str]]:
    """Each foreign exception's texts another text might quote (its ``str``, ``repr`` and
    their lines, a provider's body, a replayed failure's words), longest first, each with its
    :func:`failure_summary` to write instead."""
    pairs: dict[str, str] = {}
    for exc in exceptions:
        if own_words(exc):
            continue
        try:
            texts = [str(exc), repr(exc)]
            summary = failure_summary(exc)
        except Exception:  # a broken __str__: nothing of it can be in another text either
            continue
        if isinstance(exc, ProviderError) and exc.detail:
            texts.append(exc.detail)
        if isinstance(exc, ReplayedFailure) and exc.said:
            texts.append(exc.said)
        lines = [line.strip() for text in texts for line in text.splitlines()]
        for text in (*texts, *lines):
            if len(text) >= _SHORTEST_QUOTE and text not in summary:
                pairs.setdefault(text, summary)
    return sorted(pairs.items(), key=lambda pair: -len(pair[0]))


_QUOTED_ANYWHERE: Final = 16
"""An exception's text this long is replaced wherever another text holds it (fail closed: it
is no coincidence); a shorter one only where it stands as its own word (ADR 0111)."""


def unquoted(text: str, words: Sequence[tuple[str, str]]) -> str:
    """``text`` with each of :func:`quoted_words`' texts replaced by its summary.

    A text shorter than :data:`_QUOTED_ANYWHERE` is replaced only where it is not glued to a
    letter, digit or ``_`` on a side where it begins or ends with one: inside a longer word (a
    run id, a count, a name) it is that word's, not a quote (a handled ``ValueError('123456')``
    left ``run_0123456789`` as ``run_0ValueError789``). Framed any other way (``: {e}``,
    ``({e})``, ``'{e}'``, at either end) it is replaced."""
    for said, summary in words:
        if said in text:
            if len(said) >= _QUOTED_ANYWHERE:
                text = text.replace(said, summary)
            else:
                text = _replace_words(text, said, summary)
    return text


def _replace_words(text: str, said: str, summary: str) -> str:
    """``text`` with ``said`` replaced where it stands as its own word (see :func:`unquoted`)."""
    head, tail = _wordlike(said[0]), _wordlike(said[-1])
    size = len(said)
    parts: list[str] = []
    done = 0
    at = text.find(said)
    while at >= 0:
        end = at + size
        glued = (head and at > 0 and _wordlike(text[at - 1])) or (
            tail and end < len(text) and _wordlike(text[end])
        )
        if glued:
            at = text.find(said, at + 1)
            continue
        parts += (text[done:at], summary)
        done = end
        at = text.find(said, end)
    if not parts:
        return text
    parts.append(text[done:])
    return "".join(parts)


def _wordlike(char: str) -> bool:
    return char.isalnum() or char == "_"


_E = TypeVar("_E", bound=ThoughtgateError)

SAID: Final = "{said}"
"""Where :func:`quoting` puts the quoted exception's words in a message."""


def quoting(cls: type[_E], text: str, exc: BaseException, said: str | None = None) -> _E:
    """``cls(text)`` with ``exc``'s words (``said``, else its ``str``) at :data:`SAID`, and
    as its ``public`` text ``exc``'s :func:`failure_summary` there: declared where the words
    are put in, so that no reader is shown them (a driver may quote a value: PostgreSQL's
    ``invalid input syntax for type integer: "..."``)."""
    words = str(exc) if said is None else said
    error = cls(text.replace(SAID, words))
    error.public = text.replace(SAID, failure_summary(exc))
    return error


def failure_text(exc: BaseException) -> str:
    """What a run's or a task's ``error`` says of an exception, which every reader sees: only
    words thoughtgate wrote (ADRs 0069, 0071).

    thoughtgate's own errors speak for themselves (their messages are written for the reader),
    but for the words of the exceptions they were raised from, which each is named by instead (a
    ``StoreError`` quotes its driver's first line, where PostgreSQL may quote a value: ADR
    0104); a provider's error is described by its identifiers
    (:meth:`ProviderError.described`), never quoted. Any other exception -- a library's, a
    driver's, an inline worker's (user code) -- is named by its class only: its text is its
    author's, and may hold anything (SQLAlchemy appends a statement's ``[parameters: ...]``,
    pydantic each failing ``input_value``, a worker whatever it was given). Its words go to
    :func:`failure_detail` (fail closed)."""
    if isinstance(exc, ProviderError):
        return exc.described()
    if isinstance(exc, ThoughtgateError):
        return _own_text(exc)[0]
    return failure_kind(exc)


def _own_text(exc: ThoughtgateError) -> tuple[str, bool]:
    """``exc``'s text without the words it quoted (its ``public`` text, else its text with its
    chain's words replaced: fail closed), and whether it quoted any."""
    said = str(exc)
    if exc.public is not None:
        return exc.public, exc.public != said
    causes = chained(exc)[1:]
    if not causes:
        return said, False
    text = unquoted(said, quoted_words(causes))
    return text, text != said


def failure_detail(exc: BaseException) -> str | None:
    """The words of a failure thoughtgate did not write, for the developer-only ``error_detail``
    beside a public ``error`` (``None`` when there are none).

    A provider's own text (its error body, OpenRouter's ``metadata.raw``, an error event); the
    whole text of a thoughtgate error that quoted the exception it was raised from; any other
    exception's class and first line. The lines after the first stay out even here: they are a
    library's details (a statement's parameters, a validation error's inputs), where continuity
    carriers may sit, which no reader is ever shown (ADR 0069)."""
    if isinstance(exc, ProviderError):
        return exc.detail or None
    if isinstance(exc, ProviderNotConfiguredError):
        return None  # the operator's instruction: for the daemon's log, not a run's readers
    if isinstance(exc, ThoughtgateError):
        return str(exc) if _own_text(exc)[1] else None
    return exception_line(exc)


def exception_line(exc: BaseException) -> str | None:
    """``Type: first line`` of an exception's text, ``None`` when it has none (the detail of an
    exception thoughtgate did not write, whatever its class: an inline worker may raise one of
    thoughtgate's)."""
    text = (exc.said or "") if isinstance(exc, ReplayedFailure) else str(exc)
    lines = text.strip().splitlines()
    first = lines[0].strip() if lines else ""
    return f"{failure_kind(exc)}: {first}" if first else None
