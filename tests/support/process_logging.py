"""The process's logging as each test found it (a pytest plugin, registered by ``conftest``).

``thoughtgate serve`` configures the logging of its whole process (``server.logs.
configure_logging``): the record factory that makes records safe (``log_records.install``), the
root logger's level (and a handler, where the root has none), the levels of the quiet libraries;
the MCP server replaces the root's handlers; the daemon puts a filter on uvicorn's access log
while it serves. A test that reaches any of it in the pytest process (a daemon's logging test,
an in-process ``serve``) would change every later test of its worker -- a record factory hiding
an exception's words another test looks for, a level that drops the lines a test reads. The
autouse fixture :func:`process_logging` puts all of it back after every test.

pytest's own capture handlers are left alone: pytest adds and removes them at each phase of a
test, on the root and on every logger that does not propagate."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from thoughtgate.server.logs import QUIET_LIBRARIES

__all__ = ["kept_process_logging", "process_logging"]

FILTERED = ("uvicorn.access",)
"""Loggers whose filters the daemon changes while it serves (``RedactTickets``)."""


def _ours(handler: logging.Handler) -> bool:
    """Whether ``handler`` is not one of pytest's capture handlers."""
    return not type(handler).__module__.startswith("_pytest.")


@dataclass(frozen=True, slots=True)
class _Logger:
    """What a test may change of one logger: its level, its filters, and, for the root, its
    handlers. (Not the handlers uvicorn configures on its own loggers each time a server is
    built: a later server configures them again.)"""

    name: str
    level: int
    filters: tuple[logging.Filter | logging.Filterer, ...]
    handlers: tuple[logging.Handler, ...] | None

    @classmethod
    def of(cls, name: str) -> _Logger:
        logger = logging.getLogger(name)
        handlers = tuple(h for h in logger.handlers if _ours(h)) if not name else None
        return cls(name, logger.level, tuple(logger.filters), handlers)  # type: ignore[arg-type]

    def restore(self) -> None:
        logger = logging.getLogger(self.name)
        logger.setLevel(self.level)
        logger.filters[:] = list(self.filters)
        if self.handlers is None:
            return
        for handler in [h for h in logger.handlers if _ours(h) and h not in self.handlers]:
            logger.removeHandler(handler)
        for handler in self.handlers:
            if handler not in logger.handlers:
                logger.addHandler(handler)


@contextlib.contextmanager
def kept_process_logging() -> Iterator[None]:
    """Whatever the block does to the process's logging (as ``configure_logging`` and the MCP
    server change it) is undone after it."""
    factory = logging.getLogRecordFactory()
    kept = [_Logger.of(name) for name in ("", *QUIET_LIBRARIES)]
    filtered = {name: tuple(logging.getLogger(name).filters) for name in FILTERED}
    try:
        yield
    finally:
        logging.setLogRecordFactory(factory)
        for logger in kept:
            logger.restore()
        for name, filters in filtered.items():
            logging.getLogger(name).filters[:] = list(filters)


@pytest.fixture(autouse=True)
def process_logging() -> Iterator[None]:
    """Every test leaves the process's logging as it found it (:func:`kept_process_logging`)."""
    with kept_process_logging():
        yield
