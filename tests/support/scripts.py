"""Fake-provider scripts for runs that do not complete: an outage, a cut answer, a slow stream.

Tests hand them to a ``FakeProvider`` directly, or run them by name (``fake:outage``,
``fake:cut``) through :data:`SCRIPTS`, which ``support.fakes`` registers.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

from thoughtgate.errors import ProviderHTTPError, ProviderStreamError
from thoughtgate.providers.base import TurnRequest
from thoughtgate.testing.fake import ScriptFn, reasoning, text

__all__ = ["CUT_EMOJI", "SCRIPTS", "cut", "cut_emoji_steps", "failing", "outage", "slow"]


def outage(request: TurnRequest, turn: int) -> Iterator[Any]:
    """The provider refuses the turn before any output (a 529), as an adapter reports a real
    provider's refusal: "Overloaded" is the provider's own text (``by_provider``), so it is the
    developer-only ``error_detail``, never the public ``error`` (ADRs 0071, 0073)."""
    raise ProviderHTTPError(
        "Overloaded", provider="fake", status=529, error_type="overloaded", by_provider=True
    )
    yield  # pragma: no cover - makes this a generator


def failing(error: Exception) -> AsyncIterator[Any]:
    """A turn's stream that fails with ``error`` before any output (a provider refusing it)."""

    async def gen() -> AsyncIterator[Any]:
        raise error
        yield  # pragma: no cover - makes this a generator

    return gen()


def cut(request: TurnRequest, turn: int) -> Iterator[Any]:
    """Some answer text, then the stream breaks."""
    yield text("Half an ans")
    raise ProviderStreamError("the stream was cut", provider="fake")


def slow(request: TurnRequest, turn: int) -> AsyncIterator[Any]:
    """Starts answering, then waits a minute (long enough to be cancelled)."""

    async def gen() -> AsyncIterator[Any]:
        yield text("Working on ")
        await asyncio.sleep(60)
        yield text("it.")

    return gen()


CUT_EMOJI = "half an emoji \ud83d"
"""A model's text cut inside a surrogate pair: Python's ``json`` reads a provider's ``"\\ud83d"``
as this, and a payload keeps it exactly (ADR 0114)."""


def cut_emoji_steps(request: TurnRequest, turn: int) -> Iterator[Any]:
    """Raw reasoning, a provider's summary (a visible step with ``provider_summaries``) and the
    answer, each holding :data:`CUT_EMOJI`."""
    yield reasoning(f"I look at the {CUT_EMOJI} and think it over.")
    yield reasoning(f"**Checking the {CUT_EMOJI}**\n\nLooking at it closely.", kind="summary")
    yield text(f"Here is {CUT_EMOJI}")


SCRIPTS: dict[str, ScriptFn] = {
    "outage": outage,
    "cut": cut,
    "cut-emoji-steps": cut_emoji_steps,
}
"""``fake:outage``, ``fake:cut`` and ``fake:cut-emoji-steps``, for ``support.fakes``
(``fake:slow`` is the daemon's own)."""
