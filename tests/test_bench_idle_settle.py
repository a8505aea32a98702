"""``bench.idle_bench``: the window begins a settle after the last daemon says it listens -- past
DBOS's first minute from its launch however long a start-up took -- and a daemon that exits
before it listens fails the bench with what it printed."""

from __future__ import annotations

import importlib
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytestmark = pytest.mark.external  # it starts processes

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def idle_bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(ROOT))  # bench/ is a package of the repository, not installed
    return importlib.import_module("bench.idle_bench")


def _process(script: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )


def _daemon(idle_bench: ModuleType, tmp_path: Path, name: str, script: str) -> Any:
    return idle_bench.Daemon.watch(name, _process(script), tmp_path / f"{name}.log")


def test_the_settle_counts_from_the_last_daemon_listening(
    idle_bench: ModuleType, tmp_path: Path
) -> None:
    """The slower start-up sets the window's start; what each printed is kept in its log."""
    listens = "import time; time.sleep({}); print('thoughtgate listening on http://x', flush=True)"
    quick = _daemon(idle_bench, tmp_path, "quick", listens.format(0.0) + "; time.sleep(30)")
    slow = _daemon(idle_bench, tmp_path, "slow", listens.format(1.0) + "; time.sleep(30)")
    try:
        idle_bench.settle([quick, slow], 0.5)
        settled = time.monotonic()
        assert quick.listening_at is not None and slow.listening_at is not None
        assert quick.listening_at < slow.listening_at, "the script's sleep orders them"
        assert settled >= slow.listening_at + 0.5
        assert "listening on" in (tmp_path / "slow.log").read_text()
    finally:
        for daemon in (quick, slow):
            daemon.process.kill()
            daemon.process.wait()
            daemon.reader.join()


def test_a_daemon_that_exits_before_it_listens_fails_the_bench_with_what_it_printed(
    idle_bench: ModuleType, tmp_path: Path
) -> None:
    gone = _daemon(
        idle_bench, tmp_path, "gone", "print('error: no such store'); raise SystemExit(3)"
    )
    with pytest.raises(RuntimeError) as raised:
        idle_bench.settle([gone], 0.0)
    gone.process.wait()
    gone.reader.join()
    assert "gone: the daemon exited with 3" in str(raised.value)
    assert "error: no such store" in str(raised.value)
