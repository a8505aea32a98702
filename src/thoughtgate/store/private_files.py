"""Files only their owner may open: the SQLite store, its ``-wal``/``-shm``, and secret files.

The event log holds every run's raw reasoning and tool data, so another local user must not be
able to read it. SQLite creates a database file with mode 0644 whatever the umask (it calls
``fchmod`` itself), and gives ``-wal``, ``-shm`` and ``-journal`` the database file's mode. So we
create the database file ourselves, empty and 0600, before SQLite opens it: its side files then
follow. Folders we create for it are 0700. A folder that already existed (a project directory,
say) is left as it is: the files inside are private anyway.

An existing file that other users may read or write is tightened (group and other bits cleared)
with a warning in the ``thoughtgate.store`` log; when that is impossible (we are not its owner, or
the file is immutable) opening is refused with a :class:`StoreError` that says how to fix it,
rather than going on with data that others can read.
"""

from __future__ import annotations

import logging
import os
import stat
import uuid
from pathlib import Path

from thoughtgate.errors import StoreError

__all__ = [
    "PRIVATE_DIR_MODE",
    "PRIVATE_FILE_MODE",
    "create_private_file",
    "make_private_parents",
    "read_secret_file",
    "require_private",
    "write_secret_file",
]

log = logging.getLogger("thoughtgate.store")

PRIVATE_FILE_MODE = 0o600
PRIVATE_DIR_MODE = 0o700
_OTHERS = 0o077


def make_private_parents(path: Path) -> None:
    """Create the missing folders above ``path``, each 0700 whatever the umask.

    Raises ``OSError`` (the caller says which store it was for).
    """
    missing: list[Path] = []
    folder = path.parent
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    for created in reversed(missing):
        try:
            created.mkdir(mode=PRIVATE_DIR_MODE)
        except FileExistsError:  # another process made it first: theirs to set
            continue
        os.chmod(created, PRIVATE_DIR_MODE)  # mkdir's mode is filtered by the umask


def create_private_file(path: Path, content: bytes = b"") -> bool:
    """Create ``path`` as a new 0600 file holding ``content``; ``False`` when it already exists.

    ``O_EXCL`` makes creation atomic across processes, and ``O_NOFOLLOW`` refuses a symlink
    planted where the file should be. Raises other ``OSError`` s.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags, PRIVATE_FILE_MODE)
    except FileExistsError:
        return False
    try:
        os.fchmod(fd, PRIVATE_FILE_MODE)  # the open mode is filtered by the umask
        if content:
            os.write(fd, content)
            os.fsync(fd)
    finally:
        os.close(fd)
    return True


def require_private(path: Path, what: str) -> None:
    """Make an existing file private to its owner, or refuse it; a missing file is fine."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        return
    if not mode & _OTHERS:
        return
    tightened = mode & ~_OTHERS
    try:
        os.chmod(path, tightened)
    except OSError as exc:
        raise StoreError(
            f"{what} {path} is open to other users (mode {mode:04o}) and cannot be made "
            f"private ({exc.strerror or exc}), so thoughtgate will not use it. As its owner, run: "
            f"chmod {tightened:o} {path}"
        ) from exc
    log.warning(
        "%s %s was open to other users (mode %04o); tightened to %04o",
        what,
        path,
        mode,
        tightened,
    )


def read_secret_file(path: Path) -> str | None:
    """The secret kept in ``path`` (made private first), or ``None`` when there is no file."""
    require_private(path, "secret file")
    try:
        text = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    if not text:
        raise StoreError(f"secret file {path} is empty; delete it and a new secret is made")
    return text


def write_secret_file(path: Path, candidate: str) -> str:
    """Keep ``candidate`` in ``path`` unless another process got there first; returns the winner.

    The secret is written whole to a private temporary file, then linked into place: a reader
    never sees half a secret, and ``link`` fails instead of replacing a secret already there.
    """
    scratch = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    create_private_file(scratch, candidate.encode("utf-8") + b"\n")
    try:
        os.link(scratch, path)
    except FileExistsError:
        found = read_secret_file(path)
        if found is None:  # linked and removed in between: cannot happen with our own writers
            raise StoreError(f"secret file {path} vanished while it was being read") from None
        return found
    finally:
        scratch.unlink(missing_ok=True)
    return candidate
