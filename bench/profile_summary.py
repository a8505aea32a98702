"""Sampling profiles of the bench server (py-spy), and a short text summary of one.

``record(pid, out)`` attaches ``py-spy record`` (the ``bench`` extra) to a running process and
returns a stopper; the samples are on-CPU stacks of every thread, in py-spy's ``raw`` (collapsed)
format: one ``frame;frame;frame count`` line per distinct stack. ``summary(path)`` says where the
samples went: by area (a package or a thoughtgate module, counted once per sample, inclusive) and
by the function that was on the CPU (self). Run ``python -m bench.profile_summary FILE`` to print
one; ``docs/benchmarks.md`` keeps the summaries that explain a change.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

__all__ = ["record", "summary"]

_EVERYWHERE = frozenset({"runpy", "bench", "asyncio", "threading", "concurrent", "contextlib"})
_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^:()]+?)(?::\d+)?\)$")


def record(pid: int, out: Path, *, rate: int = 250) -> Callable[[], None] | None:
    """Start sampling ``pid`` into ``out``; call the result to stop. ``None`` without py-spy."""
    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(exe).exists():
        print("profile: py-spy is not installed (pip install -e '.[bench]'); no profile")
        return None
    proc = subprocess.Popen(
        [
            *(exe, "record", "--pid", str(pid), "--rate", str(rate), "--format", "raw"),
            *("--nonblocking", "--output", str(out)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )

    def stop() -> None:
        proc.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        if not out.exists():
            print(f"profile: py-spy wrote nothing: {err.decode(errors='replace')[-500:]}")

    return stop


def _area(file: str) -> str:
    """``thoughtgate/server/sse.py`` -> ``thoughtgate.server.sse``; else the top package."""
    file = file.strip("<>").removeprefix("frozen ")
    if file.startswith("thoughtgate/"):
        return file.removesuffix(".py").replace("/", ".")
    return file.split("/")[0].removesuffix(".py")


def _frames(stack: str) -> list[tuple[str, str]]:
    out = []
    for frame in stack.split(";"):
        found = _FRAME.match(frame.strip())
        if found:
            out.append((found["func"], found["file"]))
    return out


def summary(path: Path, *, top: int = 14) -> str:
    """Where the samples of one raw profile went, as lines of text.

    * self, by area: the package (or thoughtgate module) of the frame on the CPU;
    * inclusive, by area: samples with that area anywhere on the stack (the event loop, threads
      and the entry point, on every stack, left out);
    * self, by function: the hottest frames.
    """
    total = 0
    by_area: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    by_function: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = _frames(stack) if count.isdigit() else []
        if not frames:
            continue
        n = int(count)
        total += n
        for area in {_area(file) for _, file in frames} - _EVERYWHERE:
            inclusive[area] += n
        func, file = frames[-1]
        by_area[_area(file)] += n
        by_function[f"{func} ({_area(file)})"] += n
    if not total:
        return "no samples"

    def block(title: str, counts: Counter[str]) -> list[str]:
        rows = [f"  {100 * n / total:5.1f}%  {name}" for name, n in counts.most_common(top)]
        return [title, *rows]

    return "\n".join(
        [
            f"{total} samples (on-CPU, all threads)",
            *block("self, by area:", by_area),
            *block("inclusive, by area:", inclusive),
            *block("self, by function:", by_function),
        ]
    )


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        for name in sys.argv[1:]:
            print(f"== {name}\n{summary(Path(name))}")
