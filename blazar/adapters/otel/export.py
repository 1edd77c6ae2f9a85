"""The span export: a bounded queue the event loop hands finished spans to (never blocking, never doing I/O) and one
thread that turns them into the SDK's ReadableSpans and sends them in batches through an OTLP exporter. When the
queue is full, a request's spans are dropped whole and counted; a failed export is counted, never retried beyond
what the exporter itself does. A dead or hanging collector therefore costs requests nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Protocol

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.status import Status, StatusCode

from blazar.projections.spans import Span

log = logging.getLogger("blazar.otel")

MAX_QUEUE_SPANS = 8192
MAX_BATCH_SPANS = 512
EXPORT_INTERVAL_S = 1.0
_KINDS = {"server": SpanKind.SERVER, "internal": SpanKind.INTERNAL}
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)


class SpanExporterPort(Protocol):
    """What the SDK's exporters are (OTLPSpanExporter, InMemorySpanExporter)."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult: ...

    def shutdown(self) -> None: ...


def to_readable(span: Span, resource: Resource, scope: InstrumentationScope) -> ReadableSpan:
    """Our span as the SDK's ReadableSpan, with its own ids and times (a Tracer would pick both itself).

    NOTE: built directly rather than through a Tracer: the ids and the times are the log's, decided before."""
    trace_id = int(span.trace_id, 16)
    parent = None
    if span.parent_span_id is not None:
        # The request span's parent is the client's (remote); the children's is the request span.
        parent = SpanContext(trace_id, int(span.parent_span_id, 16), is_remote=span.kind == "server",
                             trace_flags=_SAMPLED)
    return ReadableSpan(
        name=span.name,
        context=SpanContext(trace_id, int(span.span_id, 16), is_remote=False, trace_flags=_SAMPLED),
        parent=parent, resource=resource, attributes=span.attributes,
        events=[Event(e.name, e.attributes, e.time_ns) for e in span.events],
        kind=_KINDS[span.kind],
        status=Status(StatusCode.ERROR, span.error) if span.error else Status(StatusCode.UNSET),
        start_time=span.start_ns, end_time=span.end_ns, instrumentation_scope=scope,
    )


class SpanExport:
    """`offer` on the event loop; the thread does the rest. `close` sends what is queued, within a bound."""

    def __init__(self, exporter: SpanExporterPort, resource: Resource, *, max_queue: int = MAX_QUEUE_SPANS,
                 max_batch: int = MAX_BATCH_SPANS, interval_s: float = EXPORT_INTERVAL_S) -> None:
        from blazar import __version__

        self._exporter = exporter
        self._resource = resource
        self._scope = InstrumentationScope("blazar", __version__)
        self.max_queue, self.max_batch, self.interval_s = max_queue, max_batch, interval_s
        self._queue: deque[Span] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._busy = False  # a batch is out with the exporter
        self._hurry = False  # a flush waits: send what is queued without gathering more
        self.exported = 0  # spans the collector accepted
        self.failed = 0  # spans in exports that failed (the collector refused, or was unreachable)
        self.dropped = 0  # spans dropped because the queue was full
        self._thread = threading.Thread(target=self._run, name="blazar-otlp-export", daemon=True)
        self._thread.start()

    @property
    def queued(self) -> int:
        return len(self._queue)

    def offer(self, trees: Iterable[Sequence[Span]]) -> None:
        """Queue each request's spans, or drop them whole when they do not fit. Never blocks."""
        with self._cond:
            for tree in trees:
                if self._stopping or len(self._queue) + len(tree) > self.max_queue:
                    if self.dropped == 0:
                        log.warning("the OTLP export queue is full (%d spans): dropping spans", self.max_queue)
                    self.dropped += len(tree)
                    continue
                self._queue.extend(tree)
            if len(self._queue) >= self.max_batch:
                self._cond.notify()

    def _take(self) -> list[Span] | None:
        """The next batch once it is full or `interval_s` passed; None when stopping and nothing is left."""
        with self._cond:
            deadline = time.monotonic() + self.interval_s
            while not self._stopping and not (self._hurry and self._queue) and len(self._queue) < self.max_batch:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            if not self._queue:
                return None if self._stopping else []
            self._busy = True
            return [self._queue.popleft() for _ in range(min(self.max_batch, len(self._queue)))]

    def _run(self) -> None:
        while (batch := self._take()) is not None:
            if batch:
                self._send(batch)
            with self._cond:
                self._busy = False
                self._cond.notify_all()

    def _send(self, batch: list[Span]) -> None:
        try:
            result = self._exporter.export([to_readable(s, self._resource, self._scope) for s in batch])
        except Exception:  # an exporter bug must not end the thread: the export goes on with the next batch
            log.exception("exporting %d spans failed", len(batch))
            result = SpanExportResult.FAILURE
        if result is SpanExportResult.SUCCESS:
            self.exported += len(batch)
        else:
            if self.failed == 0:
                log.warning("an OTLP export of %d spans failed (the collector refused it or is unreachable)",
                            len(batch))
            self.failed += len(batch)

    def flush(self, timeout_s: float) -> bool:
        """Wait until everything queued so far was sent (or failed); False when `timeout_s` ran out first."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._hurry = True
            self._cond.notify_all()
            try:
                while self._queue or self._busy:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    self._cond.wait(left)
            finally:
                self._hurry = False
        return True

    def close(self, timeout_s: float) -> None:
        """Send what is queued within `timeout_s`, then stop; a collector that hangs is left behind (the thread is
        a daemon thread), its spans counted as dropped."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout_s)
        with self._cond:
            left, self._queue = len(self._queue), deque()
            self.dropped += left
        self._exporter.shutdown()
