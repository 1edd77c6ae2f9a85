"""A real OTLP/HTTP receiver on 127.0.0.1 for tests: POST /v1/traces bodies decoded with opentelemetry-proto
(ExportTraceServiceRequest), the spans kept as plain dicts; POST /v1/metrics bodies (ExportMetricsServiceRequest)
kept as one dict per export, metric name → its type and points; the raw trace bodies and all headers kept too.
`hang=True` makes it a collector that accepts and reads each export but never answers (until `close`, or
HANG_LIMIT_S)."""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

HANG_LIMIT_S = 120.0
KINDS = {1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}


def any_value(v: AnyValue) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return [any_value(x) for x in v.array_value.values]
    if which == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, which) if which else None


def decode(body: bytes) -> list[dict[str, Any]]:
    req = ExportTraceServiceRequest()
    req.ParseFromString(body)
    spans = []
    for rs in req.resource_spans:
        resource = {kv.key: any_value(kv.value) for kv in rs.resource.attributes}
        for ss in rs.scope_spans:
            for s in ss.spans:
                spans.append({
                    "trace_id": s.trace_id.hex(), "span_id": s.span_id.hex(),
                    "parent_span_id": s.parent_span_id.hex() or None, "name": s.name, "kind": KINDS.get(s.kind),
                    "start_ns": s.start_time_unix_nano, "end_ns": s.end_time_unix_nano,
                    "attributes": {kv.key: any_value(kv.value) for kv in s.attributes},
                    "status": {0: "unset", 1: "ok", 2: "error"}[s.status.code], "status_message": s.status.message,
                    "events": [{"name": e.name, "time_ns": e.time_unix_nano,
                                "attributes": {kv.key: any_value(kv.value) for kv in e.attributes}}
                               for e in s.events],
                    "resource": resource, "scope": ss.scope.name,
                })
    return spans


def _attributes(kvs: Any) -> dict[str, Any]:
    return {kv.key: any_value(kv.value) for kv in kvs}


def _number(p: Any) -> float:
    return p.as_int if p.WhichOneof("value") == "as_int" else p.as_double


def decode_metrics(body: bytes) -> dict[str, dict[str, Any]]:
    """One export: {name: {"type": sum|gauge|histogram, "monotonic", "temporality" (1 delta, 2 cumulative), "unit",
    "description", "resource", "scope", "points": [{"attributes", "value"} or {"attributes", "count", "sum",
    "bucket_counts", "explicit_bounds", "has_min_max"}]}}."""
    req = ExportMetricsServiceRequest()
    req.ParseFromString(body)
    out: dict[str, dict[str, Any]] = {}
    for rm in req.resource_metrics:
        resource = _attributes(rm.resource.attributes)
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                which = m.WhichOneof("data")
                entry: dict[str, Any] = {"type": which, "unit": m.unit, "description": m.description,
                                         "resource": resource, "scope": sm.scope.name, "points": []}
                if which == "sum":
                    entry.update(monotonic=m.sum.is_monotonic, temporality=m.sum.aggregation_temporality)
                    entry["points"] = [{"attributes": _attributes(p.attributes), "value": _number(p),
                                        "start_ns": p.start_time_unix_nano} for p in m.sum.data_points]
                elif which == "gauge":
                    entry["points"] = [{"attributes": _attributes(p.attributes), "value": _number(p)}
                                       for p in m.gauge.data_points]
                elif which == "histogram":
                    entry["temporality"] = m.histogram.aggregation_temporality
                    entry["points"] = [{"attributes": _attributes(p.attributes), "count": p.count, "sum": p.sum,
                                        "bucket_counts": list(p.bucket_counts),
                                        "explicit_bounds": list(p.explicit_bounds),
                                        "has_min_max": p.HasField("min") or p.HasField("max")}
                                       for p in m.histogram.data_points]
                out[m.name] = entry
    return out


class OtlpReceiver:
    def __init__(self, *, hang: bool = False) -> None:
        self.hang = hang
        self.spans: list[dict[str, Any]] = []
        self.metric_exports: list[dict[str, dict[str, Any]]] = []  # one per /v1/metrics export, in arrival order
        self.bodies: list[bytes] = []
        self.headers: list[dict[str, str]] = []
        self.paths: list[str] = []
        self.requests = 0  # exports that arrived (answered or not)
        self._lock = threading.Lock()
        self._release = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                with receiver._lock:
                    receiver.requests += 1
                    receiver.paths.append(self.path)
                    receiver.headers.append({k.lower(): v for k, v in self.headers.items()})
                if receiver.hang:
                    receiver._release.wait(HANG_LIMIT_S)
                    return  # never answered: the connection closes with the server
                if self.path.endswith("/v1/metrics"):
                    metrics = decode_metrics(body)
                    with receiver._lock:  # not in `bodies`: those are the spans' (help texts are English)
                        receiver.metric_exports.append(metrics)
                    out = ExportMetricsServiceResponse().SerializeToString()
                else:
                    spans = decode(body)
                    with receiver._lock:
                        receiver.bodies.append(body)
                        receiver.spans.extend(spans)
                    out = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="otlp-receiver", daemon=True)
        self._thread.start()

    def trace(self, trace_id: str) -> list[dict[str, Any]]:
        with self._lock:
            return [s for s in self.spans if s["trace_id"] == trace_id]

    def wait_spans(self, match: Callable[[list[dict[str, Any]]], bool], trace_id: str,
                   timeout_s: float = 30) -> list[dict[str, Any]]:
        """The trace's spans once `match` says they are all there (the export is batched: it takes a moment)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            spans = self.trace(trace_id)
            if match(spans):
                return spans
            time.sleep(0.1)
        raise AssertionError(f"spans of {trace_id} never arrived: {self.trace(trace_id)}")

    def trace_paths(self) -> list[str]:
        with self._lock:
            return [p for p in self.paths if not p.endswith("/v1/metrics")]

    def last_metrics(self) -> dict[str, dict[str, Any]] | None:
        with self._lock:
            return self.metric_exports[-1] if self.metric_exports else None

    def wait_metrics(self, match: Callable[[dict[str, dict[str, Any]]], bool],
                     timeout_s: float = 30) -> dict[str, dict[str, Any]]:
        """The first export from now on (or the last one so far) that `match` accepts (exports are periodic)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            last = self.last_metrics()
            if last is not None and match(last):
                return last
            time.sleep(0.05)
        raise AssertionError(f"no metrics export matched: the last was {self.last_metrics()}")

    def close(self) -> None:
        self._release.set()
        self.server.shutdown()
        self.server.server_close()
