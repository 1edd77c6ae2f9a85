"""A collector for the bench: OTLP/HTTP on 127.0.0.1, in its own process, answering every export at once and
counting what came (exports, bytes, spans; metrics exports on their own: the daemon sends /metrics' families to
/v1/metrics beside the spans). Prints its port on the first line of stdout; on SIGTERM (or stdin
closing), one JSON line with the counts. Run by bench/overhead_observed.py, not by hand."""

from __future__ import annotations

import json
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

COUNTS = {"exports": 0, "bytes": 0, "spans": 0, "bad": 0, "metric_exports": 0, "metric_bytes": 0}
LOCK = threading.Lock()
EMPTY = ExportTraceServiceResponse().SerializeToString()
EMPTY_METRICS = ExportMetricsServiceResponse().SerializeToString()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path.endswith("/v1/metrics"):
            self._metrics(body)
            return
        req = ExportTraceServiceRequest()
        try:
            req.ParseFromString(body)
            spans = sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)
            bad = 0
        except Exception:  # a body that is not an export: counted, answered 400
            spans, bad = 0, 1
        with LOCK:
            COUNTS["exports"] += 1
            COUNTS["bytes"] += len(body)
            COUNTS["spans"] += spans
            COUNTS["bad"] += bad
        self.send_response(400 if bad else 200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(EMPTY)))
        self.end_headers()
        self.wfile.write(EMPTY)

    def _metrics(self, body: bytes) -> None:
        try:
            ExportMetricsServiceRequest().ParseFromString(body)
            bad = 0
        except Exception:  # not an export: counted, answered 400
            bad = 1
        with LOCK:
            COUNTS["metric_exports"] += 1
            COUNTS["metric_bytes"] += len(body)
            COUNTS["bad"] += bad
        self.send_response(400 if bad else 200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(EMPTY_METRICS)))
        self.end_headers()
        self.wfile.write(EMPTY_METRICS)

    def log_message(self, format: str, *args: object) -> None:
        pass


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    print(server.server_address[1], flush=True)

    def stop(_sig: int, _frame: FrameType | None) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    server.serve_forever(poll_interval=0.5)
    with LOCK:
        print(json.dumps(COUNTS), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
