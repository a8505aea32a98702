"""Numbered schema migrations for the SQL backends, and the rule for which ones still have to run.

Each backend keeps its migrations as ``<dialect>/NNNN_name.sql`` files shipped inside the package.
A migration is applied once, inside one transaction together with the row that records it in
the ``thoughtgate_migrations`` table, so a crash never leaves a half-applied version behind.
Versions are never edited after release: a schema change is always a new, higher-numbered file.

A PostgreSQL migration whose first line is :data:`CONCURRENT_MARKER` runs outside a transaction
(``CREATE INDEX CONCURRENTLY`` cannot run in one, ADR 0082): its statements one at a time, each
written so that running it again after a crash completes what the last try began, then the row
recording it (``store.pg_schema``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Literal, TypeAlias

from thoughtgate.errors import StoreError

__all__ = [
    "CONCURRENT_MARKER",
    "MIGRATIONS_TABLE",
    "Dialect",
    "Migration",
    "load_migrations",
    "pending_migrations",
]

Dialect: TypeAlias = Literal["sqlite", "postgres"]

MIGRATIONS_TABLE = "thoughtgate_migrations"
"""Records ``(version, name, applied_at)``; its presence is how we recognise our own database."""

CONCURRENT_MARKER = "-- thoughtgate: concurrently"
"""The first line of a PostgreSQL migration that runs outside a transaction (module docstring)."""


@dataclass(frozen=True, slots=True)
class Migration:
    """One schema step: ``0002_list_indexes.sql`` is version 2, named ``list_indexes``."""

    version: int
    name: str
    sql: str

    @property
    def concurrent(self) -> bool:
        """Whether it runs outside a transaction, a statement at a time (PostgreSQL only)."""
        return self.sql.startswith(CONCURRENT_MARKER + "\n")

    def statements(self) -> list[str]:
        """Its statements, comments left out: each ends with ``;`` at the end of a line (the
        files hold no ``;`` inside a literal)."""
        lines = [line.split("--", 1)[0].rstrip() for line in self.sql.splitlines()]
        text = "\n".join(line for line in lines if line)
        return [part.strip() + ";" for part in re.split(r";$", text, flags=re.M) if part.strip()]


@functools.cache
def load_migrations(dialect: Dialect) -> tuple[Migration, ...]:
    """All migrations of a dialect in version order; versions must run 1, 2, 3, ... no holes."""
    folder = resources.files(__package__).joinpath(dialect)
    found: list[Migration] = []
    for entry in folder.iterdir():
        if not entry.name.endswith(".sql"):
            continue
        number, _, rest = entry.name.removesuffix(".sql").partition("_")
        found.append(Migration(int(number), rest, entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        # A packaging mistake, not a runtime condition: fail loudly at first use.
        raise RuntimeError(f"{dialect} migrations are not numbered 1..n: {versions}")
    return tuple(found)


def pending_migrations(
    applied: Collection[int], known: Sequence[Migration], *, where: str
) -> list[Migration]:
    """The known migrations not yet applied, in order.

    A database that records a version we do not know was written by a newer thoughtgate; running
    against it could corrupt data it relies on, so we refuse before touching anything.
    """
    newest_known = known[-1].version if known else 0
    unknown = sorted(set(applied) - {m.version for m in known})
    if unknown:
        raise StoreError(
            f"{where} has schema version {unknown[-1]}, but this thoughtgate only knows versions "
            f"up to {newest_known}: it was written by a newer thoughtgate. Upgrade thoughtgate to "
            "use it (the database was left untouched)."
        )
    return [m for m in known if m.version not in applied]
