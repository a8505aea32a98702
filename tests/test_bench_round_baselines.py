"""``bench.daemon_bench``: the in-process baselines are measured in every round, beside the
server whose phases they divide, and each ``_vs_in_process`` ratio is the median of the rounds'
ratios, both sides from the same round (ADR 0116)."""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
from support.bench_modules import bench_package_module

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def daemon_bench() -> Iterator[ModuleType]:
    with bench_package_module("daemon_bench") as module:
        yield module


def _phase(daemon_bench: ModuleType, per_delta_us: float, runs: int = 100) -> tuple[Any, float]:
    """A phase of ``runs`` runs whose server CPU came to ``per_delta_us`` µs a provider delta."""
    stats = {
        "runs": runs,
        "elapsed": 1.0,
        "added": [0.003],
        "client": [0.004],
        "from_slot": [],
        "events": runs * 50,
    }
    return stats, per_delta_us * runs * daemon_bench.PROVIDER_DELTAS / 1e6


def _by_name(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {row["name"]: row for row in rows}


def test_each_servers_baseline_runs_beside_it_before_in_odd_rounds_after_in_even(
    daemon_bench: ModuleType,
) -> None:
    before = [
        (daemon_bench.IN_PROCESS, False),
        (daemon_bench.SERVER, False),
        (daemon_bench.IN_PROCESS, True),
        (daemon_bench.SERVER, True),
    ]
    after = [
        (daemon_bench.SERVER, False),
        (daemon_bench.IN_PROCESS, False),
        (daemon_bench.SERVER, True),
        (daemon_bench.IN_PROCESS, True),
    ]
    assert daemon_bench._round_steps(1, [False, True]) == before
    assert daemon_bench._round_steps(2, [False, True]) == after
    assert daemon_bench._round_steps(3, [False, True]) == before
    assert daemon_bench._round_steps(2, [False]) == after[:2]


def test_the_ratio_is_the_median_of_the_rounds_ratios_each_over_its_own_rounds_baseline(
    daemon_bench: ModuleType,
) -> None:
    """Daemon 100 / 200 / 150 µs a delta over baselines 50 / 200 / 60 of the same rounds: ratios
    2.0 / 1.0 / 2.5, median 2.0 (met). Dividing the daemon's median by one baseline for every
    round would give 150 / 60 = 2.5 with the baselines' median, 3.0 with their least (missed)."""
    fake = daemon_bench.FAKE_MODEL
    rounds = [
        daemon_bench._round_rows(
            {("", fake): {10: _phase(daemon_bench, daemon)}}, {(fake, False): baseline}
        )
        for daemon, baseline in ((100.0, 50.0), (200.0, 200.0), (150.0, 60.0))
    ]
    rows = _by_name(daemon_bench.median_rows(rounds))
    ratio = rows["cpu_per_delta_vs_in_process_c10"]
    assert ratio["value"] == 2.0 and ratio["spread"] == [1.0, 2.5]
    assert ratio["target"] == daemon_bench.IN_PROCESS_RATIO and ratio["ok"] is True
    base = rows["in_process_cpu_per_delta"]
    assert base["value"] == 60.0 and base["spread"] == [50.0, 200.0] and base["rounds"] == 3
    assert rows["cpu_per_delta_c10"]["value"] == 150.0


def test_the_durable_daemon_is_divided_by_the_durable_baseline_of_its_round(
    daemon_bench: ModuleType,
) -> None:
    fake, durable = daemon_bench.FAKE_MODEL, daemon_bench.DURABLE
    phases = {
        ("", fake): {100: _phase(daemon_bench, 120.0, runs=300)},
        (durable, fake): {100: _phase(daemon_bench, 160.0, runs=300)},
    }
    rows = _by_name(daemon_bench._round_rows(phases, {(fake, False): 60.0, (fake, True): 80.0}))
    assert rows["cpu_per_delta_vs_in_process_c100"]["value"] == 2.0
    assert rows[f"{durable}cpu_per_delta_vs_in_process_c100"]["value"] == 2.0
    assert rows[f"{durable}in_process_cpu_per_delta"]["value"] == 80.0
    assert rows["in_process_cpu_per_delta"]["value"] == 60.0
    assert rows[f"{durable}cpu_per_delta_vs_fake_c100"]["value"] == pytest.approx(1.333, abs=1e-3)
