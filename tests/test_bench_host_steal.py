"""``bench.host_steal``: the share of a bench phase the host took away (steal), left idle, or
gave to other processes, read from two ``/proc/stat`` samples."""

from __future__ import annotations

from typing import Any

import pytest
from support.bench_modules import bench_module

pytestmark = pytest.mark.unit

host_steal = bench_module("host_steal")
Sample, parse_cpu, sample, share_text, since = (
    host_steal.Sample,
    host_steal.parse_cpu,
    host_steal.sample,
    host_steal.share_text,
    host_steal.since,
)

# user nice system idle iowait irq softirq steal guest guest_nice
BEFORE = """cpu  1000 0 200 5000 100 0 10 40 0 0
cpu0 500 0 100 2500 50 0 5 20 0 0
cpu1 500 0 100 2500 50 0 5 20 0 0
intr 123 0 0
ctxt 456
"""
AFTER = """cpu  1400 0 300 5300 120 0 20 100 50 0
cpu0 700 0 150 2650 60 0 10 50 25 0
cpu1 700 0 150 2650 60 0 10 50 25 0
intr 789 0 0
"""
# deltas: user 400, system 100, idle 300, iowait 20, softirq 10, steal 60 -> total 890


def _sampled(text: str, ours: int | None = 0) -> Any:
    return Sample(parse_cpu(text), ours)


def test_steal_is_steal_jiffies_over_all_jiffies_of_every_cpu() -> None:
    share = since(_sampled(BEFORE), _sampled(AFTER))
    assert share is not None
    assert share.total == 890  # guest (50) is already in user: not counted twice
    assert share.steal_pct == pytest.approx(100 * 60 / 890)
    assert share.idle_pct == pytest.approx(100 * 320 / 890)  # idle with iowait


def test_other_load_is_busy_time_outside_the_benchs_processes() -> None:
    share = since(_sampled(BEFORE, ours=1000), _sampled(AFTER, ours=1300))
    assert share is not None
    busy = 890 - 320 - 60
    assert share.other == busy - 300
    # a process the bench could not read: the other load is unknown, steal still known
    unknown = since(_sampled(BEFORE, ours=None), _sampled(AFTER, ours=1300))
    assert unknown is not None and unknown.other is None and unknown.steal == 60
    assert "other n/a" in share_text(unknown)


def test_a_kernel_without_a_steal_column_gives_no_steal_but_the_other_shares() -> None:
    old_kernel_before = "cpu  1000 0 200 5000 100 0 10\n"
    old_kernel_after = "cpu  1400 0 300 5300 120 0 20\n"
    share = since(_sampled(old_kernel_before), _sampled(old_kernel_after))
    assert share is not None
    assert share.steal is None and share.steal_pct is None
    assert share.idle_pct == pytest.approx(100 * 320 / 830)
    assert share_text(share).startswith("steal n/a, idle 38.6 %")


def test_no_cpu_line_or_an_unreadable_one_is_not_a_sample() -> None:
    assert parse_cpu("") is None
    assert parse_cpu("cpu0 1 2 3 4 5 6 7 8\nintr 1\n") is None  # per-CPU lines only
    assert parse_cpu("cpu  1 2 x 4 5 6 7 8\n") is None
    assert parse_cpu("cpu  1 2 3\n") is None  # too short to hold idle and iowait
    assert since(Sample(None, 0), _sampled(AFTER)) is None
    assert share_text(None) == "steal n/a"


def test_a_counter_that_went_backwards_or_no_time_passed_says_nothing() -> None:
    # the steal counter wrapped (or the VM's counters were reset): the interval is unknown
    wrapped = "cpu  1400 0 300 5300 120 0 20 5 0 0\n"
    assert since(_sampled(BEFORE), _sampled(wrapped)) is None
    assert since(_sampled(BEFORE), _sampled(BEFORE)) is None
    # iowait alone may step back on a tickless kernel (proc(5)): it counts as zero
    iowait_back = "cpu  1400 0 300 5300 90 0 20 100 0 0\n"
    share = since(_sampled(BEFORE), _sampled(iowait_back))
    assert share is not None and share.total == 870 and share.idle == 300


def test_a_rounds_share_pools_its_phases_jiffies() -> None:
    first = since(_sampled(BEFORE), _sampled(AFTER))
    second = since(_sampled(AFTER), _sampled("cpu  1500 0 300 5400 120 0 20 110 0 0\n"))
    assert first is not None and second is not None
    pooled = first + second
    assert pooled.total == 890 + 210
    assert pooled.steal_pct == pytest.approx(100 * 70 / 1100)  # not the mean of 6.7 % and 4.8 %


class _Absent:
    """A path whose file is not there, as ``/proc/stat`` and ``/proc/PID/stat`` off Linux."""

    def read_text(self) -> str:
        raise FileNotFoundError("/proc/stat")


def _no_process(pid: int) -> int:
    raise FileNotFoundError(f"/proc/{pid}/stat")


def test_sampling_without_proc_never_raises_and_reports_n_a(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(host_steal, "PROC_STAT", _Absent())
    monkeypatch.setattr(host_steal, "_process_jiffies", _no_process)
    absent = sample([1234])
    assert absent.cpu is None and absent.ours is None
    assert since(absent) is None
    assert share_text(since(absent)) == "steal n/a"


def test_a_runs_rows_give_the_median_and_the_worst_rounds_steal_in_percent() -> None:
    HostShare = host_steal.HostShare
    rounds = [
        HostShare(total=1000, steal=20, idle=100, other=0),
        HostShare(total=1000, steal=80, idle=300, other=50),
        None,  # a round whose counters could not be read
        HostShare(total=1000, steal=30, idle=200, other=None),
    ]
    rows = {row["name"]: row for row in host_steal.round_rows(rounds)}
    assert rows["host_steal_median"]["value"] == 3.0
    assert rows["host_steal_median"]["spread"] == [2.0, 8.0]
    assert rows["host_steal_max"]["value"] == 8.0
    assert rows["host_idle_median"]["value"] == 20.0
    assert rows["host_other_load_median"]["value"] == 2.5  # of the two rounds that know it
    assert all(row["unit"] == "%" and row["target"] is None for row in rows.values())
    # one round: its figure, without a spread; nothing readable: n/a
    (single,) = [r for r in host_steal.round_rows(rounds[:1]) if r["name"] == "host_steal_median"]
    assert single["value"] == 2.0 and "spread" not in single
    assert {r["value"] for r in host_steal.round_rows([None])} == {"n/a"}


def test_pooling_leaves_out_the_phases_that_could_not_be_read() -> None:
    HostShare = host_steal.HostShare
    a = HostShare(total=100, steal=10, idle=0, other=5)
    b = HostShare(total=300, steal=0, idle=30, other=None)
    both = host_steal.pooled([a, None, b])
    assert both == HostShare(total=400, steal=10, idle=30, other=None)
    assert host_steal.pooled([None, None]) is None


def test_a_bench_measured_in_one_piece_gets_one_steal_row() -> None:
    row = host_steal.run_row(host_steal.HostShare(total=400, steal=10, idle=0, other=None))
    assert row == {"name": "host_steal", "value": 2.5, "unit": "%", "target": None, "ok": None}
    assert host_steal.run_row(None)["value"] == "n/a"
