"""The private test cluster (``support.pg_private``) leaves nothing behind a killed test process.

Its session teardown stops and removes it; a process killed before that (a timeout, an OOM kill,
Ctrl-C twice) cannot, so the next process to start one stops and removes it instead. Otherwise
every killed run on a CI machine would leave a PostgreSQL server running, with its memory and its
directory, until the machine restarts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from support import pg_private
from support.pg_private import private_pg, server_binaries, sweep_abandoned_clusters

__all__ = ["private_pg"]  # fixture used by this module

pytestmark = pytest.mark.postgres

_KILLED = """
import os, sys
sys.path[:0] = sys.argv[1:]
from support import pg_private as m
prefix, user = m._as_server_user()
cluster = m._start(m.server_binaries(), prefix, user)
print(cluster.directory, cluster.url, flush=True)
os._exit(0)  # no teardown: as a killed process
"""


def test_a_cluster_whose_process_died_is_stopped_and_removed_by_the_next(private_pg: str) -> None:
    """A process starts a cluster and exits without stopping it: the cluster still answers (it
    was left running); the next sweep stops it and removes its directory, and leaves this
    process's own cluster, whose owner is alive, answering."""
    tests = str(Path(__file__).parent)
    src = str(Path(__file__).parents[1] / "src")
    out = subprocess.run(
        [sys.executable, "-c", _KILLED, tests, src],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.split()
    directory, url = Path(out[0]), out[1]
    assert _answers(url), "the dead process's cluster should still be running before the sweep"
    bindir = server_binaries()
    assert bindir is not None
    prefix, _ = pg_private._as_server_user()
    assert directory in sweep_abandoned_clusters(bindir, prefix)
    assert not directory.exists()
    assert not _answers(url)
    assert _answers(private_pg)


def _answers(url: str) -> bool:
    try:
        conn: psycopg.Connection[Any] = psycopg.connect(url, connect_timeout=5)
    except psycopg.OperationalError:
        return False
    with conn:
        return conn.execute("SELECT 1").fetchone() == (1,)
