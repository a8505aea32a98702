"""The demo's scenario: a multi-turn tool run through the real ``anthropic`` adapter, against the
in-process provider emulator over loopback HTTP. No API key, no network.

The demo turns ``narration`` on (unless ``visible_reasoning.summarizers`` is set in the config), so
the emulated model writes steps for the reader through ``visible_step`` beside its tool calls:
what a viewer sees is written for them, never taken from the model's thinking.

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

__all__ = [
    "DEMO_MODEL",
    "DEMO_PROMPT",
    "DEMO_SCENARIO",
    "demo_config",
    "demo_provider",
    "demo_runtime",
    "demo_tools",
]

DEMO_PROMPT = "What is the largest city in my country?"
DEMO_MODEL = "anthropic:claude-sonnet-4-5"
DEMO_SCENARIO = "narrated-tool-loop"


def demo_config(config: Config) -> Config:
    """``config`` with ``narration`` and ``phases`` as the visible-step sources, unless the
    operator chose the sources themselves."""
    vr = config.visible_reasoning
    if "summarizers" in vr.model_fields_set:
        return config
    narrated = vr.model_copy(update={"summarizers": ("narration", "phases")})
    return config.model_copy(update={"visible_reasoning": narrated})


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
    """The emulator serving the ``narrated-tool-loop`` scenario on loopback, and a provider
    factory that talks to it: ``(emulator url, factory)``."""
    emulator = Emulator().add(builtin_scenarios()[DEMO_SCENARIO], default=True)
    with serve_emulator(emulator) as server:
        # the emulator plays Anthropic's API; its loopback host says nothing, so it is named,
        # as behind a gateway (Claude's summarized thinking is labelled so only there, ADR 0078)
        plays = {"thoughtgate": {"server": "anthropic"}}

        def provider(model: str) -> Provider:
            settings = ProviderSettings(
                base_url=server.url, api_key="emulator-no-key-needed", extra=plays
            )
            return create_provider(model, settings)

        yield server.url, provider


def demo_runtime(store: EventStore, config: Config, provider_factory: ProviderFactory) -> Runtime:
    """The runtime the demo runs on: its two tools, the config's telemetry, and ``narration`` on
    unless the config names the visible-step sources itself (:func:`demo_config`)."""
    return Runtime(
        store,
        demo_config(config),
        provider_factory=provider_factory,
        tools=demo_tools(),
        approvals=ApprovalBroker(),
        sinks=telemetry_sinks(config),
    )
