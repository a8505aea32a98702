"""Waiting on readiness, not on a clock: let the event loop run until a condition holds."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def settled(check: Callable[[], bool], *, turns: int = 1_000_000) -> None:
    """Let the loop run until ``check()`` holds; ``AssertionError`` after ``turns`` turns."""
    for _ in range(turns):
        if check():
            return
        await asyncio.sleep(0)
    raise AssertionError("never settled")
