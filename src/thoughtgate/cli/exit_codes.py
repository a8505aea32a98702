"""Exit codes: a shell script tells a completed run from every other outcome by ``$?`` alone.

====  ==============================================================================
code  meaning
====  ==============================================================================
0     the run completed (or a command that runs nothing succeeded)
1     the run failed: no answer (provider outage, error), or thoughtgate itself failed
2     usage error: bad input, flag, config or missing API key; no run was created
3     the run is partial: an answer was cut after some of it arrived
4     ``check-index``: the run index disagrees with the event log (with ``--repair``: a
      disagreement is left -- an open run skipped, or a field a rebuild does not write)
5     ``smoke``: the provider answered every request, and a check was not proven (1: a
      request failed, so a check could not be made)
130   the run was interrupted (Ctrl-C, SIGTERM, SIGHUP) and recorded as such
====  ==============================================================================
"""

from __future__ import annotations

from enum import IntEnum

__all__ = ["ExitCode", "for_run_status"]


class ExitCode(IntEnum):
    COMPLETED = 0
    FAILED = 1
    USAGE = 2
    PARTIAL = 3
    INDEX_DISAGREES = 4
    NOT_PROVEN = 5
    INTERRUPTED = 130


def for_run_status(status: str) -> ExitCode:
    """The exit code of a command whose outcome is a run in ``status``."""
    return {
        "completed": ExitCode.COMPLETED,
        "partial": ExitCode.PARTIAL,
        "interrupted": ExitCode.INTERRUPTED,
    }.get(status, ExitCode.FAILED)
