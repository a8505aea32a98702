"""The daemon tests' ``ServeProcess`` gives up on servers started together at one deadline, with
its own error (what the server printed, where it waits): a wait that outlasted the test file's
timeout would end the test showing nothing of why the daemon did not listen."""

from __future__ import annotations

import sys
import time

import pytest
from support.daemon import ServeProcess

pytestmark = [pytest.mark.external, pytest.mark.timeout(120)]

SILENT = "import sys, time; print('starting up', file=sys.stderr, flush=True); time.sleep(300)"
LISTENING = (
    "import sys, time; "
    "print('thoughtgate listening on http://127.0.0.1:1 (fake)', file=sys.stderr, flush=True); "
    "time.sleep(300)"
)


class _Fake(ServeProcess):
    """A process that prints what ``script`` prints, in place of ``thoughtgate serve``."""

    def __init__(self, script: str) -> None:
        super().__init__()
        self.script = script

    def command(self) -> list[str]:
        return [sys.executable, "-c", self.script]


def test_servers_started_together_that_never_listen_fail_with_what_they_printed() -> None:
    servers = [_Fake(SILENT), _Fake(LISTENING), _Fake(SILENT)]
    try:
        with pytest.raises(RuntimeError, match=r"not listening after 1\.0 s") as err:
            ServeProcess.start_all(*servers, timeout=1.0)
        assert "starting up" in str(err.value)  # all it printed
        assert "py-spy" in str(err.value)  # where it waits, or why that is not shown
        still_running = [s for s in servers if s.proc is not None and s.proc.poll() is None]
        assert still_running == [], "the helper leaves no server of the lot running"
    finally:
        for server in servers:
            server.stop()


def test_a_server_that_listened_before_the_deadline_is_ready_however_late_it_is_read() -> None:
    """Of servers started together, the wait for one may use up the time they share: one that
    listened meanwhile is ready, not failed for the time left."""
    server = _Fake(LISTENING).spawn()
    try:
        deadline = time.monotonic() + 60
        while not server.stderr_lines:
            assert time.monotonic() < deadline, "the fake server printed nothing"
            time.sleep(0.05)
        assert server.ready(timeout=0.0).base_url == "http://127.0.0.1:1"
    finally:
        server.stop()
