"""The disclosure modes (``chain_of_thought``) and what each means for capture and recording.

Every component asks :class:`Disclosure` instead of comparing mode strings, so the routing in
the README ("Disclosure modes") lives in one place. This module is part of the core: it
imports nothing but the error tree, so providers, the store, the engine and the one output filter
can all depend on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias, get_args

from thoughtgate.errors import UnknownModeError

__all__ = [
    "CHAIN_OF_THOUGHT_MODES",
    "ChainOfThought",
    "Disclosure",
    "kept_detail",
    "parse_chain_of_thought",
]

ChainOfThought: TypeAlias = Literal["hidden", "surface", "telemetry_only"]
CHAIN_OF_THOUGHT_MODES: tuple[str, ...] = get_args(ChainOfThought)


def parse_chain_of_thought(value: str | None) -> ChainOfThought | None:
    """Validate a mode name (``None`` passes through as "not set at this layer")."""
    if value is None:
        return None
    if value not in CHAIN_OF_THOUGHT_MODES:
        raise UnknownModeError(
            f"unknown chain_of_thought mode {value!r}; allowed: {', '.join(CHAIN_OF_THOUGHT_MODES)}"
        )
    return value  # type: ignore[return-value]


@dataclass(frozen=True, slots=True)
class Disclosure:
    mode: ChainOfThought

    @classmethod
    def of(cls, mode: str) -> Disclosure:
        parsed = parse_chain_of_thought(mode)
        assert parsed is not None
        return cls(parsed)

    @property
    def requests_reasoning(self) -> bool:
        """Ask the provider for reasoning (``surface`` and ``telemetry_only``)."""
        return self.mode != "hidden"

    @property
    def captures(self) -> bool:
        """Keep what the provider returned; ``hidden`` keeps nothing even if some arrives."""
        return self.mode != "hidden"

    @property
    def on_display(self) -> bool:
        """Reasoning on tasks, ``agent.response`` and live ``reasoning.delta`` (``surface``)."""
        return self.mode == "surface"

    @property
    def in_trace(self) -> bool:
        """Reasoning in ``worker.completed`` trace metadata."""
        return self.mode != "hidden"


def kept_detail(mode: str, detail: str | None) -> str | None:
    """``detail`` when a run of ``mode`` records a failure's own words (``error_detail``), else
    ``None``: they may quote reasoning, so they are recorded -- in events and in checkpoints --
    only where reasoning is (``surface``, ``telemetry_only``); a ``hidden`` run records them
    nowhere, nor does a mode this version does not know (fail closed; ADRs 0071, 0073)."""
    return detail if mode in ("surface", "telemetry_only") else None
