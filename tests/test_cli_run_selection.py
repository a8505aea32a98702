"""``thoughtgate runs`` with filters: the same options select the same runs from the local store
(``--db``) and from a daemon (``--url``) over that store, and what is shown of each run passes the
one output filter either way. Real subprocesses; the daemon on loopback."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from support.daemon import REPO, Daemon, cli_env, running_daemon

from thoughtgate.cli.run_selection import parse_when, select_runs
from thoughtgate.errors import UsageError
from thoughtgate.store.records import RunRecord, TaskRecord
from thoughtgate.store.urls import open_store

SECRET = "SECRET-REASONING-of-the-budget"
NOW = time.time()


def _utc(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


# name: (prompt, status, mode, model, created_at)
RUNS: dict[str, tuple[str, str, str, str, float]] = {
    "lisbon": ("Plan the offsite in Lisbon", "completed", "hidden", "anthropic:claude", _utc("2025-06-01T12:00:00")),
    "notes": ("Summarise the offsite notes", "failed", "surface", "fake:echo", _utc("2025-06-10T12:00:00")),
    "budget": ("Draft the budget", "partial", "telemetry_only", "fake:echo", NOW - 3 * 3600),
    "review": ("Budget review for LISBON", "interrupted", "surface", "anthropic:claude", NOW - 600),
    "hello": ("hello", "completed", "surface", "fake:echo", NOW - 60),
}  # fmt: skip
NEWEST_FIRST = sorted(RUNS, key=lambda name: -RUNS[name][4])


def _seed(db: str) -> dict[str, str]:
    """The runs above, each with one task (the surface ones with reasoning); their ids by name."""

    async def seed() -> dict[str, str]:
        store = await open_store(db)
        ids = {}
        try:
            for name, (prompt, status, mode, model, at) in RUNS.items():
                run_id = f"run_{name}{int(at)}"
                task = TaskRecord(
                    f"task_{name}",
                    run_id,
                    0,
                    prompt,
                    status="completed",
                    output=f"answer for {name}",
                    reasoning=f"{SECRET} {name}" if mode == "surface" else None,
                )
                record = RunRecord(
                    run_id,
                    prompt,
                    model=model,
                    chain_of_thought=mode,
                    status=status,  # type: ignore[arg-type]
                    created_at=at,
                    updated_at=at,
                    tasks=[task],
                )
                await store.create_run(record)
                ids[name] = run_id
        finally:
            await store.close()
        return ids

    return asyncio.run(seed())


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, dict[str, str], Daemon]]:
    """One SQLite store with the runs, read locally (its URL) and by a daemon serving it."""
    folder = tmp_path_factory.mktemp("selection")
    db = f"sqlite:///{folder / 'daemon.db'}"
    ids = _seed(db)
    with running_daemon(sqlite_dir=folder) as daemon:
        yield db, ids, daemon


def tg(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "thoughtgate", *args],
        env=cli_env(COLUMNS="200", **(env or {})),
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=120,
    )


def _listed(done: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    assert done.returncode == 0, done.stderr
    listed: list[dict[str, Any]] = json.loads(done.stdout)
    return listed


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ((), NEWEST_FIRST),
        (("--status", "failed,partial"), ["budget", "notes"]),
        (("--status", "completed", "--status", "interrupted"), ["hello", "review", "lisbon"]),
        (("--mode", "surface"), ["hello", "review", "notes"]),
        (("--model", "fake:echo", "--mode", "surface"), ["hello", "notes"]),
        (("--search", "lisbon"), ["review", "lisbon"]),
        (("--since", "2h"), ["hello", "review"]),
        (("--until", "2025-06-05"), ["lisbon"]),
        (("--since", "2025-06-01T11:00:00Z", "--until", "2025-06-10T12:00:00+00:00"), ["lisbon"]),
        (("--search", "offsite", "--limit", "1"), ["notes"]),
    ],
)
def test_filters_select_the_same_runs_locally_and_through_the_daemon(
    served: tuple[str, dict[str, str], Daemon], options: tuple[str, ...], expected: list[str]
) -> None:
    db, ids, daemon = served
    local = _listed(tg("runs", *options, "--json", "--db", db, "--view-as", "viewer"))
    remote = _listed(
        tg(
            "runs",
            *options,
            "--json",
            env={"THOUGHTGATE_URL": daemon.base_url, "THOUGHTGATE_KEY": daemon.keys["viewer"]},
        )
    )
    assert [v["run_id"] for v in local] == [ids[name] for name in expected]
    assert remote == local, "the same runs, shown alike, for the same role"
    assert SECRET not in json.dumps(local), "a viewer sees no reasoning"


def test_the_owner_sees_the_reasoning_of_the_surface_runs_it_selects(
    served: tuple[str, dict[str, str], Daemon],
) -> None:
    db, ids, _ = served
    listed = _listed(tg("runs", "--mode", "surface", "--search", "notes", "--json", "--db", db))
    assert [v["run_id"] for v in listed] == [ids["notes"]]
    assert listed[0]["tasks"][0]["reasoning"] == f"{SECRET} notes"
    table = tg("runs", "--status", "failed", "--db", db)
    assert table.returncode == 0 and ids["notes"] in table.stdout
    assert ids["lisbon"] not in table.stdout


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (("--status", "done"), "--status 'done' is not a run status; use one of: pending, running, completed, partial, failed, error, interrupted"),
        (("--status", "completed,finished"), "--status 'finished' is not a run status"),
        (("--mode", "loud"), "--mode 'loud' is not a disclosure mode; use one of: hidden, surface, telemetry_only"),
        (("--since", "yesterday"), "--since 'yesterday' is not a time: use an ISO 8601 date or datetime"),
        (("--until", "2h ago"), "--until '2h ago' is not a time"),
        (("--since", "1h", "--until", "2h"), "--since 1h is not before --until 2h"),
        (("--search", "x" * 201), "--search is limited to 200 characters"),
        (("--mine",), "--mine needs --url (or THOUGHTGATE_URL)"),
    ],
)  # fmt: skip
def test_a_bad_filter_is_a_usage_error_that_says_what_to_type(
    tmp_path: Path, options: tuple[str, ...], message: str
) -> None:
    db = tmp_path / "never.db"
    done = tg("runs", *options, "--db", f"sqlite:///{db}")
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert message in " ".join(done.stderr.split())
    assert "Traceback" not in done.stderr
    assert not db.exists(), "the options are checked before the store is opened"


@pytest.mark.unit
@pytest.mark.parametrize("model", ["claude-sonnet-4-5", "fake", "fake:", ":echo", " : "])
def test_a_model_filter_that_no_run_can_have_is_a_usage_error(model: str) -> None:
    """Every run's model is PROVIDER:MODEL: ``--model claude-sonnet-4-5`` listed nothing without
    a word, where a mistyped ``--status`` or ``--mode`` is a usage error."""
    with pytest.raises(UsageError, match=r"is not PROVIDER:MODEL \(for example anthropic:"):
        select_runs(model=model, now=0.0)
    assert select_runs(model="fake:echo", now=0.0).model == "fake:echo"
    assert select_runs(model="my-gateway:org/model:v2", now=0.0).model  # any provider, any name


@pytest.mark.unit
def test_times_are_dates_datetimes_or_ages() -> None:
    now = _utc("2026-12-03T12:00:00")
    assert parse_when("30m", "--since", now=now) == now - 1800
    assert parse_when("2h", "--since", now=now) == now - 7200
    assert parse_when(" 7D ", "--since", now=now) == now - 7 * 86400
    assert parse_when("1w", "--since", now=now) == now - 7 * 86400
    assert parse_when("2026-12-01T09:30:00Z", "--since", now=now) == _utc("2026-12-01T09:30:00")
    assert parse_when("2026-12-01T10:30+01:00", "--since", now=now) == _utc("2026-12-01T09:30")
    local_midnight = datetime(2026, 12, 1).timestamp()  # no offset: local time, as `date` shows
    assert parse_when("2026-12-01", "--since", now=now) == local_midnight
    # the first and last days ISO 8601 writes are times, though the platform cannot place them
    assert parse_when("0001-01-01T00:00Z", "--since", now=now) == -62135596800
    # local midnight, however the zone's offset of year 1 is taken: within a day of UTC's
    assert abs(parse_when("0001-01-01", "--since", now=now) + 62135596800) <= 86400
    assert parse_when("9999-12-31T23:59:59Z", "--until", now=now) == 253402300799
    assert select_runs(since="0001-01-01", now=now).since == 0, "every run since then"
    for bad in ("", "2h30m", "-2h", "soon", "2026-13-01"):
        with pytest.raises(UsageError, match="is not a time"):
            parse_when(bad, "--since", now=now)


@pytest.mark.unit
def test_a_selection_is_whole_seconds_never_narrower_than_asked() -> None:
    selection = select_runs(since="2026-12-01T09:30:00.7Z", until="2026-12-01T10:00:00.2Z", now=0)
    assert selection.since == int(_utc("2026-12-01T09:30:00"))
    assert selection.until == int(_utc("2026-12-01T10:00:01"))
    assert select_runs(until="1969-06-01T00:00Z", now=0).until == 0, "no time before 1970"
    query = select_runs(statuses=["failed, error", "failed"], modes=["surface"], now=0)
    assert query.store_query(5).statuses == ("failed", "error")
    assert query.daemon_filters() == {"status": ("failed", "error"), "mode": ("surface",)}
    assert select_runs(mine=True, search="x", now=0).daemon_filters() == {
        "key": "me",
        "search": "x",
    }
