"""Request tracing wired to the log: a listener on this process's commits folds request events into spans
(blazar/projections/spans.py) and hands each finished request's spans to the export (export.py). It runs after the
group commit, once per batch, never per streamed token. Only the composition root makes one (`start_tracing`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from opentelemetry.sdk.resources import Resource

from blazar.adapters.otel.export import SpanExport, SpanExporterPort
from blazar.adapters.otel.target import OtlpTarget
from blazar.events.base import Recorded
from blazar.events.log import EventLog
from blazar.projections.spans import SpanFold

log = logging.getLogger("blazar.otel")

# Seconds one export may take (the exporter's own retries included) before it counts as failed.
EXPORT_TIMEOUT_S = 10.0
# Seconds `close` gives the queued spans to reach the collector when the daemon stops.
CLOSE_TIMEOUT_S = 5.0


class Tracing:
    def __init__(self, fold: SpanFold, export: SpanExport, target: OtlpTarget | None = None) -> None:
        self.fold = fold
        self.export = export
        self.target = target
        self.fold_errors = 0
        self._unsubscribe: Callable[[], None] = lambda: None

    def attach(self, event_log: EventLog) -> None:
        self._unsubscribe = event_log.subscribe(self.on_commit)

    def on_commit(self, recorded: Sequence[Recorded]) -> None:
        """A batch just committed. NOTE: it runs inside the log's commit: nothing here may raise into it."""
        try:
            trees = self.fold.feed(recorded)
            if trees:
                self.export.offer(trees)
        except Exception:
            self.fold_errors += 1
            if self.fold_errors == 1:
                log.exception("folding request events into spans failed")

    def stats(self) -> dict[str, int]:
        """The counters /metrics shows."""
        return {"exported": self.export.exported, "failed": self.export.failed, "dropped": self.export.dropped,
                "queued": self.export.queued, "abandoned": self.fold.abandoned}

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        self._unsubscribe()
        self.export.close(timeout_s)


class _Sparse(logging.Filter):
    """One record per message a minute: against a dead collector every export fails, and the SDK says so each time
    (the counters in /metrics keep the tally)."""

    def __init__(self, every_s: float = 60.0) -> None:
        super().__init__()
        self.every_s = every_s
        self._last: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        now, key = time.monotonic(), str(record.msg)  # the template: a small, fixed set
        if now - self._last.get(key, -self.every_s) < self.every_s:
            return False
        self._last[key] = now
        return True


def quiet_sdk_logs(name: str = "opentelemetry.exporter.otlp.proto.http.trace_exporter") -> None:
    sdk = logging.getLogger(name)
    if not any(isinstance(f, _Sparse) for f in sdk.filters):
        sdk.addFilter(_Sparse())


def resource_for(version: str) -> Resource:
    """service.name "blazar" (OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES, read by the SDK, may override it)."""
    return Resource.create({"service.name": "blazar", "service.version": version})


def start_tracing(event_log: EventLog, target: OtlpTarget, *, exporter: SpanExporterPort | None = None) -> Tracing:
    """Subscribe the fold to `event_log` and start the export thread towards `target` (or `exporter`, in tests)."""
    from blazar import __version__

    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=target.endpoint, headers=target.headers, timeout=EXPORT_TIMEOUT_S)
    quiet_sdk_logs()
    tracing = Tracing(SpanFold(), SpanExport(exporter, resource_for(__version__)), target)
    tracing.attach(event_log)
    log.info("exporting request spans to %s (%s)", target.endpoint, target.source)
    return tracing
