"""Sampling profiles of the bench server (py-spy), and a short text summary of one.

``record(pid, out)`` attaches ``py-spy record`` (the ``bench`` extra) to a running process and
returns a stopper; the samples are stacks of every thread py-spy saw active, in its ``raw``
(collapsed) format: one ``frame;frame;frame count`` line per distinct stack. ``summary(path)``
says where the samples went: by area (a package or a thoughtgate module, counted once per sample,
inclusive) and by the function that was on the CPU (self). Run ``python -m bench.profile_summary
FILE`` to print one; ``docs/benchmarks.md`` keeps the summaries that explain a change.

"Active" is not "on the CPU". py-spy counts a thread blocked on the disk as active (the SQLite
writer thread in a ``COMMIT``'s fsync: a writer measured at 0.16 s of CPU had 1.75 s of samples,
0.22 s of them running once its waits were told apart), and without pausing the process
(``--nonblocking``, which the bench needs) it also catches threads just back from a wait (the
event loop's ``select``).
Native frames would show the syscall, but py-spy takes them only by pausing the process. So the
summary sorts each sample by its top Python frame: **waiting** when that frame is a wait -- a line
of it that runs a statement SQLite blocks in (``COMMIT`` or a checkpoint: the fsync;
``BEGIN IMMEDIATE``: the write lock), a queue's ``get()``, or the standard library's own waits
(``select``, a thread's ``wait`` or ``join``) -- and **running** otherwise; the breakdowns count
running samples only, and the waits are listed apart. The lines are read from the source on this
machine: summarise a profile from the checkout that recorded it.
"""

from __future__ import annotations

import contextlib
import linecache
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
_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^:()]+?)(?::(?P<line>\d+))?\)$")
_WAIT_LINE = re.compile(
    r"""["'](?:COMMIT|END|BEGIN IMMEDIATE|BEGIN EXCLUSIVE)["']|\.commit\(\)|wal_checkpoint"""
    r"""|\.get\(\)\s*$"""
)
"""A source line that blocks: a statement SQLite waits in (the fsync, the write lock), or a
queue's ``get()`` (``dict.get`` takes an argument)."""
_WAIT_FUNCTIONS = frozenset(
    {
        ("selectors", "select"),
        ("threading", "wait"),
        ("threading", "join"),
        ("threading", "_wait_for_tstate_lock"),
        ("queue", "get"),
    }
)
"""Standard library functions that wait (py-spy's own idle heuristic names the first two)."""
_ROOTS = (Path(__file__).resolve().parents[1] / "src", *map(Path, sys.path))
"""Where py-spy's shortened file names (``thoughtgate/store/sqlite.py``) are found."""


def _source_line(file: str, line: int) -> str:
    """The text of ``file``'s line ``line`` on this machine, or ``""``."""
    if file.startswith("<"):
        return ""
    for root in _ROOTS:
        path = root / file
        if path.is_file():
            return linecache.getline(str(path), line)
    return ""


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


def _frames(stack: str) -> list[tuple[str, str, int]]:
    out = []
    for frame in stack.split(";"):
        found = _FRAME.match(frame.strip())
        if found:
            out.append((found["func"], found["file"], int(found["line"] or 0)))
    return out


def _waits(func: str, file: str, line: int, source: Callable[[str, int], str]) -> bool:
    """Whether a sample whose top Python frame is this one is a thread waiting (see the module
    docstring); a frame without a line number, or whose line is not found, is running."""
    name = func.rpartition(".")[2]
    if (_area(file), name) in _WAIT_FUNCTIONS:
        return True
    return line > 0 and _WAIT_LINE.search(source(file, line).strip()) is not None


def summary(path: Path, *, top: int = 14, source: Callable[[str, int], str] = _source_line) -> str:
    """Where the samples of one raw profile went, as lines of text.

    * how many samples were running and how many waiting (see the module docstring);
    * self, by area: the package (or thoughtgate module) of the running frame;
    * inclusive, by area: running samples with that area anywhere on the stack (the event loop,
      threads and the entry point, on every stack, left out);
    * self, by function: the hottest running frames;
    * waiting, by line: where the waiting samples waited.

    ``source(file, line)``: the text of a frame's line (this machine's source by default).
    """
    total = running = 0
    by_area: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    by_function: Counter[str] = Counter()
    waiting: Counter[str] = Counter()
    for text in path.read_text().splitlines():
        stack, _, count = text.rpartition(" ")
        frames = _frames(stack) if count.isdigit() else []
        if not frames:
            continue
        n = int(count)
        total += n
        func, file, line = frames[-1]
        if _waits(func, file, line, source):
            waiting[f"{func} ({file}:{line})"] += n
            continue
        running += n
        for area in {_area(f) for _, f, _ in frames} - _EVERYWHERE:
            inclusive[area] += n
        by_area[_area(file)] += n
        by_function[f"{func} ({_area(file)})"] += n
    if not total:
        return "no samples"

    def block(title: str, counts: Counter[str], of: int) -> list[str]:
        rows = [f"  {100 * n / of:5.1f}%  {name}" for name, n in counts.most_common(top)]
        return [title, *rows]

    waited = total - running
    return "\n".join(
        [
            f"{total} samples (all threads py-spy saw active): {running} running, {waited} waiting"
            f" ({100 * waited / total:.1f}%: blocked in SQLite, a queue, select; not CPU)",
            *block("self, by area (% of running):", by_area, running or 1),
            *block("inclusive, by area (% of running):", inclusive, running or 1),
            *block("self, by function (% of running):", by_function, running or 1),
            *block("waiting, by line (% of all):", waiting, total),
        ]
    )


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        for name in sys.argv[1:]:
            print(f"== {name}\n{summary(Path(name))}")
