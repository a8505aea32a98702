"""``bench.daemon_bench``: the fake provider's first byte measured the adapters' way, from its
first delta's slot (ADR 0113), beside the figure from its stamp, which stays what the target
judges."""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.bench_modules import bench_package_module

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def daemon_bench() -> Iterator[ModuleType]:
    with bench_package_module("daemon_bench") as module:
        yield module


def test_a_stamp_late_to_its_slot_adds_its_lateness(daemon_bench: ModuleType) -> None:
    assert daemon_bench.from_slot_s("T12.3480 S12.3450", 0.0100) == pytest.approx(0.0130)


def test_slot_and_stamp_either_side_of_the_clocks_100_s_wrap(daemon_bench: ModuleType) -> None:
    # a plain difference would make the stamp 99,997 ms early: the lateness is 3 ms
    assert daemon_bench.from_slot_s("T00.0020 S99.9990", 0.0100) == pytest.approx(0.0130)


def test_a_stamp_taken_before_its_slot_counts_from_the_stamp(daemon_bench: ModuleType) -> None:
    """A timer that fired early (or two roundings of 0.1 ms): the provider really emitted at the
    stamp, so nothing of the daemon's time is left out by counting from it."""
    assert daemon_bench.from_slot_s("T12.3449 S12.3450", 0.0100) == pytest.approx(0.0100)
    assert daemon_bench.from_slot_s("T99.9990 S00.0020", 0.0100) == pytest.approx(0.0100)


def test_a_time_within_50_us_of_the_wrap_is_written_as_the_cycles_start(
    daemon_bench: ModuleType,
) -> None:
    """A stamp or slot within 50 µs of the end of the clock's 100 s cycle is written as the next
    cycle's start, in 7 characters a reader's pattern takes (``100.0000`` lost the run's figure)."""
    assert daemon_bench.written(2499.999999999998) == "00.0000"
    assert daemon_bench.from_slot_s(daemon_bench.slotted("T00.0001", 2499.999999999998), 0.0) == (
        pytest.approx(0.0001)
    )


def test_an_adapters_delta_has_no_slot(daemon_bench: ModuleType) -> None:
    assert daemon_bench.from_slot_s("T12.3456", 0.0100) is None


@given(
    due=st.floats(min_value=0, max_value=10_000, allow_nan=False),
    late_ms=st.floats(min_value=0, max_value=20_000),
)
def test_the_fakes_first_delta_gives_back_its_lateness_to_within_its_rounding(
    daemon_bench: ModuleType, due: float, late_ms: float
) -> None:
    """What ``_bench_script`` writes, read back: the lateness to within the two stamps' rounding
    to 0.1 ms, wherever slot and stamp fall on the clock's 100 s cycle."""
    sent = f"T{daemon_bench.written(due + late_ms / 1000)}"
    text = daemon_bench.slotted(sent, due)
    from_slot = daemon_bench.from_slot_s(text, 0.0)
    assert from_slot is not None
    assert from_slot * 1000 == pytest.approx(late_ms, abs=0.1 + 1e-6)


def test_the_bench_scripts_first_delta_carries_its_stamp_and_its_slot(
    daemon_bench: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The script's first delta, its schedule 7 ms behind (as if the daemon's loop had woken it
    7 ms after its slot): the client reads 7 ms more from the slot than from the stamp."""

    class Behind:
        def __init__(self, first: float, gap: float) -> None:
            self.due = daemon_bench.time.monotonic() - 0.007

        async def next(self) -> None:
            return None

    monkeypatch.setattr(daemon_bench, "Pace", Behind)
    first = daemon_bench._bench_script(None, 0).__anext__()
    with pytest.raises(StopIteration) as done:  # no real wait: ``next`` returns at once
        first.send(None)
    delta: Any = done.value.value
    from_slot = daemon_bench.from_slot_s(delta.text, 0.0100)
    assert from_slot is not None
    assert (from_slot - 0.0100) * 1000 == pytest.approx(7.0, abs=0.2)


def test_the_from_slot_figure_stands_beside_the_target_as_information_only(
    daemon_bench: ModuleType,
) -> None:
    """The fake provider's p50 from its stamp keeps the target and its verdict; the p50 from its
    slot is printed beside it with the same target, marked as information, never "missed"."""
    stats = {
        "runs": 4,
        "elapsed": 1.0,
        "added": [0.001, 0.002, 0.003, 0.005],
        "from_slot": [0.020, 0.030, 0.040, 0.050],
        "client": [0.01] * 4,
        "events": 160,
    }
    rows = daemon_bench._phase_rows("", 10, stats, 0.1, full=False)
    assert [r["name"] for r in rows[:2]] == ["ttfb_added_p50_c10", "ttfb_added_from_slot_p50_c10"]
    judged = [daemon_bench._with_goal(r, None) for r in rows[:2]]  # the reference: 66 ms at c10
    assert judged[0]["target"] == 3.3 and judged[0]["ok"] is True
    assert judged[1]["value"] == 40.0
    assert judged[1]["target"] is None and judged[1]["ok"] is None
    assert judged[1]["info_target"] == 3.3
    assert daemon_bench.info_verdict(judged[1]) == (
        "information: over the target, measured the adapters' way"
    )


def test_an_adapters_phase_has_no_from_slot_figure(daemon_bench: ModuleType) -> None:
    stats = {
        "runs": 2,
        "elapsed": 1.0,
        "added": [0.002, 0.003],
        "from_slot": [],
        "client": [0.01] * 2,
        "events": 80,
    }
    rows = daemon_bench._phase_rows("chat_", 10, stats, 0.1, full=False)
    assert not any("from_slot" in r["name"] for r in rows)
