"""What ``thoughtgate serve`` logs at each ``--log-level``, and what no log line may show.

The provider HTTP client (httpx, and httpcore under it) logs every provider request at INFO: one
formatted stderr line a model turn (~12 µs of CPU, ADR 0098) that also prints the
provider's URL. thoughtgate records each turn itself (events, traces), so these libraries log
warnings and errors only, unless the operator asks for ``debug``.

uvicorn's access log (one line an HTTP request, at INFO) is kept: it is the operator's record of
who called the daemon. Its request line carries the query string, where a live stream's ticket
travels (``?ticket=``): :class:`RedactTickets` replaces the value of every query parameter whose
name, decoded as the daemon decodes it, is secret-like.

uvicorn's start-up and shutdown lines (``Started server process``, ``Application startup
complete.``, ``Shutting down``, ...) are shown at ``debug`` only (:class:`QuietLifecycle`): at
start-up the daemon's own ``thoughtgate listening on ...`` says it is up, where and on which store.

Every record's exceptions are written as :mod:`thoughtgate.log_records` decides (their class and
a code, thoughtgate's own words; their text at ``debug`` only, ADR 0104).
"""

from __future__ import annotations

import logging
import re
from typing import Final
from urllib.parse import unquote_plus

from thoughtgate import log_records

__all__ = [
    "QUIET_LIBRARIES",
    "UVICORN_LIFECYCLE",
    "QuietLifecycle",
    "RedactTickets",
    "configure_logging",
    "redact_query",
]

QUIET_LIBRARIES: Final = ("httpx", "httpcore")
"""Loggers that log each provider request below WARNING: shown at ``--log-level debug`` only."""

UVICORN_LIFECYCLE: Final = frozenset(
    {
        "Started server process [%d]",
        "Waiting for application startup.",
        "Application startup complete.",
        "Shutting down",
        "Waiting for application shutdown.",
        "Application shutdown complete.",
        "Finished server process [%d]",
    }
)
"""uvicorn's INFO lines as it starts and stops (``uvicorn.error``), which say nothing the daemon
does not: shown at ``--log-level debug`` only."""

LOG_FORMAT: Final = log_records.LINE_FORMAT

_SECRET_NAME = re.compile(r"ticket|token|key|secret|passw|auth|sig", re.IGNORECASE)


def configure_logging(level: str) -> None:
    """The daemon's logging at ``level`` (``debug`` | ``info`` | ``warning`` | ``error``).

    Exceptions' own words (a driver's, a provider's, a library's) are logged at ``debug``
    only, the level for developers; at any other level a record shows an exception by its
    class and code (:mod:`thoughtgate.log_records`)."""
    log_records.install(full=level.lower() == "debug")
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT)
    logging.getLogger().setLevel(level.upper())  # also when a handler was there already
    numeric = logging.getLevelName(level.upper())
    assert isinstance(numeric, int)
    quiet = logging.NOTSET if numeric <= logging.DEBUG else max(numeric, logging.WARNING)
    for name in QUIET_LIBRARIES:
        logging.getLogger(name).setLevel(quiet)


def redact_query(target: str) -> str:
    """``target`` (a path with its query string) with each secret-like parameter's value as
    ``…``. Names are compared decoded (``%74icket`` is ``ticket`` to the daemon's parser), so a
    client cannot write its ticket into the log by encoding the name."""
    path, sep, query = target.partition("?")
    if not sep:
        return target
    pairs = []
    for pair in query.split("&"):
        name, eq, _ = pair.partition("=")
        pairs.append(f"{name}=…" if eq and _SECRET_NAME.search(unquote_plus(name)) else pair)
    return f"{path}?{'&'.join(pairs)}"


class RedactTickets(logging.Filter):
    """Access-log lines show ``ticket=…`` instead of a live-channel ticket that still works."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(
                redact_query(a) if isinstance(a, str) and "?" in a else a for a in record.args
            )
        return True


class QuietLifecycle(logging.Filter):
    """Drops uvicorn's start-up and shutdown lines (:data:`UVICORN_LIFECYCLE`). Its warnings
    and errors, and what it waits for at shutdown (``Waiting for connections to close. (CTRL+C
    to force quit)``), are kept."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno == logging.INFO and record.msg in UVICORN_LIFECYCLE)
