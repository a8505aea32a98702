"""A test that configures the process's logging leaves nothing of it to the next test of its
worker (``support.process_logging``, ADR 0125).

Each case runs a pytest session inside this one (``pytester``): its first test configures
logging as ``thoughtgate serve`` does, then as the MCP server does, and its second test checks
that the record factory, the levels, the root's handlers and the access log's filters are as
the session found them. Without the plugin the second test fails: the case is honest."""

from __future__ import annotations

import pytest

from thoughtgate.server.logs import QUIET_LIBRARIES

TWO_TESTS = f"""
import logging

from thoughtgate import mcp_server
from thoughtgate.server.logs import RedactTickets, configure_logging

NAMES = ("", *{QUIET_LIBRARIES!r})


def state():
    root = logging.getLogger()
    return (
        logging.getLogRecordFactory(),
        {{name: logging.getLogger(name).level for name in NAMES}},
        [h for h in root.handlers if not type(h).__module__.startswith("_pytest.")],
        list(logging.getLogger("uvicorn.access").filters),
    )


BEFORE = state()  # when the session collected this module, before any test ran


def test_one_configures_the_process_logging():
    configure_logging("debug")
    mcp_server._plain_stderr_logging()
    logging.getLogger("uvicorn.access").addFilter(RedactTickets())
    assert state() != BEFORE


def test_the_next_finds_it_as_it_was():
    assert state() == BEFORE
"""


def _session(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    pytester.makepyfile(test_two=TWO_TESTS)


@pytest.mark.unit
def test_a_test_that_configures_logging_leaves_the_next_test_the_logging_it_had(
    pytester: pytest.Pytester,
) -> None:
    _session(pytester)
    kept = pytester.runpytest_inprocess("-p", "support.process_logging", "-p", "no:cacheprovider")
    kept.assert_outcomes(passed=2)


@pytest.mark.unit
def test_without_the_plugin_the_next_test_sees_the_changes(pytester: pytest.Pytester) -> None:
    """(This test's own ``process_logging`` puts back what the inner session left.)"""
    _session(pytester)
    leaked = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    leaked.assert_outcomes(passed=1, failed=1)
