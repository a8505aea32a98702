"""``bench.repetitions``: a bench figure is the median of its rounds, with their spread."""

from __future__ import annotations

import pytest
from support.bench_modules import bench_module

pytestmark = pytest.mark.unit

repetitions = bench_module("repetitions")
judge, median_rows, spread_text = (
    repetitions.judge,
    repetitions.median_rows,
    repetitions.spread_text,
)


def _row(name: str, value: float, **extra: object) -> dict[str, object]:
    return {"name": name, "value": value, "unit": "ms", "target": None, "ok": None, **extra}


def test_each_figure_is_the_median_of_its_rounds_with_their_least_and_greatest() -> None:
    rounds = [
        [_row("ttfb_p50", 3.4), _row("runs_per_s", 137.0)],
        [_row("ttfb_p50", 8.4), _row("runs_per_s", 121.0)],
        [_row("ttfb_p50", 3.0), _row("runs_per_s", 142.0)],
    ]
    rows = median_rows(rounds)
    assert [r["name"] for r in rows] == ["ttfb_p50", "runs_per_s"]
    assert [r["value"] for r in rows] == [3.4, 137.0]
    assert [r["spread"] for r in rows] == [[3.0, 8.4], [121.0, 142.0]]
    assert all(r["rounds"] == 3 for r in rows)
    assert spread_text(rows[0]) == "3–8.4"


def test_an_even_number_of_rounds_takes_the_mean_of_the_middle_two() -> None:
    rows = median_rows([[_row("x", v)] for v in (4.0, 1.0, 10.0, 2.0)])
    assert rows[0]["value"] == 3.0
    assert rows[0]["spread"] == [1.0, 10.0]


def test_the_verdict_is_judged_again_on_the_median_not_kept_from_the_first_round() -> None:
    lower = [_row("ttfb", v, target=5.0, higher=False, ok=v <= 5.0) for v in (9.0, 4.0, 3.0)]
    assert median_rows([[r] for r in lower])[0]["ok"] is True
    higher = [_row("rps", v, target=100.0, higher=True, ok=v >= 100.0) for v in (120.0, 90, 80)]
    assert median_rows([[r] for r in higher])[0]["ok"] is False
    assert judge(_row("none", 1.0, ok=True))["ok"] is None


def test_a_figure_missing_from_one_round_is_an_error_not_a_median_of_fewer_rounds() -> None:
    with pytest.raises(ValueError, match="round 2 differs"):
        median_rows([[_row("a", 1.0), _row("b", 2.0)], [_row("a", 1.0)]])
    with pytest.raises(ValueError, match="reported twice"):
        median_rows([[_row("a", 1.0), _row("a", 2.0)]])


def test_a_figure_measured_once_shows_no_spread() -> None:
    (row,) = median_rows([[_row("a", 1.5)]])
    assert row["value"] == 1.5 and spread_text(row) == ""
    assert spread_text(_row("plain", 1.0)) == ""
