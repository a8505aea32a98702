"""The demo's scenario: a multi-turn tool run through the real ``anthropic`` adapter, against the
in-process provider emulator over loopback HTTP. No API key, no network.

This module builds the run and nothing else; ``thoughtgate demo`` (``thoughtgate.cli.demo``)
shows it. Keeping the two apart keeps the import graph a DAG: the command line depends on the
demo, never the other way round.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from thoughtgate.config import Config
from thoughtgate.engine.approvals import ApprovalBroker
from thoughtgate.engine.tools import ToolRegistry, tool
from thoughtgate.orchestration.runtime import ProviderFactory, Runtime
from thoughtgate.providers.base import Provider, ProviderSettings, create_provider
from thoughtgate.store.base import EventStore
from thoughtgate.telemetry import telemetry_sinks
from thoughtgate.testing.emulator import Emulator, serve_emulator
from thoughtgate.testing.emulator.scenarios import builtin_scenarios

__all__ = ["DEMO_MODEL", "DEMO_PROMPT", "demo_provider", "demo_runtime", "demo_tools"]

DEMO_PROMPT = "What is the largest city in my country?"
DEMO_MODEL = "anthropic:claude-sonnet-4-5"


def demo_tools() -> ToolRegistry:
    @tool
    def get_country() -> str:
        """The user's country, from their profile."""
        return "Mexico"

    @tool
    def largest_city(country: str) -> str:
        """The most populous city of a country."""
        return {"Mexico": "Mexico City"}.get(country, "unknown")

    return ToolRegistry([get_country, largest_city])


@contextlib.contextmanager
def demo_provider() -> Iterator[tuple[str, ProviderFactory]]:
    """The emulator serving the ``tool-loop`` scenario on loopback, and a provider factory that
    talks to it: ``(emulator url, factory)``."""
    emulator = Emulator().add(builtin_scenarios()["tool-loop"], default=True)
    with serve_emulator(emulator) as server:

        def provider(model: str) -> Provider:
            return create_provider(
                model, ProviderSettings(base_url=server.url, api_key="emulator-no-key-needed")
            )

        yield server.url, provider


def demo_runtime(store: EventStore, config: Config, provider_factory: ProviderFactory) -> Runtime:
    """The runtime the demo runs on: its two tools, the config's telemetry."""
    return Runtime(
        store,
        config,
        provider_factory=provider_factory,
        tools=demo_tools(),
        approvals=ApprovalBroker(),
        sinks=telemetry_sinks(config),
    )
