"""``fake:ticker``: a paced fake script whose every delta names its step (the fault-injection and
replica tests count on it).

Kept apart from :mod:`support.faults` on purpose: a ``thoughtgate`` subprocess imports the fake
scripts through ``--tools support.served:...`` at every start, and the fault helpers bring pytest
and psycopg (0.4 s of a busy core per start); this module brings neither.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from thoughtgate.providers.base import TurnRequest
from thoughtgate.testing.fake import ScriptFn, reasoning, text

__all__ = ["SCRIPTS", "ticker_prompt"]


def ticker_prompt(steps: int, gap_ms: int, hold: Path | None = None) -> str:
    return f"ticker {steps} {gap_ms}" + (f" {hold}" if hold is not None else "")


def _ticker(request: TurnRequest, turn: int) -> AsyncIterator[Any]:
    """``"ticker STEPS GAP_MS [HOLD_FILE]"``: while ``HOLD_FILE`` exists, nothing; then one
    reasoning and one text delta per step, ``GAP_MS`` apart.

    Every delta names its step (``r17 ``, ``t17 ``), so a test can tell a duplicate or a hole in
    the recorded text, not only in the sequence numbers.
    """
    words = (request.messages[0].text if request.messages else "").split()
    steps = int(words[1]) if len(words) > 1 else 50
    gap = int(words[2]) / 1000 if len(words) > 2 else 0.02
    hold = Path(words[3]) if len(words) > 3 else None

    async def gen() -> AsyncIterator[Any]:
        # the test (maybe in another process) removes the file: a poll is the only signal there is
        while hold is not None and hold.exists():  # noqa: ASYNC110, ASYNC240
            await asyncio.sleep(0.05)
        for i in range(steps):
            yield reasoning(f"r{i} ")
            yield text(f"t{i} ")
            await asyncio.sleep(gap)

    return gen()


SCRIPTS: dict[str, ScriptFn] = {"ticker": _ticker}
"""``fake:ticker``, for ``support.fakes``."""
