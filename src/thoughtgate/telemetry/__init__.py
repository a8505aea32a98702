"""OpenTelemetry for thoughtgate: GenAI spans and client metrics built from the event log.

``telemetry_sinks(config)`` gives the Runtime sinks to register (none when no exporter is
configured, so telemetry then costs nothing). :mod:`.spans` turns events into spans and metrics,
:mod:`.exporters` sends them (off the run's path), :mod:`.conventions` names every attribute.
"""

from __future__ import annotations

from opentelemetry.trace import TracerProvider

from thoughtgate.config import Config, TelemetryConfig
from thoughtgate.orchestration.recorder import EventSink
from thoughtgate.telemetry.exporters import (
    OUTAGE_COOLDOWN_S,
    Guards,
    _OutageAwareExporter,
    build_meter_provider,
    build_tracer_provider,
)
from thoughtgate.telemetry.spans import TelemetrySink

__all__ = [
    "OUTAGE_COOLDOWN_S",
    "TelemetrySink",
    "_OutageAwareExporter",
    "build_meter_provider",
    "build_tracer_provider",
    "telemetry_sinks",
]


def telemetry_sinks(
    config: Config | TelemetryConfig,
    *,
    tracer_provider: TracerProvider | None = None,
    meter_provider: object | None = None,
) -> list[EventSink]:
    """The sinks to pass as ``Runtime(..., sinks=...)``: none when no exporter is configured.

    ``tracer_provider`` (and ``meter_provider``) override the configured exporters (tests pass
    SDK providers with in-memory exporters; an application may pass its own); ``capture_content``
    still comes from the config. A given tracer provider without a meter provider means no
    metrics.
    """
    from opentelemetry.metrics import MeterProvider

    settings = config.telemetry if isinstance(config, Config) else config
    if tracer_provider is not None:
        meters = meter_provider if isinstance(meter_provider, MeterProvider) else None
        return [
            TelemetrySink(
                tracer_provider, meter_provider=meters, capture_content=settings.capture_content
            )
        ]
    guards: Guards = {}  # one warning per collector outage for these sinks' spans and metrics
    provider = build_tracer_provider(settings, guards)
    if provider is None:
        return []
    return [
        TelemetrySink(
            provider,
            meter_provider=build_meter_provider(settings, guards),
            capture_content=settings.capture_content,
        )
    ]
