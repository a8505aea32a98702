"""Exporters for spans and metrics, and how a collector outage is kept off the run's path.

Telemetry never slows a run. Spans and metrics are exported on the SDK's own threads (a batch
span processor, a periodic metric reader), each batch in one attempt bounded by
``telemetry.export_timeout_s`` (0.5 s by default, below the OTLP exporters' first retry backoff,
so they never sleep and retry). While the collector is down, batches are dropped at once for
``OUTAGE_COOLDOWN_S`` instead of being tried again, and the outage is reported with one warning
(the exporters' own retry and failure lines are not printed), so a process that exits with a dead
collector waits for nothing. ``bench/telemetry_bench.py`` measures what a down collector costs.

The OTLP/HTTP exporter is part of the core install; OTLP/gRPC needs the ``grpc`` extra
(``pip install 'thoughtgate[grpc]'``): asking for it without the extra is a clear
:class:`~thoughtgate.errors.UsageError` at start.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlsplit, urlunsplit

from thoughtgate.config import TelemetryConfig
from thoughtgate.errors import UsageError

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult
    from opentelemetry.sdk.metrics.export import MetricsData as SdkMetricsData
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
    from opentelemetry.trace import TracerProvider

__all__ = [
    "OUTAGE_COOLDOWN_S",
    "build_meter_provider",
    "build_tracer_provider",
    "metrics_endpoint",
    "traces_endpoint",
]

logger = logging.getLogger("thoughtgate.telemetry")

OUTAGE_COOLDOWN_S = 30.0
"""After a failed export, batches are dropped without trying for this long."""

_EXPORTER_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.proto.http.metric_exporter",
    "opentelemetry.exporter.otlp.common.http",
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
)
"""Where the OTLP exporters log each retry and failure (silenced inside our export calls)."""

_GRPC_MISSING = (
    "the otlp_grpc exporter needs the gRPC extra: pip install 'thoughtgate[grpc]' "
    '(or use exporter = "otlp_http", which the core install includes)'
)


def _signal_endpoint(endpoint: str, signal: str) -> str | None:
    """The OTLP/HTTP URL of one signal (``traces`` or ``metrics``) from the configured endpoint: a
    bare collector URL gets ``/v1/<signal>``; a URL ending in another signal's standard path gets
    this one's; any other path names one signal only (``None`` for the others)."""
    parts = urlsplit(endpoint)
    path = parts.path.rstrip("/")
    if path == "":
        return urlunsplit(parts._replace(path=f"/v1/{signal}"))
    for other in ("traces", "metrics"):
        if path.endswith(f"/v1/{other}"):
            return urlunsplit(parts._replace(path=path[: -len(other)] + signal))
    return endpoint if signal == "traces" else None


def traces_endpoint(endpoint: str) -> str:
    """``http://collector:4318`` -> ``http://collector:4318/v1/traces``; a full URL stays."""
    found = _signal_endpoint(endpoint, "traces")
    assert found is not None
    return found


def metrics_endpoint(config: TelemetryConfig) -> str | None:
    """Where OTLP/HTTP metrics go: ``metrics_endpoint``, else derived from ``endpoint`` (``None``
    when neither is set: the exporter then follows ``OTEL_EXPORTER_OTLP_*``)."""
    if config.metrics_endpoint:
        return config.metrics_endpoint
    if not config.endpoint:
        return None
    return _signal_endpoint(config.endpoint, "metrics")


def _resource() -> Resource:
    """The SDK's resource (``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, …), with
    ``service.name = thoughtgate`` only where the environment names no service."""
    from opentelemetry.sdk.resources import SERVICE_NAME
    from opentelemetry.sdk.resources import Resource as SdkResource

    resource = SdkResource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(SdkResource({SERVICE_NAME: "thoughtgate"}))
    return resource


_quiet = threading.local()


class _QuietInOurExports(logging.Filter):
    """Drops exporter log records emitted on a thread that is inside an outage guard."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(_quiet, "active", False)


_QUIET_FILTER = _QuietInOurExports()


class _OutageGuard:
    """One bounded attempt per batch, one warning per outage of a collector, shared by the span
    and metric exporters of one set of sinks that send to it (:func:`_guard_for`).

    While the collector is known to be down, :meth:`skipping` is true: batches are dropped
    without a network call.
    """

    def __init__(self, endpoint: str, *, cooldown_s: float) -> None:
        self.endpoint = _origin(endpoint)  # what the warnings name
        self.cooldown_s = cooldown_s
        self._down_until = 0.0
        self._down = False
        for name in _EXPORTER_LOGGERS:
            logger_ = logging.getLogger(name)
            if _QUIET_FILTER not in logger_.filters:
                logger_.addFilter(_QUIET_FILTER)

    def skipping(self) -> bool:
        return self._down and time.monotonic() < self._down_until

    def quietly(self, call: Any, *args: Any) -> Any:
        _quiet.active = True
        try:
            return call(*args)
        finally:
            _quiet.active = False

    def outcome(self, ok: bool) -> None:
        if ok:
            if self._down:
                logger.warning("telemetry: the collector at %s is reachable again", self.endpoint)
            self._down = False
            return
        if not self._down:
            logger.warning(
                "telemetry: cannot export to %s; dropping spans and metrics (runs are not "
                "slowed; trying again every %.0f s)",
                self.endpoint,
                self.cooldown_s,
            )
        self._down = True
        self._down_until = time.monotonic() + self.cooldown_s


def _origin(endpoint: str) -> str:
    """The collector at ``endpoint`` as a log line may name it: scheme, host and port, without a
    user and password (``https://user:token@collector``) or a path or query that may hold one."""
    parts = urlsplit(endpoint)
    if not (parts.scheme and parts.netloc):
        return "the configured endpoint" if "@" in endpoint else endpoint
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"


Guards = dict[tuple[str, float], _OutageGuard]
"""The outage guards of one set of sinks (``telemetry_sinks``), by collector and cooldown."""
_GUARDS_LOCK = threading.Lock()


def _guard_for(endpoint: str, cooldown_s: float, guards: Guards) -> _OutageGuard:
    """The guard of the collector at ``endpoint`` (its scheme, host and port) in ``guards``: the
    spans and metrics of one set of sinks sent to one collector share it, so one outage is one
    warning and one cooldown. Each set of sinks has its own (a process builds one; a second set
    built later, as another ``thoughtgate run`` would, reports an outage that is still going on
    again, rather than showing nothing)."""
    origin = _origin(endpoint)
    with _GUARDS_LOCK:
        guard = guards.get((origin, cooldown_s))
        if guard is None:
            guard = guards[(origin, cooldown_s)] = _OutageGuard(origin, cooldown_s=cooldown_s)
        return guard


class _OutageAwareExporter:
    """Wraps an OTLP span exporter with an :class:`_OutageGuard`.

    A ``SpanExporter`` in the SDK's sense (duck-typed so importing this module never imports the
    SDK)."""

    def __init__(self, inner: SpanExporter, endpoint: str, *, cooldown_s: float) -> None:
        self.inner = inner
        self.guard = _OutageGuard(endpoint, cooldown_s=cooldown_s)

    @property
    def endpoint(self) -> str:
        return self.guard.endpoint

    @property
    def cooldown_s(self) -> float:
        return self.guard.cooldown_s

    @cooldown_s.setter
    def cooldown_s(self, value: float) -> None:
        self.guard.cooldown_s = value

    @property
    def _down_until(self) -> float:
        return self.guard._down_until

    @_down_until.setter
    def _down_until(self, value: float) -> None:
        self.guard._down_until = value

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        from opentelemetry.sdk.trace.export import SpanExportResult

        if self.guard.skipping():
            return SpanExportResult.FAILURE
        try:
            result = self.guard.quietly(self.inner.export, spans)
        except Exception:
            result = SpanExportResult.FAILURE
        self.guard.outcome(result is SpanExportResult.SUCCESS)
        return cast("SpanExportResult", result)

    def shutdown(self) -> None:
        self.guard.quietly(self.inner.shutdown)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return bool(self.inner.force_flush(timeout_millis))


def _outage_aware_metrics(inner: MetricExporter, endpoint: str, guards: Guards) -> MetricExporter:
    """A metric exporter with the same outage guard (a real ``MetricExporter`` subclass: the
    periodic reader reads its preferred temporality and aggregation)."""
    from opentelemetry.sdk.metrics.export import MetricExporter as SdkMetricExporter
    from opentelemetry.sdk.metrics.export import MetricExportResult as Result

    guard = _guard_for(endpoint, OUTAGE_COOLDOWN_S, guards)

    class OutageAwareMetricExporter(SdkMetricExporter):
        def __init__(self) -> None:
            super().__init__(
                preferred_temporality=inner._preferred_temporality,
                preferred_aggregation=inner._preferred_aggregation,
            )
            self.inner = inner

        def export(
            self, metrics_data: SdkMetricsData, timeout_millis: float = 10_000, **kwargs: Any
        ) -> MetricExportResult:
            if guard.skipping():
                return Result.FAILURE
            try:
                result = guard.quietly(inner.export, metrics_data, timeout_millis)
            except Exception:
                result = Result.FAILURE
            guard.outcome(result is Result.SUCCESS)
            return cast("MetricExportResult", result)

        def force_flush(self, timeout_millis: float = 10_000) -> bool:
            return bool(inner.force_flush(timeout_millis))

        def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
            guard.quietly(inner.shutdown)

    return OutageAwareMetricExporter()


def build_tracer_provider(
    config: TelemetryConfig, guards: Guards | None = None
) -> TracerProvider | None:
    """An SDK tracer provider exporting as configured, or ``None`` for ``exporter = "none"``.

    It is private to thoughtgate (the global provider is left alone), batches spans off the event
    loop, and flushes at interpreter exit. ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES`` and
    the ``OTEL_EXPORTER_OTLP_*`` variables (headers, certificates, and the endpoint when
    ``telemetry.endpoint`` is unset) apply as the OpenTelemetry SDK defines them. ``guards``: the
    outage guards it shares with the meter provider of the same sinks (its own when not given).
    """
    if config.exporter == "none":
        return None
    guards = {} if guards is None else guards
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    exporter: SpanExporter
    timeout = config.export_timeout_s
    if config.exporter == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        # stderr: stdout carries --json output and the MCP stdio protocol.
        exporter = ConsoleSpanExporter(out=sys.stderr)
    elif config.exporter == "otlp_http":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HttpExporter,
        )

        http = HttpExporter(
            endpoint=traces_endpoint(config.endpoint) if config.endpoint else None,
            timeout=timeout,
        )
        exporter = _wrap(http, str(getattr(http, "_endpoint", config.endpoint)), guards)
    else:
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                OTLPSpanExporter as GrpcExporter,
            )
        except ImportError as exc:
            raise UsageError(_GRPC_MISSING) from exc

        grpc = GrpcExporter(endpoint=config.endpoint, timeout=timeout)
        exporter = _wrap(grpc, _grpc_target(grpc, config), guards)
    provider = SdkTracerProvider(resource=_resource())
    provider.add_span_processor(BatchSpanProcessor(exporter, export_timeout_millis=timeout * 1000))
    return provider


def build_meter_provider(
    config: TelemetryConfig, guards: Guards | None = None
) -> MeterProvider | None:
    """An SDK meter provider for the GenAI client metrics, or ``None`` when metrics are off
    (``exporter = "none"`` or ``metrics = false``). Exported every ``metrics_interval_s`` on the
    reader's own thread, and at exit. ``guards``: as for :func:`build_tracer_provider`."""
    if config.exporter == "none" or not config.metrics:
        return None
    guards = {} if guards is None else guards
    from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    exporter: MetricExporter
    timeout = config.export_timeout_s
    if config.exporter == "console":
        from opentelemetry.sdk.metrics.export import ConsoleMetricExporter

        exporter = ConsoleMetricExporter(out=sys.stderr)
    elif config.exporter == "otlp_http":
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
            OTLPMetricExporter as HttpMetricExporter,
        )

        http = HttpMetricExporter(endpoint=metrics_endpoint(config), timeout=timeout)
        exporter = _outage_aware_metrics(http, str(getattr(http, "_endpoint", "")), guards)
    else:
        try:
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
                OTLPMetricExporter as GrpcMetricExporter,
            )
        except ImportError as exc:
            raise UsageError(_GRPC_MISSING) from exc

        grpc = GrpcMetricExporter(endpoint=config.endpoint, timeout=timeout)
        exporter = _outage_aware_metrics(grpc, _grpc_target(grpc, config), guards)
    reader = PeriodicExportingMetricReader(
        exporter,
        export_interval_millis=config.metrics_interval_s * 1000,
        export_timeout_millis=timeout * 1000,
    )
    return SdkMeterProvider(metric_readers=[reader], resource=_resource())


def _grpc_target(exporter: object, config: TelemetryConfig) -> str:
    """The collector a gRPC exporter sends to, as its warnings name it: ``endpoint``, else the
    one the exporter resolved (``OTEL_EXPORTER_OTLP_ENDPOINT``, else ``localhost:4317``), so the
    span and metric exporters share one outage guard and an operator sees which address failed
    (``_origin`` keeps credentials out of it)."""
    return str(config.endpoint or getattr(exporter, "_endpoint", None) or "localhost:4317")


def _wrap(inner: SpanExporter, endpoint: str, guards: Guards) -> SpanExporter:
    wrapped = _OutageAwareExporter(inner, endpoint, cooldown_s=OUTAGE_COOLDOWN_S)
    wrapped.guard = _guard_for(endpoint, OUTAGE_COOLDOWN_S, guards)
    return cast("SpanExporter", wrapped)
