"""An in-process OTLP/HTTP collector: a real HTTP server on loopback that decodes the protobuf.

Spans and metrics arrive exactly as a stock collector (or Langfuse, Phoenix, Grafana Alloy)
would receive them from thoughtgate's configured exporters, and are decoded with the official
``opentelemetry-proto`` messages, so a test reads what a backend reads.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

__all__ = ["Collector", "DecodedSpan", "serve_collector", "value_of"]


def value_of(any_value: Any) -> Any:
    """An OTLP ``AnyValue`` as a plain Python value."""
    kind = any_value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return tuple(value_of(v) for v in any_value.array_value.values)
    if kind == "kvlist_value":
        return {kv.key: value_of(kv.value) for kv in any_value.kvlist_value.values}
    return getattr(any_value, kind)


def _attributes(kvs: Any) -> dict[str, Any]:
    return {kv.key: value_of(kv.value) for kv in kvs}


@dataclass(frozen=True)
class DecodedSpan:
    name: str
    kind: int
    trace_id: bytes
    span_id: bytes
    parent_span_id: bytes
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    status_code: int
    status_message: str
    scope_name: str
    scope_version: str
    schema_url: str
    resource: dict[str, Any]

    @property
    def operation(self) -> Any:
        return self.attributes.get("gen_ai.operation.name")


@dataclass
class Collector:
    url: str = ""
    traces: list[ExportTraceServiceRequest] = field(default_factory=list)
    metrics: list[ExportMetricsServiceRequest] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    content_types: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def spans(self) -> list[DecodedSpan]:
        out = []
        with self.lock:
            requests = list(self.traces)
        for request in requests:
            for rs in request.resource_spans:
                resource = _attributes(rs.resource.attributes)
                for ss in rs.scope_spans:
                    for span in ss.spans:
                        out.append(
                            DecodedSpan(
                                span.name,
                                span.kind,
                                span.trace_id,
                                span.span_id,
                                span.parent_span_id,
                                span.start_time_unix_nano,
                                span.end_time_unix_nano,
                                _attributes(span.attributes),
                                [(e.name, _attributes(e.attributes)) for e in span.events],
                                span.status.code,
                                span.status.message,
                                ss.scope.name,
                                ss.scope.version,
                                ss.schema_url,
                                resource,
                            )
                        )
        return out

    def metric_points(self) -> dict[str, list[dict[str, Any]]]:
        """Every histogram data point per metric name (as JSON dicts), with the scope it came
        from under ``"scope"``."""
        out: dict[str, list[dict[str, Any]]] = {}
        with self.lock:
            requests = list(self.metrics)
        for request in requests:
            for rm in request.resource_metrics:
                for sm in rm.scope_metrics:
                    scope = {
                        "name": sm.scope.name,
                        "version": sm.scope.version,
                        "schema_url": sm.schema_url,
                    }
                    for metric in sm.metrics:
                        for point in metric.histogram.data_points:
                            decoded = MessageToDict(point, preserving_proto_field_name=True)
                            decoded["attributes"] = _attributes(point.attributes)
                            decoded["unit"] = metric.unit
                            decoded["scope"] = scope
                            out.setdefault(metric.name, []).append(decoded)
        return out


def serve_collector() -> Iterator[Collector]:
    """Run a collector on ``127.0.0.1`` (a fixture body: ``yield from serve_collector()``)."""
    collector = Collector()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            if self.headers.get("content-encoding") == "gzip":
                body = gzip.decompress(body)
            reply: Any
            if self.path == "/v1/traces":
                request: Any = ExportTraceServiceRequest.FromString(body)
                reply = ExportTraceServiceResponse()
                target = collector.traces
            elif self.path == "/v1/metrics":
                request = ExportMetricsServiceRequest.FromString(body)
                reply = ExportMetricsServiceResponse()
                target = collector.metrics
            else:
                self.send_error(404)
                return
            with collector.lock:
                target.append(request)
                collector.paths.append(self.path)
                collector.content_types.add(self.headers.get("content-type") or "")
            data = reply.SerializeToString()
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    collector.url = f"http://127.0.0.1:{server.server_address[1]}"
    # shutdown() waits for serve_forever's next poll: 0.5 s by default, at every test's end
    thread = threading.Thread(
        target=server.serve_forever,
        kwargs={"poll_interval": 0.05},
        name="otlp collector",
        daemon=True,
    )
    thread.start()
    try:
        yield collector
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
