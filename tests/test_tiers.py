"""A session-scoped fixture's teardown is the session's, not a test's (``support.tiers``).

pytest tears a session fixture down within the last test the process ran, whatever its tier: a
private PostgreSQL cluster (``support.pg_private``) started for an external test was stopped, a
subprocess, inside a unit test's teardown, which then failed for touching it. What the fixture
does inside ``tiers.the_sessions()`` counts for no test; without it, the unit test still fails
(the watch is not simply off). Each case runs a pytest session in another process, which
installs its own watch."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.external

CONFTEST = """
import contextlib
import subprocess
import sys

import pytest

from support import tiers

pytest_plugins = ("support.tiers",)


@pytest.fixture(scope="session")
def server():
    yield
    with tiers.the_sessions() if {wrapped} else contextlib.nullcontext():
        subprocess.run([sys.executable, "-c", "pass"], check=True)
"""

TESTS = """
import pytest


@pytest.mark.external
def test_an_external_test_starts_it(server):
    pass


@pytest.mark.unit
def test_a_unit_test_runs_last():
    pass
"""


@pytest.mark.parametrize("wrapped", [True, False])
def test_a_session_fixtures_teardown_counts_for_no_test_inside_the_sessions(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, wrapped: bool
) -> None:
    tests = Path(__file__).parent
    path = [str(tests), str(tests.parent / "src"), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in path if p))
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    pytester.makeconftest(CONFTEST.format(wrapped=wrapped))
    pytester.makepyfile(test_inner=TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:xdist")
    if wrapped:
        result.assert_outcomes(passed=2)
    else:
        result.assert_outcomes(passed=2, errors=1)
        result.stdout.fnmatch_lines(["*a unit test may not touch this*subprocess*"])
