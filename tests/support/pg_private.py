"""A private, throwaway PostgreSQL cluster for the tests that need a server setting the shared
test server lacks (import the fixtures into a test module to use them).

The shared server (``support.pg``) is started before the tests, for every process on the machine;
restarting it to change a setting is not a test's to do. Its ``max_prepared_transactions`` is 0,
so no transaction can be prepared there, and ADR 0146's case of another database's *prepared*
transaction went untested. :func:`private_pg` instead ``initdb``s a cluster of its own into a
temporary directory, with :data:`SETTINGS`, and starts it listening only on a Unix socket in that
directory (no TCP port to pick, so none to race for); it is stopped (``pg_ctl stop -m immediate``)
and removed when the session ends, whatever the tests did.

It is session-scoped and lazy: a process starts it only when it sets up a test that uses it (an
``initdb`` with ``--no-sync`` and a start, about a second), and each pytest-xdist worker that
does starts its own. One cluster shared by the workers through a file lock would need the last
user to stop it, which no worker knows; two small clusters in two directories share nothing to
coordinate. A process killed before its teardown leaves its cluster running: the next
:func:`private_pg` of any process stops and removes every cluster whose owning process is gone
(:func:`sweep_abandoned_clusters`).

PostgreSQL refuses to run as root, and CI runs the tests as root: then ``initdb`` and ``pg_ctl`` run
as the ``postgres`` user (``runuser``, else ``setpriv``), which owns the directory. When the server
binaries, or that user, are missing, every test using the cluster is skipped with a message that
starts ``NOT TESTED`` and says why; when they are there and the cluster does not start, the tests
fail with its log. They never pass without a server.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from support import tiers
from support.pg import drop_schema, schema_name

__all__ = [
    "SETTINGS",
    "private_admin",
    "private_pg",
    "private_schema",
    "server_binaries",
    "sweep_abandoned_clusters",
]

SETTINGS: dict[str, str] = {
    "max_prepared_transactions": "4",
    # throwaway: nothing to keep through a crash, so nothing is written for one
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "shared_buffers": "32MB",
    "max_connections": "60",
}
"""The private cluster's settings beside its socket: what the shared server lacks, and speed."""

_PREFIX = "tg_test_pgcluster_"
"""Every private cluster's directory, in the temporary directory, starts so (for the sweep)."""
_SERVER_USER = "postgres"
"""The OS user that runs the cluster when this process is root, and the cluster's superuser."""
_DEBIAN_BINDIRS = "/usr/lib/postgresql/*/bin"


def server_binaries() -> Path | None:
    """The directory with ``initdb`` and ``pg_ctl``: ``THOUGHTGATE_TEST_PG_BINDIR``, else
    ``pg_config --bindir``, else Debian's newest ``/usr/lib/postgresql/N/bin``; None if none has
    both (Debian's ``pg_config`` may come with the client library alone)."""
    candidates: list[Path] = []
    if given := os.environ.get("THOUGHTGATE_TEST_PG_BINDIR"):
        candidates.append(Path(given))
    if pg_config := shutil.which("pg_config"):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True
            )
            candidates.append(Path(out.stdout.strip()))
    debian = sorted(Path("/").glob(_DEBIAN_BINDIRS.lstrip("/")), key=_version, reverse=True)
    candidates += debian
    for bindir in candidates:
        if (bindir / "initdb").is_file() and (bindir / "pg_ctl").is_file():
            return bindir
    return None


def _version(bindir: Path) -> int:
    try:
        return int(bindir.parent.name)
    except ValueError:
        return -1


def _as_server_user() -> tuple[list[str], pwd.struct_passwd | None]:
    """The command prefix that runs a server binary as its user, and that user (None: this
    process's own). Skips (NOT TESTED) when this process is root and cannot become it."""
    if os.geteuid() != 0:
        return [], None
    try:
        user = pwd.getpwnam(_SERVER_USER)
    except KeyError:
        pytest.skip(
            f"NOT TESTED: PostgreSQL will not run as root, and there is no {_SERVER_USER!r} "
            "user to run the private test cluster as"
        )
    if runuser := shutil.which("runuser"):
        return [runuser, "-u", _SERVER_USER, "--"], user
    if setpriv := shutil.which("setpriv"):
        ids = [f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--init-groups"]
        return [setpriv, *ids, "--"], user
    pytest.skip(
        "NOT TESTED: PostgreSQL will not run as root, and neither runuser nor setpriv is here "
        f"to run the private test cluster as {_SERVER_USER!r}"
    )


@dataclass
class _Cluster:
    directory: Path
    bindir: Path
    prefix: list[str]

    @property
    def data(self) -> Path:
        return self.directory / "data"

    @property
    def log(self) -> Path:
        return self.directory / "server.log"

    @property
    def url(self) -> str:
        return f"postgresql://{_SERVER_USER}@/postgres?host={self.directory}"

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"}
        return subprocess.run(
            [*self.prefix, *args],
            cwd=self.directory,  # readable by the server's user (the caller's may not be)
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self.run(str(self.bindir / "pg_ctl"), "stop", "-D", str(self.data), "-m", "immediate")
        shutil.rmtree(self.directory, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_abandoned_clusters(bindir: Path, prefix: list[str]) -> list[Path]:
    """Stop and remove every private cluster whose owning process is gone (killed before its
    teardown); return their directories. Others' (a live worker's, another run's) are left."""
    gone = []
    for directory in Path(tempfile.gettempdir()).glob(f"{_PREFIX}*"):
        try:
            owner = int((directory / "owner").read_text())
        except (OSError, ValueError):
            continue  # being made, or not one of ours
        if not _alive(owner):
            _Cluster(directory, bindir, prefix).stop()
            gone.append(directory)
    return gone


def _start(bindir: Path, prefix: list[str], user: pwd.struct_passwd | None) -> _Cluster:
    cluster = _Cluster(Path(tempfile.mkdtemp(prefix=_PREFIX)), bindir, prefix)
    try:
        (cluster.directory / "owner").write_text(str(os.getpid()))
        if user is not None:
            os.chown(cluster.directory, user.pw_uid, user.pw_gid)
        init = cluster.run(
            str(bindir / "initdb"),
            *("-D", str(cluster.data), "-U", _SERVER_USER, "-A", "trust"),
            *("-E", "UTF8", "--locale=C", "--no-sync"),
        )
        if init.returncode != 0:
            pytest.fail(f"initdb of the private test cluster failed:\n{init.stdout}{init.stderr}")
        options = {
            **SETTINGS,
            "listen_addresses": "''",
            "unix_socket_directories": f"'{cluster.directory}'",
        }
        conf = "".join(f"{name} = {value}\n" for name, value in options.items())
        with open(cluster.data / "postgresql.conf", "a") as f:  # noqa: PTH123
            f.write(conf)
        start = cluster.run(
            str(bindir / "pg_ctl"),
            *("start", "-D", str(cluster.data), "-l", str(cluster.log), "-w", "-t", "60"),
        )
        if start.returncode != 0:
            log = cluster.log.read_text() if cluster.log.exists() else "(no log)"
            pytest.fail(
                f"the private test cluster did not start:\n{start.stdout}{start.stderr}\n{log}"
            )
    except BaseException:
        cluster.stop()
        raise
    return cluster


@pytest.fixture(scope="session")
def private_pg() -> Iterator[str]:
    """The URL of this process's private cluster (:data:`SETTINGS`), its superuser's, to its
    ``postgres`` database; started at the first test that uses it, stopped and removed at the
    end of the session."""
    bindir = server_binaries()
    if bindir is None:
        pytest.skip(
            "NOT TESTED: the PostgreSQL server binaries (initdb, pg_ctl) are not installed "
            "(neither THOUGHTGATE_TEST_PG_BINDIR, pg_config --bindir nor "
            f"{_DEBIAN_BINDIRS} has them), so no private test cluster can be started"
        )
    prefix, user = _as_server_user()
    sweep_abandoned_clusters(bindir, prefix)
    cluster = _start(bindir, prefix, user)
    try:
        yield cluster.url
    finally:
        with tiers.the_sessions():  # within the last test this process ran, of any tier
            cluster.stop()


@pytest.fixture
async def private_admin(private_pg: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """An autocommit connection to the private cluster, for setting up and inspecting."""
    async with await psycopg.AsyncConnection.connect(
        private_pg, autocommit=True, connect_timeout=5
    ) as conn:
        yield conn


@pytest.fixture
async def private_schema(private_admin: psycopg.AsyncConnection[Any]) -> AsyncIterator[str]:
    """A fresh schema name on the private cluster (not created: the store creates it), as
    ``support.pg.pg_schema``; dropped afterwards with DBOS's beside it."""
    name = schema_name()
    try:
        yield name
    finally:
        await drop_schema(private_admin, name)
