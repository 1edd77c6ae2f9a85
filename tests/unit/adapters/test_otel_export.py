"""The span export: our spans become the SDK's ReadableSpans with their own ids, times and status; the queue is
bounded (a request's spans dropped whole, counted); a failed export is counted; a blocked exporter never blocks
`offer`; the tracing listener never raises into the log's commit; where spans go (config, then OTEL_* env)."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Sequence

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from opentelemetry.trace.status import StatusCode

from blazar import config
from blazar.adapters.otel.export import SpanExport
from blazar.adapters.otel.target import otlp_target
from blazar.adapters.otel.tracing import Tracing, _Sparse, resource_for
from blazar.config import Settings
from blazar.errors import ConfigError
from blazar.projections.spans import Span, SpanEvent, SpanFold
from tests.support.events import streamed_cold_queued

RESOURCE = resource_for("test")


def span(name: str = "chat m", *, parent: str | None = None, error: str | None = None) -> Span:
    return Span(name=name, trace_id="0af7651916cd43dd8448eb211c80319c", span_id="b7ad6b7169203331",
                parent_span_id=parent, start_ns=1_000, end_ns=2_000, kind="server" if parent is None else "internal",
                attributes={"gen_ai.operation.name": "chat", "blazar.evicted.models": ["a", "b"]}, error=error,
                events=(SpanEvent("blazar.evicted", 1_500, {"blazar.model": "a"}),))


class Blocked:
    """An exporter stuck in its first export until released (a collector that hangs)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.calls = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.calls += 1
        self.entered.set()
        self.release.wait(10)
        return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        self.release.set()


def test_spans_are_exported_with_their_own_ids_times_parent_and_status() -> None:
    memory = InMemorySpanExporter()
    export = SpanExport(memory, RESOURCE, interval_s=0.05)
    export.offer([(span(error="refused: queue_full (HTTP 429)"), span("blazar.queue", parent="b7ad6b7169203331"))])
    assert export.flush(5)
    root, child = memory.get_finished_spans()
    assert f"{root.context.trace_id:032x}" == "0af7651916cd43dd8448eb211c80319c"
    assert f"{root.context.span_id:016x}" == "b7ad6b7169203331" and root.parent is None
    assert (root.start_time, root.end_time, root.kind) == (1_000, 2_000, SpanKind.SERVER)
    assert root.status.status_code is StatusCode.ERROR and root.status.description == "refused: queue_full (HTTP 429)"
    assert root.attributes["blazar.evicted.models"] == ["a", "b"] and root.events[0].name == "blazar.evicted"
    assert child.parent is not None and f"{child.parent.span_id:016x}" == "b7ad6b7169203331"
    assert child.status.status_code is StatusCode.UNSET and child.kind == SpanKind.INTERNAL
    assert root.resource.attributes["service.name"] == "blazar"
    assert export.exported == 2 and export.failed == 0 and export.dropped == 0
    export.close(5)


def test_a_full_queue_drops_whole_requests_and_counts_them_without_blocking() -> None:
    blocked = Blocked()
    export = SpanExport(blocked, RESOURCE, max_queue=4, max_batch=1, interval_s=0.01)
    export.offer([(span(),)])
    assert blocked.entered.wait(5)  # the thread is stuck in the export
    export.offer([(span(), span("blazar.queue", parent="b7ad6b7169203331")), (span(), span(), span())])
    assert export.queued == 2 and export.dropped == 3  # the second request did not fit: all three of its spans
    export.close(0.5)
    assert export.dropped == 5  # what was still queued when the close gave up
    assert blocked.calls == 1


def test_an_unreachable_collector_counts_failed_exports() -> None:
    with socket.socket() as s:  # a port that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    export = SpanExport(OTLPSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces", timeout=2), RESOURCE,
                        interval_s=0.05)
    export.offer([(span(),)])
    export.flush(15)
    assert export.failed == 1 and export.exported == 0
    export.close(1)


def test_the_listener_folds_committed_batches_and_never_raises_into_the_commit() -> None:
    memory = InMemorySpanExporter()
    tracing = Tracing(SpanFold(), SpanExport(memory, RESOURCE, interval_s=0.05))
    tracing.on_commit(streamed_cold_queued())
    assert tracing.export.flush(5) and len(memory.get_finished_spans()) == 5
    tracing.on_commit([object()])  # type: ignore[list-item]  # not a Recorded: the fold raises, the commit goes on
    assert tracing.fold_errors == 1
    assert tracing.stats() == {"exported": 5, "failed": 0, "dropped": 0, "queued": 0, "abandoned": 0}
    tracing.close(1)


def test_the_config_wins_over_the_environment_and_otlp_is_off_by_default() -> None:
    assert otlp_target(Settings(), {}) is None
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318",
           "OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Bearer%20x,a=1"}
    t = otlp_target(Settings(), env)
    assert t is not None and t.endpoint == "http://collector:4318/v1/traces"
    assert t.headers == {"authorization": "Bearer x", "a": "1"} and t.source == "OTEL_EXPORTER_OTLP_ENDPOINT"
    t = otlp_target(config.build({"telemetry.otlp_endpoint": "http://127.0.0.1:4318",
                                  "telemetry.otlp_headers": {"a": "2"}}), env)
    assert t is not None and t.endpoint == "http://127.0.0.1:4318/v1/traces" and t.headers["a"] == "2"
    t = otlp_target(config.build({"telemetry.otlp_endpoint": "https://otel.example/custom/path"}), {})
    assert t is not None and t.endpoint == "https://otel.example/custom/path"
    t = otlp_target(Settings(), {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/x"})
    assert t is not None and t.endpoint == "http://c:4318/x"
    off = {"OTEL_SDK_DISABLED": "true"}
    assert otlp_target(config.build({"telemetry.otlp_endpoint": "http://c:4318"}), off) is None


def test_the_otlp_keys_are_parsed_and_validated_like_every_config_key() -> None:
    assert config.parse_value("telemetry.otlp_headers", "authorization=Bearer abc, x-team=ml") == \
        {"authorization": "Bearer abc", "x-team": "ml"}
    assert config.parse_value("telemetry.otlp_headers", "") == {}
    assert config.parse_value("telemetry.otlp_endpoint", " http://127.0.0.1:4318 ") == "http://127.0.0.1:4318"
    assert config.parse_value("telemetry.otlp_endpoint", "") == ""
    for key, bad in (("telemetry.otlp_endpoint", "127.0.0.1:4318"), ("telemetry.otlp_endpoint", "ftp://c"),
                     ("telemetry.otlp_headers", "no-equals-sign"), ("telemetry.otlp_headers", "bad name=1")):
        with pytest.raises(ConfigError, match=key):
            config.parse_value(key, bad)
    assert "name=value" in config.describe("telemetry.otlp_headers")


def test_the_sdks_export_errors_are_logged_once_a_minute_not_once_an_export() -> None:
    sparse = _Sparse(every_s=60)
    record = logging.LogRecord("opentelemetry", logging.ERROR, __file__, 1, "Failed to export %s batch", ("span",),
                               None)
    other = logging.LogRecord("opentelemetry", logging.ERROR, __file__, 1, "Transient error %s", ("x",), None)
    assert sparse.filter(record) and not sparse.filter(record) and sparse.filter(other)
