"""One figure from a bench's rounds: the median of the rounds' figures, with their spread.

On a shared two-core machine the same phase of the same code moves 2-4x between minutes (ADR
0042, 0049), so a single sample decides "met" or "missed" by which minute it fell on.
``bench.daemon_bench`` therefore measures every phase in several rounds, interleaved with what it
is compared to, and publishes for each figure the median of the rounds' values -- for a p50 the
median of the rounds' p50s, for a rate the median of the rounds' rates -- with the least and the
greatest beside it, so a reader sees how far one round could have moved the verdict.

The rounds' figures are combined, not their samples: pooling every run's first byte into one
percentile would let a slow round's many samples outvote two good rounds, which is the bias the
rounds are there to remove. Pure logic, no I/O, unit-tested (``tests/test_bench_repetitions.py``).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

__all__ = ["info_verdict", "judge", "median_rows", "spread_text"]


def judge(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with ``ok`` set from its ``value``, ``target`` and ``higher`` (higher is better);
    ``None`` without a target."""
    target = row.get("target")
    if target is None:
        return {**row, "ok": None}
    value = row["value"]
    return {**row, "ok": value >= target if row.get("higher") else value <= target}


def info_verdict(row: dict[str, Any]) -> str:
    """Where a figure set beside a target as information, not judged by it (``info_target``,
    ``info_ok``; ``target`` ``None``), stands: the fake provider's first byte measured from its
    slot, the way the adapters' and LiteLLM's are (ADR 0113), whose target the planners choose."""
    within = "within" if row["info_ok"] else "over"
    return f"information: {within} the target, measured the adapters' way"


def median_rows(rounds: Sequence[Sequence[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per figure, in the first round's order: ``value`` the median of the rounds'
    values, ``spread`` their ``[least, greatest]``, ``rounds`` how many; the other keys (unit,
    target, ...) from the first round, and ``ok`` judged again on the median. A baseline too is
    measured in every round (ADR 0116), so no row is exempt.

    Every round must report the same figures: a figure missing from one round would be the
    median of fewer rounds than the others, silently, so it raises instead."""
    if not rounds:
        return []
    names = [row["name"] for row in rounds[0]]
    if len(set(names)) != len(names):
        raise ValueError(f"a figure is reported twice in one round: {sorted(names)}")
    values: dict[str, list[float]] = {name: [] for name in names}
    for number, rows in enumerate(rounds, 1):
        got = {row["name"]: float(row["value"]) for row in rows}
        if got.keys() != values.keys() or len(rows) != len(names):
            missing = sorted(values.keys() - got.keys())
            extra = sorted(got.keys() - values.keys())
            raise ValueError(
                f"round {number} differs from round 1: missing {missing}, extra {extra}"
            )
        for name, value in got.items():
            values[name].append(value)
    out = []
    for row in rounds[0]:
        seen = values[row["name"]]
        out.append(
            judge(
                {
                    **row,
                    "value": round(statistics.median(seen), 3),
                    "spread": [round(min(seen), 3), round(max(seen), 3)],
                    "rounds": len(seen),
                }
            )
        )
    return out


def spread_text(row: dict[str, Any]) -> str:
    """``"3.012–8.4"``: the least and greatest of a row's rounds, to four significant digits;
    ``""`` for a row measured once (or not in rounds)."""
    spread = row.get("spread")
    if not spread or row.get("rounds", 1) < 2:
        return ""
    low, high = spread
    return f"{low:.4g}–{high:.4g}"
