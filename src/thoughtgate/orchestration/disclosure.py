"""What a disclosure mode means for capture and recording, decided once per run.

Every component asks this object instead of comparing mode strings, so the routing in
ARCHITECTURE.md ("Disclosure modes") lives in one place.
"""

from __future__ import annotations

from dataclasses import dataclass

from thoughtgate.config import ChainOfThought, parse_chain_of_thought
from thoughtgate.providers.base import ReasoningRequest

__all__ = ["Disclosure"]


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

    def reasoning_request(self) -> ReasoningRequest:
        return ReasoningRequest(self.requests_reasoning)
