"""``bench.profile_summary``: a profile's summary tells threads that wait from threads that run.

py-spy counts a thread blocked on the disk as active, so the SQLite writer thread's fsync in a
``COMMIT`` looked like CPU: a reader took the store's share of a profile for its cost.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from support.bench_modules import bench_module

from thoughtgate.store import sqlite_thread

pytestmark = pytest.mark.unit

profile_summary = bench_module("profile_summary")
summary = profile_summary.summary

LOOP = "<module> (serve.py:9);run (asyncio/runners.py:118)"
WRITER = "Thread._bootstrap (threading.py:1002);SQLiteThread._serve (thoughtgate/store/sqlite_thread.py:570)"
SOURCE = {
    ("thoughtgate/store/sqlite_thread.py", 800): '            conn.execute("COMMIT")\n',
    ("thoughtgate/store/sqlite_thread.py", 564): "            job = jobs.get()\n",
    ("thoughtgate/store/sqlite.py", 354): '    conn.executemany("INSERT INTO events", rows)\n',
    ("thoughtgate/store/codec.py", 162): "    return json.dumps(value)\n",
}


def _source(file: str, line: int) -> str:
    return SOURCE.get((file, line), "")


def _profile(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "profile.txt"
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


def test_samples_blocked_in_a_commit_or_a_wait_are_counted_apart_from_running_ones(
    tmp_path: Path,
) -> None:
    path = _profile(
        tmp_path,
        [
            f"{WRITER};SQLiteThread._commit (thoughtgate/store/sqlite_thread.py:800) 60",
            "Thread._bootstrap (threading.py:1002);SQLiteThread._serve"
            " (thoughtgate/store/sqlite_thread.py:564) 20",
            f"{LOOP};EpollSelector.select (selectors.py:468) 10",
            f"{WRITER};_insert_events (thoughtgate/store/sqlite.py:354) 6",
            f"{LOOP};dumps (thoughtgate/store/codec.py:162) 4",
        ],
    )
    lines = summary(path, source=_source).splitlines()
    assert lines[0].startswith(
        "100 samples (all threads py-spy saw active): 10 running, 90 waiting"
    )
    by_area = lines[lines.index("self, by area (% of running):") + 1 :][:2]
    assert by_area == ["   60.0%  thoughtgate.store.sqlite", "   40.0%  thoughtgate.store.codec"]
    waits = lines[lines.index("waiting, by line (% of all):") + 1 :]
    assert waits == [
        "   60.0%  SQLiteThread._commit (thoughtgate/store/sqlite_thread.py:800)",
        "   20.0%  SQLiteThread._serve (thoughtgate/store/sqlite_thread.py:564)",
        "   10.0%  EpollSelector.select (selectors.py:468)",
    ]


def test_a_frame_whose_line_is_not_found_counts_as_running(tmp_path: Path) -> None:
    """Undecided is running: the summary never hides CPU as a wait."""
    path = _profile(tmp_path, [f"{WRITER};SQLiteThread._commit (gone.py:800) 5"])
    assert summary(path, source=_source).startswith(
        "5 samples (all threads py-spy saw active): 5 running, 0 waiting"
    )


def test_the_store_s_own_commits_and_job_queue_read_as_waits_from_its_source(
    tmp_path: Path,
) -> None:
    """The lines are read from this checkout: where the store commits and where its writer
    thread waits for a job today, a sample is a wait, and its statements' lines are running."""
    lines = inspect.getsource(sqlite_thread).splitlines()
    file = "thoughtgate/store/sqlite_thread.py"
    waits = [n for n, text in enumerate(lines, 1) if 'execute("COMMIT")' in text]
    waits += [n for n, text in enumerate(lines, 1) if text.strip() == "job = jobs.get()"]
    runs = [n for n, text in enumerate(lines, 1) if "job.fn(conn)" in text]
    assert len(waits) >= 3 and runs
    path = _profile(
        tmp_path,
        [f"{WRITER};SQLiteThread._x ({file}:{n}) 1" for n in waits]
        + [f"{WRITER};SQLiteThread._x ({file}:{n}) 1" for n in runs],
    )
    assert summary(path).startswith(
        f"{len(waits) + len(runs)} samples (all threads py-spy saw active): "
        f"{len(runs)} running, {len(waits)} waiting"
    )
