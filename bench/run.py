"""``make bench``: run every benchmark module, write ``docs/benchmarks.md`` and PNG plots.

Each module in ``MODULES`` has ``main() -> list[dict]``. A row is
``{"name", "value", "unit", "target", "ok"}`` (``target``/``ok`` may be ``None`` when a figure has
no target; a figure measured in several rounds adds ``"spread": [least, greatest]`` and
``"rounds"``, shown in the table's spread column; a figure set beside a target as information,
not judged by it, has ``"info_target"`` and ``"info_ok"`` and ``target`` ``None``: the fake
provider's first byte measured from its slot, ADR 0113); a row with a ``"series"`` key instead
feeds a plot:
``{"series": PLOT_ID, "label", "points": [[x, y], ...], "xlabel", "ylabel", "title"}``.
Ratios are always measured against a baseline taken in the same run, because this machine is
shared and noisy; absolute times are printed for context only. A module may also define
``NOTES`` (a list of sentences) for the page's notes section. A module that publishes no
``host_steal…`` row of its own gets a ``host_steal`` row for its whole run (the share of CPU time
the host took from this VM meanwhile, :mod:`bench.host_steal`, ADR 0050). Everything from the
:data:`KEPT` marker on in the existing page (profile summaries and the like) is kept below the
new figures.
"""

from __future__ import annotations

import importlib
import os
import platform
import sys
import time
import traceback
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench.environment import REPO
from bench.host_steal import run_row, sample, since
from bench.repetitions import info_verdict

MODULES = (
    "bench.capture_bench",
    "bench.run_bench",
    "bench.store_bench",
    "bench.list_bench",
    "bench.daemon_bench",
    "bench.fanout_bench",
    "bench.telemetry_bench",
    "bench.durable_bench",
    "bench.idle_bench",
)
DOCS = REPO / "docs"
BUDGET_S = 15 * 60
KEPT = "<!-- Written by hand: make bench keeps everything from this line on. -->"
"""Where ``docs/benchmarks.md`` stops being generated (profile summaries, notes on a change)."""


def _kept(page: Path) -> list[str]:
    """The page's hand-written tail, from :data:`KEPT` on, to put back after the figures."""
    text = page.read_text() if page.exists() else ""
    start = text.find(KEPT)
    return [] if start < 0 else ["", text[start:].rstrip("\n")]


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def _spread(spread: list[float] | None) -> str:
    """A figure's least–greatest over its rounds (``"3.01–8.4"``); ``–`` for a single value."""
    if not spread:
        return "–"
    low, high = spread
    return f"{_fmt(float(low))}–{_fmt(float(high))}"


def _plot(series: list[dict[str, Any]]) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plots (pip install -e '.[bench]')")
        return []
    by_plot: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for s in series:
        by_plot[s["series"]].append(s)
    written = []
    for plot_id, lines in by_plot.items():
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for line in lines:
            xs = [p[0] for p in line["points"]]
            ys = [p[1] for p in line["points"]]
            ax.plot(xs, ys, marker="o", label=line["label"])
        ax.set_xlabel(lines[0].get("xlabel", ""))
        ax.set_ylabel(lines[0].get("ylabel", ""))
        ax.set_title(lines[0].get("title", plot_id))
        if lines[0].get("logx"):
            ax.set_xscale("log")
        if lines[0].get("logy"):
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend()
        name = f"bench-{plot_id}.png"
        fig.tight_layout()
        fig.savefig(DOCS / name, dpi=110)
        plt.close(fig)
        written.append(name)
    return written


def main() -> int:
    started = time.monotonic()
    rows: list[dict[str, Any]] = []
    series: list[dict[str, Any]] = []
    notes: list[str] = []
    failures: list[str] = []
    for name in MODULES:
        if time.monotonic() - started > BUDGET_S:
            failures.append(f"{name}: skipped, the 15-minute budget is used up")
            continue
        print(f"== {name}", flush=True)
        t0 = time.monotonic()
        host = sample()
        try:
            module = importlib.import_module(name)
            results = module.main()
        except ModuleNotFoundError as exc:
            failures.append(f"{name}: not available ({exc})")
            continue
        except Exception:  # noqa: BLE001 - one broken benchmark must not hide the others
            failures.append(f"{name}: failed\n{traceback.format_exc()}")
            continue
        if not any(r.get("name", "").startswith("host_steal") for r in results):
            # the module's whole run, for a bench without its own per-round figure (ADR 0050)
            results = [*results, run_row(since(host))]
        for r in results:
            (series if "series" in r else rows).append({**r, "module": name})
        notes += [f"{name.removeprefix('bench.')}: {n}" for n in getattr(module, "NOTES", [])]
        print(f"   {name} took {time.monotonic() - t0:.1f} s", flush=True)
    plots = _plot(series)
    missed = [r for r in rows if r.get("ok") is False]
    lines = [
        "# Benchmarks",
        "",
        f"Written by `make bench` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
        f"took {time.monotonic() - started:.0f} s. Ratios are against baselines measured in the "
        "same run. Each value is what its module reports: capture = least CPU time of 7 runs, "
        "store = the median of 5 rounds, each on fresh databases (ADR 0080), list = median of 15 "
        "calls, fan-out = p50 (the median) and p99 "
        "over every delivery, daemon = the median of its rounds' figures (three rounds, "
        "LiteLLM's phases alternating with thoughtgate's; a round's p50 and p99 are over every "
        "request of its phase); the spread column gives the least and greatest round (ADR 0049).",
        "",
        "The host_ rows say how busy the shared VM was while a module measured: host_steal is "
        "the share of all CPU time the host took away from this VM (/proc/stat's steal column, "
        "all CPUs; over each other module's whole run, for the daemon per round: its rounds' "
        "median and the greatest), the daemon's host_idle_median the share no one used and "
        "host_other_load_median the share busy outside the bench's own processes. A "
        "figure taken under high steal or other load is slower for it, not a regression: "
        "the daemon's added first byte at c10 tracks steal with r = 0.92 (3.4 ms under 3 % "
        "steal, 5.6 ms at 6 % or more; ADR 0048, 0050), so compare figures taken under similar "
        "steal. n/a: not measurable here (no /proc/stat or no steal column).",
        "",
        "| benchmark | figure | value | spread | unit | target | meets target |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ok = {True: "yes", False: "**no**", None: "–"}[r.get("ok")]
        target = r.get("target") or "–"
        if "info_target" in r:
            target, ok = f"({r['info_target']})", info_verdict(r)
        spread = r.get("spread") if r.get("rounds", 1) > 1 else None
        lines.append(
            f"| {r['module'].removeprefix('bench.')} | {r['name']} | {_fmt(r['value'])} | "
            f"{_spread(spread)} | {r.get('unit', '')} | {target} | {ok} |"
        )
    if plots:
        lines += ["", "## Plots", ""] + [f"![{p}]({p})" for p in plots]
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    if missed:
        lines += ["", "## Figures that miss their targets", ""]
        lines += [
            f"- {r['name']}: {_fmt(r['value'])} {r.get('unit', '')} (target {r['target']})"
            for r in missed
        ]
    informed = [r for r in rows if "info_target" in r]
    if informed:
        lines += [
            "",
            "## The fake provider's first byte measured the adapters' way (information)",
            "",
            "From its first delta's slot rather than its stamp, so the daemon's wake-up for that "
            "delta is counted as it is for the adapters and LiteLLM (ADR 0110, 0113). Set beside "
            "the target of the same level, not judged by it: which figure the target judges is "
            "the planners' call.",
            "",
        ]
        lines += [
            f"- {r['name']}: {_fmt(r['value'])} {r.get('unit', '')}, target "
            f"{r['info_target']}; {info_verdict(r)}"
            for r in informed
        ]
    if failures:
        lines += ["", "## Benchmarks that did not run", ""] + [
            f"- {f.splitlines()[0]}" for f in failures
        ]
    lines += _kept(DOCS / "benchmarks.md")
    (DOCS / "benchmarks.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    for f in failures:
        print(f, file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
