"""The host's share of the machine during a bench phase: CPU steal, idle time, other processes.

The bench runs on a shared two-core VM. When the host gives the VM's CPUs to someone else (steal:
``/proc/stat``'s eighth CPU column), every figure is slower. The time is not spent in
thoughtgate, and a reader cannot tell it from a regression unless it is written down beside
the figure. Over the rounds of ADR 0049 the added first byte at 10 concurrent runs tracked steal
with r = 0.92: median 3.4 ms under 3 % steal, 5.6 ms at 6 % or more (ADR 0048, 0050). So each phase
is bracketed by two :func:`sample` calls and :func:`since` returns what the CPUs did in between:

* ``steal``: steal jiffies over all jiffies, all CPUs together;
* ``idle``: idle and iowait jiffies over all jiffies (nobody wanted the CPU);
* ``other``: jiffies busy outside the bench's own processes (the ``pids`` given to
  :func:`sample`) over all jiffies: another helper's build or bench on the same VM.

Where ``/proc/stat`` is missing (not Linux) or has no steal column (kernels before 2.6.11), or a
counter went backwards between the samples, the share is ``None`` and prints as ``n/a``. The
bench never fails over it. The parsing and the arithmetic are pure and unit-tested
(``tests/test_bench_host_steal.py``).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "CpuTimes",
    "HostShare",
    "Sample",
    "parse_cpu",
    "pct",
    "pooled",
    "round_rows",
    "run_row",
    "sample",
    "share_text",
    "since",
]

PROC_STAT = Path("/proc/stat")
FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
"""The columns of the aggregate ``cpu`` line that add up to all CPU time; the two after them
(guest, guest_nice) are already counted in user and nice, so they are left out of the total."""
_STEAL = FIELDS.index("steal")
_IOWAIT = FIELDS.index("iowait")


@dataclasses.dataclass(frozen=True)
class CpuTimes:
    """The aggregate ``cpu`` line of ``/proc/stat``: jiffies per column since boot, all CPUs
    together, in :data:`FIELDS` order (shorter when the kernel has no steal column)."""

    jiffies: tuple[int, ...]

    @property
    def has_steal(self) -> bool:
        return len(self.jiffies) > _STEAL


@dataclasses.dataclass(frozen=True)
class Sample:
    """What :func:`sample` read: the machine's CPU times (``None`` where unreadable) and the
    CPU jiffies of the bench's own processes ``pids`` (``None`` when one could not be read)."""

    cpu: CpuTimes | None
    ours: int | None
    pids: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class HostShare:
    """Jiffies spent in an interval, all CPUs: ``total``, and of it ``steal``, ``idle`` (with
    iowait) and ``other`` (busy outside the bench's processes); a part is ``None`` when unknown.
    Intervals add up (:meth:`__add__`), so a round's share pools its phases' jiffies."""

    total: int
    steal: int | None
    idle: int
    other: int | None

    def __add__(self, more: HostShare) -> HostShare:
        def both(a: int | None, b: int | None) -> int | None:
            return None if a is None or b is None else a + b

        return HostShare(
            self.total + more.total,
            both(self.steal, more.steal),
            self.idle + more.idle,
            both(self.other, more.other),
        )

    @property
    def steal_pct(self) -> float | None:
        return pct(self.steal, self.total)

    @property
    def idle_pct(self) -> float | None:
        return pct(self.idle, self.total)

    @property
    def other_pct(self) -> float | None:
        return pct(self.other, self.total)


def pct(part: int | None, total: int) -> float | None:
    """``part`` as a percentage of ``total``; ``None`` when either tells nothing."""
    if part is None or total <= 0:
        return None
    return 100.0 * part / total


def parse_cpu(text: str) -> CpuTimes | None:
    """The aggregate ``cpu`` line of a ``/proc/stat`` text; ``None`` without one."""
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if name != "cpu":
            continue
        try:
            values = tuple(int(v) for v in rest.split()[: len(FIELDS)])
        except ValueError:
            return None
        return CpuTimes(values) if len(values) > _IOWAIT else None
    return None


def _process_jiffies(pid: int) -> int:
    """A process's user + system jiffies (all its threads), from ``/proc/PID/stat``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def sample(pids: Iterable[int] = ()) -> Sample:
    """Read the machine's CPU times and the CPU jiffies of ``pids`` (the bench's own processes:
    what is busy outside them is another's load). Never raises: what cannot be read is ``None``."""
    pids = tuple(pids)
    try:
        cpu = parse_cpu(PROC_STAT.read_text())
    except OSError:
        cpu = None
    try:
        ours: int | None = sum(_process_jiffies(pid) for pid in pids)
    except (OSError, IndexError, ValueError):
        ours = None
    return Sample(cpu, ours, pids)


def since(before: Sample, after: Sample | None = None) -> HostShare | None:
    """What the CPUs did between ``before`` and ``after`` (default: a sample taken now, of the
    same processes).

    ``None`` when either sample has no CPU times, no time passed, or a counter went backwards
    (a reset or a wrapped counter says nothing about the interval); iowait alone may go
    backwards on a tickless kernel (proc(5)) and counts as zero then."""
    if after is None:
        after = sample(before.pids)
    if before.cpu is None or after.cpu is None:
        return None
    old, new = before.cpu.jiffies, after.cpu.jiffies
    columns = min(len(old), len(new))
    deltas = [new[i] - old[i] for i in range(columns)]
    deltas[_IOWAIT] = max(0, deltas[_IOWAIT])
    if any(d < 0 for d in deltas):
        return None
    total = sum(deltas)
    if total <= 0:
        return None
    steal = deltas[_STEAL] if columns > _STEAL else None
    idle = deltas[FIELDS.index("idle")] + deltas[_IOWAIT]
    other = None
    if before.ours is not None and after.ours is not None:
        busy = total - idle - (steal or 0)
        other = max(0, busy - max(0, after.ours - before.ours))
    return HostShare(total, steal, idle, other)


def share_text(share: HostShare | None) -> str:
    """``"steal 3.1 %, idle 41 %, other 2.0 %"``; ``n/a`` for what is unknown."""

    def show(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.1f} %"

    if share is None:
        return "steal n/a"
    return (
        f"steal {show(share.steal_pct)}, idle {show(share.idle_pct)}, other {show(share.other_pct)}"
    )


def pooled(shares: Iterable[HostShare | None]) -> HostShare | None:
    """The phases' shares added up (a round's share: its phases' jiffies pooled, so a long phase
    weighs more than a short one); phases that could not be read are left out; ``None`` when
    none could."""
    known = [share for share in shares if share is not None]
    if not known:
        return None
    total = known[0]
    for share in known[1:]:
        total += share
    return total


def round_rows(rounds: Sequence[HostShare | None]) -> list[dict[str, Any]]:
    """Bench rows (``bench.run``'s shape: unit ``%``, no target) for a run's rounds: the median
    and the greatest round's steal, the median idle share and the median other load; ``n/a``
    for a figure no round could read. The medians carry the rounds' ``spread`` as the daemon's
    figures do (ADR 0049)."""

    def row(name: str, values: list[float], how: str) -> dict[str, Any]:
        if not values:
            return _row(name, None)
        if how == "max":
            return _row(name, max(values))
        out = _row(name, statistics.median(values))
        if len(values) > 1:
            out |= {"spread": [round(min(values), 2), round(max(values), 2)], "rounds": len(values)}
        return out

    def known(values: Iterable[float | None]) -> list[float]:
        return [v for v in values if v is not None]

    steal = known(share.steal_pct for share in rounds if share is not None)
    idle = known(share.idle_pct for share in rounds if share is not None)
    other = known(share.other_pct for share in rounds if share is not None)
    return [
        row("host_steal_median", steal, "median"),
        row("host_steal_max", steal, "max"),
        row("host_idle_median", idle, "median"),
        row("host_other_load_median", other, "median"),
    ]


def run_row(share: HostShare | None) -> dict[str, Any]:
    """The ``host_steal`` row of a bench measured in one piece: its whole run's steal."""
    return _row("host_steal", None if share is None else share.steal_pct)


def _row(name: str, value: float | None) -> dict[str, Any]:
    shown = "n/a" if value is None else round(value, 2)
    return {"name": name, "value": shown, "unit": "%", "target": None, "ok": None}
