"""The SQLite store is private to its owner: the file, its ``-wal``/``-shm``, the folders we create
for it and the ticket-secret file beside it, whatever the umask; a store that other users could
read is tightened with a warning, or refused when it cannot be tightened."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pwd
import shutil
import sqlite3
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.store_conformance import deltas, make_run

from thoughtgate.errors import StoreError
from thoughtgate.store.migrations import load_migrations
from thoughtgate.store.sqlite import SQLiteStore
from thoughtgate.store.sqlite_schema import applied_versions, apply_migrations, connect, user_tables

SIDE_FILES = ("", "-wal", "-shm")


def mode(path: Path) -> int:
    """The permission bits (0 for a file that does not exist)."""
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        return 0


def store_files(path: Path) -> list[Path]:
    """The database, its WAL and shared-memory files, and the ticket secret beside it."""
    return [Path(f"{path}{suffix}") for suffix in SIDE_FILES] + [secret_file(path)]


def secret_file(path: Path) -> Path:
    return path.with_name(path.name + ".ticket_hmac.secret")


def contents(paths: list[Path]) -> list[bytes]:
    return [p.read_bytes() for p in paths if p.exists()]


def set_modes(paths: list[Path], value: int) -> None:
    for target in paths:
        target.chmod(value)


def read_as_nobody(target: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["cat", str(target)], user="nobody", capture_output=True, timeout=10)


@contextlib.contextmanager
def umask(value: int) -> Iterator[None]:
    old = os.umask(value)
    try:
        yield
    finally:
        os.umask(old)


async def used_store(path: Path) -> SQLiteStore:
    """An open store that has written (so its WAL and shared-memory files exist)."""
    store = await SQLiteStore.open(path)
    run = make_run()
    await store.create_run(run)
    await store.append(run.run_id, deltas(3))
    await store.get_or_create_secret("ticket_hmac", "candidate")
    return store


@pytest.mark.parametrize("mask", [0o000, 0o022, 0o077])
async def test_a_new_store_and_its_folders_are_private_whatever_the_umask(
    tmp_path: Path, mask: int
) -> None:
    existing = tmp_path / "project"
    existing.mkdir()
    existing.chmod(0o755)
    path = existing / "made" / "by" / "us" / "thoughtgate.db"
    with umask(mask):
        store = await used_store(path)
        try:
            assert [oct(mode(f)) for f in store_files(path)] == ["0o600"] * 4
            for folder in (existing / "made", existing / "made" / "by", path.parent):
                assert mode(folder) == 0o700, folder
        finally:
            await store.close()
    assert mode(existing) == 0o755  # a folder we did not create is left alone


def _nobody() -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        return None


@pytest.mark.skipif(
    os.geteuid() != 0 or _nobody() is None or shutil.which("cat") is None,
    reason="needs root to act as another local user",
)
async def test_another_local_user_cannot_read_the_store_or_its_secret() -> None:
    """The attack: another user on the machine reads the database (every run's raw reasoning)
    or the ticket secret (to forge an owner ticket). The store sits in a shared 0755 folder."""
    shared = Path(tempfile.mkdtemp(prefix="tg-shared-"))
    try:
        os.chmod(shared, 0o755)
        path = shared / "thoughtgate.db"
        with umask(0o022):
            store = await used_store(path)
        try:
            for target in store_files(path):
                peek = await asyncio.to_thread(read_as_nobody, target)
                assert peek.returncode != 0 and b"Permission denied" in peek.stderr, target
        finally:
            await store.close()
    finally:
        shutil.rmtree(shared)


async def test_an_existing_store_open_to_others_is_tightened_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "old.db"
    store = await used_store(path)
    await store.close()
    with contextlib.closing(sqlite3.connect(path)) as conn:  # leave a WAL behind, like a crash
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        conn.execute("INSERT INTO api_keys VALUES ('key_x', 'x', 'viewer', 'h', 1.0, NULL)")
        conn.commit()
        files = store_files(path)
        set_modes(files[:3], 0o644)
        set_modes(files[3:], 0o640)
        with caplog.at_level(logging.WARNING, logger="thoughtgate.store"):
            reopened = await SQLiteStore.open(path)
            try:
                await reopened.get_or_create_secret("ticket_hmac", "other")
                assert [oct(mode(f)) for f in files] == ["0o600"] * 4
            finally:
                await reopened.close()
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(str(path) in w and "0644" in w and "0600" in w for w in warned), warned
    assert any("secret" in w and "0640" in w for w in warned), warned


async def test_a_store_open_to_others_that_cannot_be_tightened_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "shared.db"
    store = await used_store(path)
    await store.close()
    set_modes([path], 0o644)

    def not_the_owner(target: object, *args: object, **kw: object) -> None:
        raise PermissionError(1, "Operation not permitted", str(target))

    monkeypatch.setattr(os, "chmod", not_the_owner)
    with pytest.raises(StoreError, match=r"other users.*0644.*chmod 600") as info:
        await SQLiteStore.open(path)
    assert str(path) in str(info.value)
    monkeypatch.undo()
    assert mode(path) == 0o644  # refused, not half-fixed


async def test_a_store_that_kept_the_ticket_secret_inside_upgrades_and_rotates_it(
    tmp_path: Path,
) -> None:
    """Schema 2 kept the ticket secret in a ``secrets`` table. Upgrading drops it (scrubbed from
    the file) and a new secret, kept beside the database, takes its place."""
    path = tmp_path / "v2.db"
    old_secret = "OLD-TICKET-SECRET-" + "x" * 20
    with contextlib.closing(connect(path, busy_timeout=5)) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
        apply_migrations(conn, path, load_migrations("sqlite")[:2])
        conn.execute("INSERT INTO secrets VALUES ('ticket_hmac', ?, 1.0)", (old_secret,))
        conn.execute("INSERT INTO api_keys VALUES ('key_a', 'a', 'owner', 'h', 1.0, NULL)")
        assert applied_versions(conn) == {1, 2}
    set_modes([path], 0o644)  # as schema 2 left it
    store = await SQLiteStore.open(path)
    try:
        secret = await store.get_or_create_secret("ticket_hmac", "a-fresh-secret")
        assert secret == "a-fresh-secret" != old_secret
        assert [k.key_id for k in await store.list_api_keys()] == ["key_a"]  # data kept
    finally:
        await store.close()
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert applied_versions(conn) == {m.version for m in load_migrations("sqlite")}
        assert "secrets" not in user_tables(conn)
    assert not any(old_secret.encode() in raw for raw in contents(store_files(path)))
    assert mode(path) == mode(secret_file(path)) == 0o600
