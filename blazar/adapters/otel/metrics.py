"""/metrics' families over OTLP, through the OpenTelemetry SDK's metrics API: a MeterProvider whose reader exports
through OTLPMetricExporter, an observable counter or gauge per counter or gauge family, whose callbacks read the
families being exported. The SDK has no observable histogram, and a histogram instrument wants each value as it
happens, which the families do not hold (only per-bucket counts, folded from the log): a histogram family's series
are added to the export as OTLP histogram points, counts per bucket with the same bounds, sum and count, as they are.

Everything is cumulative, as in /metrics: since the log began (a restart starts no counter again: the log is
replayed), the start time being when this export started. `FamilyExport.export` is blocking: it runs in a thread of
its own (metrics_loop.py), never on the event loop.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import cast

from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from blazar.metric_families import Family

# The unit of a family, from its name's suffix (UCUM, as OpenTelemetry writes them); a count has none.
_UNITS = (("_seconds", "s"), ("_seconds_total", "s"), ("_bytes", "By"), ("_joules_total", "J"))

# A histogram's min and max: the buckets do not hold them. None leaves the OTLP fields unset (they are optional there;
# the SDK's point type says float because its own histograms always know them).
_UNKNOWN = cast(float, None)


def unit_of(name: str) -> str:
    return next((unit for suffix, unit in _UNITS if name.endswith(suffix)), "")


def histogram_metric(family: Family, start_ns: int, now_ns: int) -> Metric:
    """A histogram family as an OTLP histogram: per series, the counts per bucket (OTLP's are not cumulative either,
    one more than the bounds, each bucket's upper bound inclusive as Prometheus' `le`), sum and count."""
    points = [HistogramDataPoint(attributes=dict(labels), start_time_unix_nano=start_ns, time_unix_nano=now_ns,
                                 count=h.count, sum=h.sum, bucket_counts=list(h.counts),
                                 explicit_bounds=list(h.bounds), min=_UNKNOWN, max=_UNKNOWN)
              for labels, h in family.series]
    return Metric(name=family.name, description=family.help, unit=unit_of(family.name),
                  data=Histogram(data_points=points, aggregation_temporality=AggregationTemporality.CUMULATIVE))


class _WithHistograms(MetricExporter):
    """The exporter the SDK's reader hands its collection to: it adds the histogram families' points, sends it all
    through the OTLP exporter, and counts the outcome."""

    def __init__(self, inner: MetricExporter, histograms: Callable[[], list[Metric]],
                 scope: InstrumentationScope, resource: Resource) -> None:
        super().__init__()  # cumulative for every instrument, whatever the environment prefers: /metrics' sums
        self.inner, self._histograms, self._scope, self._resource = inner, histograms, scope, resource
        self.calls = self.exported = self.failed = 0

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000,
               **kwargs: object) -> MetricExportResult:
        self.calls += 1
        extra = self._histograms()
        if extra:
            metrics_data = self._joined(metrics_data, extra)
        try:
            result = self.inner.export(metrics_data, timeout_millis=timeout_millis)
        except Exception:  # an exporter bug must not end the export: it counts as a failed one
            result = MetricExportResult.FAILURE
        if result is MetricExportResult.SUCCESS:
            self.exported += 1
        else:
            self.failed += 1
        return result

    def _joined(self, data: MetricsData, extra: list[Metric]) -> MetricsData:
        """`extra` in the blazar scope of the collection (or in a new one, where no instrument had a value)."""
        resources = list(data.resource_metrics) or [ResourceMetrics(self._resource, [], "")]
        first = resources[0]
        scopes = list(first.scope_metrics)
        mine = next((i for i, s in enumerate(scopes) if s.scope == self._scope), None)
        if mine is None:
            scopes.append(ScopeMetrics(self._scope, extra, ""))
        else:
            scopes[mine] = ScopeMetrics(self._scope, [*scopes[mine].metrics, *extra], scopes[mine].schema_url)
        resources[0] = ResourceMetrics(first.resource, scopes, first.schema_url)
        return MetricsData(resources)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self.inner.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: object) -> None:
        given = kwargs.get("timeout")  # what the SDK's reader passes: the milliseconds left of its own bound
        self.inner.shutdown(timeout_millis=float(given) if isinstance(given, int | float) else timeout_millis)


class FamilyExport:
    """The SDK side: instruments made once from the families /metrics announces, then `export(families)` per
    collection (the callbacks read exactly those families, so one export is one consistent snapshot)."""

    def __init__(self, exporter: MetricExporter, resource: Resource, announced: Iterable[Family]) -> None:
        from blazar import __version__

        self._lock = threading.Lock()  # one collection at a time: the snapshot is the collection's
        self._now: dict[str, Family] = {}
        self._histograms: list[str] = []
        self.start_ns = time.time_ns()
        scope = InstrumentationScope("blazar", __version__)
        self.sink = _WithHistograms(exporter, self._histogram_metrics, scope, resource)
        # NOTE: no interval: the daemon's loop decides when (metrics_loop.py), and takes the snapshot on the loop.
        self._reader = PeriodicExportingMetricReader(self.sink, export_interval_millis=math.inf)
        # Closed by the daemon (`shutdown`), not at exit: its last export is bounded there.
        self._provider = MeterProvider(resource=resource, metric_readers=[self._reader], shutdown_on_exit=False)
        meter = self._provider.get_meter(scope.name, scope.version)
        self.instruments: dict[str, str] = {}  # family name → its kind, as made
        for f in announced:
            if f.kind == "histogram":
                self._histograms.append(f.name)
            elif f.kind == "counter":
                meter.create_observable_counter(f.name, [partial(self._observe, f.name)], unit_of(f.name), f.help)
            else:
                meter.create_observable_gauge(f.name, [partial(self._observe, f.name)], unit_of(f.name), f.help)
            self.instruments[f.name] = f.kind

    def _observe(self, name: str, options: CallbackOptions) -> Iterable[Observation]:
        family = self._now.get(name)
        return [] if family is None else [Observation(value, dict(labels)) for labels, value in family.samples]

    def _histogram_metrics(self) -> list[Metric]:
        now = time.time_ns()
        return [histogram_metric(f, self.start_ns, now) for name in self._histograms
                if (f := self._now.get(name)) is not None and f.series]

    def export(self, families: Sequence[Family], timeout_s: float) -> None:
        """Collect `families` and send them (blocking). A family not announced at the start has no instrument and
        is not sent (none is added at run time: the list is fixed by the code)."""
        with self._lock:
            self._now = {f.name: f for f in families}
            try:
                calls = self.sink.calls
                self._reader.collect(timeout_millis=timeout_s * 1000)
                if self.sink.calls == calls and self._histogram_metrics():
                    # No counter or gauge had a value, so the SDK exported nothing: the histograms go alone.
                    self.sink.export(MetricsData([]), timeout_millis=timeout_s * 1000)
            finally:
                self._now = {}

    def shutdown(self, timeout_s: float) -> None:
        self._provider.shutdown(timeout_millis=timeout_s * 1000)
