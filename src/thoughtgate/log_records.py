"""How an exception is written to a log: decided in one place for every thoughtgate process.

An exception's own words are its author's, and may hold anything: a PostgreSQL error's DETAIL
quotes the failing row (an event's payload, reasoning included), a unique violation its key, a
provider's error its response body, a pydantic error each input value, orjson a fragment of its
input. A log's reader is an operator, not necessarily a developer (ADRs 0098, 0104), so
:func:`install` makes every log record safe where it is created (``logging``'s record factory),
whichever logger, handler or formatter it then meets (thoughtgate's, uvicorn's, asyncio's):

- an exception among a record's arguments (``log.warning("... %s", exc)``) or as its message
  is written as :func:`exception_summary`: thoughtgate's own words (ADR 0069) or the
  exception's class and a code its library gives (SQLSTATE, SQLite error name, errno, HTTP
  status, a validation's error count);
- a record's traceback (``log.exception``, ``exc_info=``) keeps every frame (code, not data)
  but each exception's message line is its summary, and its notes are left out;
- the words of those exceptions, and of the exception being handled where the record is made
  (``except Exception as e: log.warning(f"...: {e}")``, as DBOS and other libraries write),
  wherever the message quotes them (asyncio's "Task exception was never retrieved" prints the
  task's ``repr``, which holds the exception's), are replaced by the summary too.

``install(full=True)`` (``thoughtgate serve --log-level debug``: for developers) leaves records
as they are. A message that quotes an exception's text outside the except block that caught it,
with the exception nowhere on the record, is not caught here: pass the exception, never its
text.
"""

from __future__ import annotations

import logging
import sys
import traceback
from collections.abc import Callable, Mapping
from typing import Any, Final

from thoughtgate.errors import (
    ProviderError,
    ReplayedFailure,
    chained,
    failure_code,
    failure_summary,
    own_words,
    quoted_words,
    unquoted,
)

__all__ = [
    "LINE_FORMAT",
    "WITHHELD",
    "SafeRecords",
    "exception_summary",
    "install",
    "make_safe",
    "safe_traceback",
]

WITHHELD: Final = "its text is logged at debug level only"

LINE_FORMAT: Final = "%(levelname)s: %(name)s: %(message)s"
"""How a thoughtgate process writes a log line on stderr (the daemon's, and DBOS's lines in any
process that runs durable runs)."""


def exception_summary(exc: BaseException) -> str:
    """What a log says of ``exc`` (:func:`~thoughtgate.errors.failure_summary`): a run's public
    ``error`` for it, with a foreign exception's code; never raises (a broken ``__str__`` must
    not fail the log call)."""
    try:
        return failure_summary(exc)
    except Exception:
        return type(exc).__name__


def _qualified(exc: BaseException) -> str:
    cls = type(exc)
    if isinstance(exc, ReplayedFailure):
        return exc.kind
    module = cls.__module__
    return cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"


def _exception_line(exc: BaseException) -> str:
    if own_words(exc) or isinstance(exc, ProviderError):
        return f"{_qualified(exc)}: {exception_summary(exc)}"
    code = failure_code(exc)
    return f"{_qualified(exc)}: {code + ', ' if code else ''}{WITHHELD}"


_CAUSE: Final = "\nThe above exception was the direct cause of the following exception:\n\n"
_CONTEXT: Final = "\nDuring handling of the above exception, another exception occurred:\n\n"


def safe_traceback(exc: BaseException) -> str:
    """``exc``'s traceback as Python prints it, chained exceptions and a group's members
    included, each exception's line its summary and no notes (a note may quote anything)."""
    out: list[str] = []
    _format(exc, out, set(), "")
    return "".join(out).rstrip("\n")


def _format(exc: BaseException, out: list[str], seen: set[int], indent: str) -> None:
    seen.add(id(exc))
    cause, context = exc.__cause__, exc.__context__
    if cause is not None and id(cause) not in seen:
        _format(cause, out, seen, indent)
        out.append(_indented(_CAUSE, indent))
    elif context is not None and not exc.__suppress_context__ and id(context) not in seen:
        _format(context, out, seen, indent)
        out.append(_indented(_CONTEXT, indent))
    if exc.__traceback__ is not None:
        out.append(f"{indent}Traceback (most recent call last):\n")
        frames = traceback.extract_tb(exc.__traceback__).format()
        out.extend(_indented(frame, indent) for frame in frames)
    out.append(f"{indent}{_exception_line(exc)}\n")
    if isinstance(exc, BaseExceptionGroup):
        for n, member in enumerate(exc.exceptions, 1):
            out.append(f"{indent}+---------------- {n} ----------------\n")
            if id(member) not in seen:
                _format(member, out, seen, indent + "    ")


def _indented(text: str, indent: str) -> str:
    if not indent:
        return text
    return "".join(indent + line for line in text.splitlines(keepends=True))


def make_safe(record: logging.LogRecord) -> None:
    """``record`` as any log may show it (the module's docstring says how)."""
    found: list[BaseException] = []
    msg, args = record.msg, record.args
    if isinstance(msg, BaseException):
        found.append(msg)
        record.msg = exception_summary(msg)
    if isinstance(args, tuple):
        for a in args:  # a loop, not any(): this runs for every record (an access-log line)
            if isinstance(a, BaseException):
                found.extend(a for a in args if isinstance(a, BaseException))
                record.args = tuple(
                    exception_summary(a) if isinstance(a, BaseException) else a for a in args
                )
                break
    elif isinstance(args, Mapping) and any(isinstance(v, BaseException) for v in args.values()):
        found.extend(v for v in args.values() if isinstance(v, BaseException))
        record.args = {
            k: exception_summary(v) if isinstance(v, BaseException) else v for k, v in args.items()
        }
    exc_info = record.exc_info
    if exc_info and exc_info[1] is not None:
        found.append(exc_info[1])
        try:
            record.exc_text = safe_traceback(exc_info[1])
        except Exception:  # fail closed: the class, and no frames
            record.exc_text = f"{type(exc_info[1]).__name__}: {WITHHELD}"
    handling = sys.exc_info()[1]  # logged in an except block: f"...: {exc}" quotes it
    if handling is not None:
        found.append(handling)
    if not found:
        return
    words = quoted_words(e for exc in found for e in chained(exc))
    if not words:
        return
    try:
        message = record.getMessage()
    except Exception:  # logging reports a bad format string where the record is emitted
        return
    scrubbed = unquoted(message, words)
    if scrubbed != message:
        record.msg, record.args = scrubbed, None


RecordFactory = Callable[..., logging.LogRecord]


class SafeRecords:
    """The record factory :func:`install` sets: the one it replaced, then :func:`make_safe`
    unless ``full``."""

    def __init__(self, inner: RecordFactory, *, full: bool) -> None:
        self.inner = inner
        self.full = full

    def __call__(self, *args: Any, **kwargs: Any) -> logging.LogRecord:
        record = self.inner(*args, **kwargs)
        if not self.full:
            make_safe(record)
        return record


def install(*, full: bool = False) -> SafeRecords:
    """Every record created from now on in this process is made safe (unless ``full``: the
    exceptions' words as raised, for a developer at ``--log-level debug``). Installing again
    only changes ``full``."""
    current = logging.getLogRecordFactory()
    if isinstance(current, SafeRecords):
        current.full = full
        return current
    safe = SafeRecords(current, full=full)
    logging.setLogRecordFactory(safe)
    return safe
