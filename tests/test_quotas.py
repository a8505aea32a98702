"""Per-key quotas on ``POST /v1/runs``: one key cannot starve the others.

With the defaults (``quotas.max_open_runs_per_key = 300``), the 301st run of one key that has not
ended is refused with 429 and a ``Retry-After``, and nothing is recorded for it, while another key
still starts runs. Starts per minute have their own limit, whose ``Retry-After`` says when the
oldest start leaves the window.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support.daemon import running_daemon
from support.durable import HOLD

from thoughtgate.config import Config

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def hold(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "hold"
    path.touch()
    os.environ[HOLD] = str(path)
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)
        del os.environ[HOLD]


def _start(client: httpx.Client) -> httpx.Response:
    return client.post("/v1/runs", json={"prompt": "wait", "model": "fake:waiting"})


def test_the_301st_open_run_of_one_key_is_429_while_another_key_still_starts_runs(
    hold: Path,
) -> None:
    with (
        running_daemon(config=Config()) as daemon,
        daemon.client("member") as busy,
        daemon.client("developer") as other,
    ):
        for i in range(300):
            r = _start(busy)
            assert r.status_code == 202, f"run {i + 1}: {r.text}"
        refused = _start(busy)
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["code"] == "too_many_requests"
        assert "300" in refused.json()["error"]["message"]
        assert int(refused.headers["Retry-After"]) >= 1
        assert len(busy.get("/v1/runs", params={"limit": 500}).json()["runs"]) == 300, (
            "a refused run is not recorded"
        )
        assert _start(other).status_code == 202, "another key is not starved"
        hold.unlink()  # let them all finish
        first = busy.get("/v1/runs", params={"limit": 500}).json()["runs"][-1]["run_id"]
        daemon.wait_done(first, timeout=60)


def test_starts_per_minute_are_limited_with_a_retry_after(hold: Path) -> None:
    config = Config.from_mapping({"quotas": {"max_starts_per_minute_per_key": 3}})
    hold.unlink()
    with running_daemon(config=config) as daemon, daemon.client("member") as c:
        for _ in range(3):
            assert _start(c).status_code == 202
        refused = _start(c)
        assert refused.status_code == 429
        assert 1 <= int(refused.headers["Retry-After"]) <= 60
        assert "in the last minute" in refused.json()["error"]["message"]
