"""The OTLP metrics export: every family /metrics shows goes out with its type, labels and values (read back from
/metrics' own text and from a real OTLP/HTTP receiver's protobuf, so a family added later cannot be missed); where
metrics go beside the spans (config, then OTEL_* env); the loop's exports, its last one on close, and a collector
that hangs costing the loop nothing."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData

from blazar import config
from blazar.adapters.otel.metrics import FamilyExport, unit_of
from blazar.adapters.otel.metrics_loop import MetricsLoop
from blazar.adapters.otel.target import otlp_target
from blazar.adapters.otel.tracing import resource_for
from blazar.config import Settings
from blazar.errors import ConfigError
from blazar.metric_families import Family
from blazar.projections import MetricsProjection, ResidencyProjection
from blazar.queries.metrics import metric_families, render_prometheus
from tests.support.otlp_receiver import OtlpReceiver
from tests.unit.projections.test_metrics import FAMILIES, parse, states

RESOURCE = resource_for("test")
LIVE = {"gemma": {"queued": 2, "busy": 1, "slots": 2}, "qwen": {"queued": 0, "busy": 0, "slots": 1}}
SPANS = {"exported": 7, "failed": 1, "dropped": 0, "queued": 3}
SENT = {"exported": 4, "failed": 2, "skipped": 1}
_OTLP_TYPES = {"counter": "sum", "gauge": "gauge", "histogram": "histogram"}


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver()
    yield r
    r.close()


def export_to(receiver: OtlpReceiver, announced: Sequence[Family]) -> FamilyExport:
    return FamilyExport(OTLPMetricExporter(endpoint=f"{receiver.url}/v1/metrics", timeout=10), RESOURCE, announced)


def _key(labels: dict[str, str]) -> frozenset[tuple[str, str]]:
    return frozenset(labels.items())


def test_every_family_of_metrics_goes_out_over_otlp_with_its_type_labels_and_values(receiver: OtlpReceiver) -> None:
    m, r = states()
    # The instruments come from what /metrics announces on an empty log (every family, none with a value yet).
    announced = metric_families(MetricsProjection().initial(), ResidencyProjection().initial(), live={}, otlp={})
    export = export_to(receiver, announced)
    text = parse(render_prometheus(m, r, live=LIVE, otlp=SPANS, otlp_metrics=SENT))
    assert {n: f["type"] for n, f in text.items()} == FAMILIES | {"blazar_slots_busy": "gauge", "blazar_slots": "gauge"}
    assert export.instruments == {n: f["type"] for n, f in text.items()}  # one instrument per family, its kind

    export.export(metric_families(m, r, live=LIVE, otlp=SPANS, otlp_metrics=SENT), timeout_s=10)
    got = receiver.last_metrics()
    assert got is not None
    sampled = {n for n, f in text.items() if f["samples"]}
    assert set(got) == sampled and len(sampled) > len(text) // 2  # the story gives most families a value
    for name in sampled:
        family, metric = text[name], got[name]
        assert metric["type"] == _OTLP_TYPES[family["type"]], name
        assert metric["description"] == family["help"] and metric["unit"] == unit_of(name)
        assert metric["resource"]["service.name"] == "blazar" and metric["scope"] == "blazar"
        if family["type"] == "histogram":
            assert metric["temporality"] == 2  # cumulative
            assert_histogram(family, metric["points"])
            continue
        if family["type"] == "counter":
            assert metric["monotonic"] and metric["temporality"] == 2
        want = {_key(labels): v for _, labels, v in family["samples"]}
        assert {_key(p["attributes"]): p["value"] for p in metric["points"]} == want, name


def assert_histogram(family: dict[str, Any], points: list[dict[str, Any]]) -> None:
    """Each series: /metrics' cumulative `le` buckets are OTLP's per-bucket counts summed, the bounds the same."""
    name = family["samples"][0][0].removesuffix("_bucket")
    by_model: dict[str, dict[str, Any]] = {}
    for sample, labels, v in family["samples"]:
        series = by_model.setdefault(labels["model"], {"le": []})
        if sample == f"{name}_bucket":
            series["le"].append((float(labels["le"]), v))
        else:
            series[sample.removeprefix(name)] = v
    assert len(points) == len(by_model)
    for p in points:
        series = by_model[p["attributes"]["model"]]
        assert p["count"] == series["_count"] and p["sum"] == pytest.approx(series["_sum"])
        assert p["explicit_bounds"] == [le for le, _ in series["le"][:-1]]  # all but +Inf
        cumulative = [sum(p["bucket_counts"][: i + 1]) for i in range(len(p["bucket_counts"]))]
        assert cumulative == [v for _, v in series["le"]]
        assert not p["has_min_max"]  # the buckets do not know them: left unset, not made up


def test_a_family_with_no_value_sends_nothing_and_the_span_families_only_while_spans_go(
        receiver: OtlpReceiver) -> None:
    m, r = states()
    export = export_to(receiver, metric_families(m, r, live={}, otlp={}))
    export.export(metric_families(m, r, live=LIVE, otlp=None), timeout_s=10)
    got = receiver.last_metrics()
    assert got is not None and "blazar_requests_total" in got
    assert not [n for n in got if n.startswith("blazar_otlp_")]
    assert "blazar_instance_measured_bytes" not in got  # announced, never measured: no point


def test_the_metrics_exports_own_counters_are_sampled_only_while_it_runs() -> None:
    m, r = MetricsProjection().initial(), ResidencyProjection().initial()
    assert not parse(render_prometheus(m, r))["blazar_otlp_metric_exports_total"]["samples"]
    fams = parse(render_prometheus(m, r, otlp_metrics=SENT))
    assert [(n, v) for n in ("blazar_otlp_metric_exports_total", "blazar_otlp_metric_exports_failed_total",
                             "blazar_otlp_metric_exports_skipped_total") for _, _, v in fams[n]["samples"]] == \
        [("blazar_otlp_metric_exports_total", 4), ("blazar_otlp_metric_exports_failed_total", 2),
         ("blazar_otlp_metric_exports_skipped_total", 1)]


def test_the_histograms_go_even_when_no_counter_or_gauge_has_a_value(receiver: OtlpReceiver) -> None:
    m, r = states()
    families = metric_families(m, r)
    export = export_to(receiver, families)
    only = [f for f in families if f.kind == "histogram" and f.series]
    export.export(only, timeout_s=10)
    got = receiver.last_metrics()
    assert got is not None and set(got) == {f.name for f in only}


def test_the_metrics_go_beside_the_spans_from_the_config_or_the_environment() -> None:
    def url(values: dict[str, Any], env: dict[str, str]) -> str | None:
        t = otlp_target(config.build(values) if values else Settings(), env, "metrics")
        return None if t is None else t.endpoint

    assert url({}, {}) is None
    assert url({"telemetry.otlp_endpoint": "http://c:4318"}, {}) == "http://c:4318/v1/metrics"
    assert url({"telemetry.otlp_endpoint": "https://c/otel/v1/traces"}, {}) == "https://c/otel/v1/metrics"
    # A proxy's own route for the spans: where metrics go is not guessed, unless the environment names it.
    assert url({"telemetry.otlp_endpoint": "https://c/custom"}, {}) is None
    assert url({"telemetry.otlp_endpoint": "https://c/custom"}, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"}) is None
    assert url({"telemetry.otlp_endpoint": "https://c/custom"},
               {"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://m/in"}) == "http://m/in"
    assert url({}, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"}) == "http://c:4318/v1/metrics"
    assert url({}, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}) is None  # spans only
    on = {"telemetry.otlp_endpoint": "http://c:4318"}
    assert url({**on, "telemetry.otlp_metrics": False}, {}) is None
    assert url(on, {"OTEL_SDK_DISABLED": "true"}) is None
    assert otlp_target(config.build({**on, "telemetry.otlp_metrics": False}), {}) is not None  # the spans go on
    t = otlp_target(config.build({**on, "telemetry.otlp_headers": {"a": "2"}}),
                    {"OTEL_EXPORTER_OTLP_METRICS_HEADERS": "a=1,b=1", "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "c=1"},
                    "metrics")
    assert t is not None and t.headers == {"a": "2", "b": "1"}


def test_the_metrics_keys_are_validated_like_every_config_key() -> None:
    assert config.parse_value("telemetry.otlp_metrics_interval_s", "0.5") == 0.5
    assert config.parse_value("telemetry.otlp_metrics", "false") is False
    assert Settings().telemetry.otlp_metrics_interval_s == 60.0 and Settings().telemetry.otlp_metrics
    for bad in ("0", "-1", "1e9", "often"):
        with pytest.raises(ConfigError, match="otlp_metrics_interval_s"):
            config.parse_value("telemetry.otlp_metrics_interval_s", bad)


class Recording(MetricExporter):
    """Keeps each export's {name: [values]}; `hold` makes every export wait until released (a collector that
    hangs)."""

    def __init__(self, hold: bool = False) -> None:
        super().__init__()
        self.exports: list[dict[str, list[float]]] = []
        self.release = threading.Event()
        self.hold = hold

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000,
               **kwargs: object) -> MetricExportResult:
        if self.hold:
            self.release.wait(30)
        self.exports.append({m.name: [getattr(p, "value", None) for p in m.data.data_points]
                             for rm in metrics_data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics})
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: object) -> None:
        pass


def counter(value: int) -> list[Family]:
    return [Family("blazar_x_total", "counter", "x", samples=[((("model", "m"),), value)])]


async def test_the_loop_exports_every_interval_and_its_last_values_on_close() -> None:
    recording = Recording()
    now = [1]
    loop = MetricsLoop(FamilyExport(recording, RESOURCE, counter(0)), lambda: counter(now[0]), interval_s=0.01)
    task = asyncio.create_task(loop.run())
    for _ in range(500):  # bounded: two exports, however slow the machine
        if len(recording.exports) >= 2:
            break
        await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert len(recording.exports) >= 2 and recording.exports[0] == {"blazar_x_total": [1]}
    now[0] = 5
    await loop.close(timeout_s=10)
    assert recording.exports[-1] == {"blazar_x_total": [5]}  # the last values left at stop
    assert loop.stats()["exported"] == len(recording.exports) and loop.stats()["failed"] == 0


async def test_a_collector_that_hangs_holds_one_thread_and_never_the_loop() -> None:
    hanging = Recording(hold=True)
    loop = MetricsLoop(FamilyExport(hanging, RESOURCE, counter(0)), lambda: counter(1), interval_s=60)
    try:
        assert await loop.send(timeout_s=0.05) is False  # still out: the loop goes on
        assert await loop.send(timeout_s=0.05) is False and loop.skipped == 1  # no second thread behind it
        await loop.close(timeout_s=0.1)  # bounded: the hanging export is left behind
        assert hanging.exports == []
    finally:
        hanging.release.set()
