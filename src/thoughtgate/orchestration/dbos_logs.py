"""Where DBOS's own log lines go: the ``sys.stderr`` of the moment, at thoughtgate's level (ADR 0125).

DBOS gives its logger (``dbos``) a console handler the first time ``DBOS(config=...)`` runs in a
process, when that logger has no handler yet (``dbos._logger.init_logger``), and keeps it for
the life of the process: a ``logging.StreamHandler`` bound to the ``sys.stderr`` of that
moment. An application that swaps ``sys.stderr`` for a while (typer's ``CliRunner``, Jupyter,
pytest's capture) and closes the object it swapped in leaves DBOS writing to a closed file:
every later ``DBOS(config=...)`` of the process flushes its handlers and fails (``ValueError: I/O
operation on closed file``), so no durable engine could launch again in that process.

:func:`install` gives the ``dbos`` logger thoughtgate's handler before DBOS is constructed, so
DBOS adds none of its own (and one it added before, in a process where DBOS ran first, is
replaced): it writes each line to whatever ``sys.stderr`` is when the line is logged, and drops
the line when there is none or it is closed. Its lines pass through the process's record factory
(``thoughtgate.log_records``) like any other. :func:`dbos_level` is the level DBOS logs at:
errors only, as before, unless thoughtgate's own logging is at ``debug`` (``serve --log-level
debug``), which shows DBOS's lines too. DBOS's line about a launch that failed, which it raises
after logging it, is left to thoughtgate's error (below debug).
"""

from __future__ import annotations

import logging
import sys
from typing import Final

from thoughtgate.log_records import LINE_FORMAT

__all__ = ["DBOS_CONSOLE_HANDLER", "CurrentStderr", "dbos_level", "install"]

DBOS_CONSOLE_HANDLER: Final = "__dbos_console_log_handler__"
"""The name DBOS gives the console handler it adds (``dbos._logger.init_logger``)."""


class CurrentStderr(logging.Handler):
    """Writes each record to the ``sys.stderr`` of the moment it is logged, never a closed one."""

    def __init__(self) -> None:
        super().__init__()
        self.set_name("thoughtgate-dbos-stderr")
        self.setFormatter(logging.Formatter(LINE_FORMAT))
        self.addFilter(_not_reported_again)

    def emit(self, record: logging.LogRecord) -> None:
        stream = sys.stderr
        if stream is None or getattr(stream, "closed", False):
            return  # nowhere to write: the line is dropped, the caller is not failed
        try:
            stream.write(self.format(record) + "\n")
            stream.flush()
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)


LAUNCH_FAILED: Final = "DBOS failed to launch"
"""How DBOS's line about its launch's failure begins (``DBOS._launch``)."""


def _not_reported_again(record: logging.LogRecord) -> bool:
    """DBOS logs the failure of its launch, with its traceback, then raises it: thoughtgate's
    launch reports it (the command's one error line, the daemon's start-up failure), so the
    line is written at debug only (``DurableEngine.launch``, ADR 0125)."""
    if not str(record.msg).startswith(LAUNCH_FAILED):
        return True
    return logging.getLogger("thoughtgate").getEffectiveLevel() <= logging.DEBUG


def install() -> logging.Logger:
    """Give DBOS's logger thoughtgate's handler (once per process), in place of any console
    handler DBOS added; its records do not reach the root logger's handlers, as with DBOS's
    own. Call before ``DBOS(config=...)``."""
    logger = logging.getLogger("dbos")
    for handler in list(logger.handlers):
        if handler.get_name() == DBOS_CONSOLE_HANDLER:
            logger.removeHandler(handler)
    if not any(isinstance(handler, CurrentStderr) for handler in logger.handlers):
        logger.addHandler(CurrentStderr())
    logger.propagate = False
    return logger


def dbos_level() -> str:
    """The level DBOS logs at (its ``log_level`` setting): ``DEBUG`` when thoughtgate's own
    loggers log debug lines, else ``ERROR``."""
    debug = logging.getLogger("thoughtgate").getEffectiveLevel() <= logging.DEBUG
    return "DEBUG" if debug else "ERROR"
