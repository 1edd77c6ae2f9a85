"""Benchmark of what the OTLP metrics export costs (blazar/adapters/otel/metrics.py, metrics_loop.py), once per
interval: on the event loop, taking the families from the projections (`metric_families`, what a /metrics scrape
builds before it writes its text, shown beside for scale); off the loop, in the export's thread, the SDK's collection
through the observable instruments and the histograms added (to an exporter that drops it), and a whole export to an
OTLP/HTTP receiver on 127.0.0.1 (encode, POST, the receiver's answer; the receiver runs in this process and decodes
each body too, so that figure is an upper bound).

The state: --models models, each with one instance and --requests completed streamed requests over 4 API keys (every
counter family, the gauges and the histograms have values). Each figure is the median of --repeat timed runs.

Run: `.venv/bin/python bench/otlp_metrics.py [--models 4] [--requests 200] [--repeat 200]`.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter  # noqa: E402
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData  # noqa: E402

from blazar.adapters.otel.metrics import FamilyExport  # noqa: E402
from blazar.adapters.otel.tracing import resource_for  # noqa: E402
from blazar.events import Event, Recorded  # noqa: E402
from blazar.events.instances import InstanceReady, InstanceStarted  # noqa: E402
from blazar.events.requests import (  # noqa: E402
    RequestAdmitted,
    RequestCompleted,
    RequestFirstToken,
    RequestReceived,
)
from blazar.projections import MetricsProjection, ResidencyProjection, fold  # noqa: E402
from blazar.queries.metrics import metric_families, prometheus_text  # noqa: E402
from tests.support.otlp_receiver import OtlpReceiver  # noqa: E402


class Dropping(MetricExporter):
    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000,
               **kwargs: object) -> MetricExportResult:
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: object) -> None:
        pass


def history(models: int, requests: int) -> list[Recorded]:
    """Per model: an instance started and ready, then `requests` streamed requests, each by one of 4 keys (the key
    is the envelope's actor, as the daemon records it)."""
    events: list[tuple[Event, str]] = []
    for m in range(models):
        model = f"model-{m}"
        events += [(InstanceStarted(instance_id=f"i{m}", model=model, engine_tag="b1", pid=1, port=40001 + m,
                                    argv=["llama-server"], log_path=f"instances/i{m}.log", ctx_tokens=4096,
                                    engine_ctx=8192, slots=2, planned_bytes=500 << 20, estimate_bytes=480 << 20),
                    "daemon"), (InstanceReady(instance_id=f"i{m}", model=model, load_ms=900), "daemon")]
        for r in range(requests):
            t, actor = f"{m:04x}{r:028x}", f"key:key-{r % 4}"
            events += [(RequestReceived(trace_id=t, dialect="openai", route="/v1/chat/completions", model=model,
                                        stream=True), actor),
                       (RequestAdmitted(trace_id=t, model=model, instance_id=f"i{m}", waited_ms=r % 50, slots=2,
                                        busy=1), actor),
                       (RequestFirstToken(trace_id=t, model=model, ttft_ms=50.0 + r % 400), actor),
                       (RequestCompleted(trace_id=t, model=model, duration_ms=900.0 + r, prompt_tokens=100,
                                         completion_tokens=40), actor)]
    return [Recorded(seq=i, ts=1000.0 + i, type=e.TYPE, v=e.V, stream=e.stream_key(),
                     trace_id=getattr(e, "trace_id", None), actor=actor, cause=None, event=e)
            for i, (e, actor) in enumerate(events, start=1)]


def median_us(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=int, default=4)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=200)
    args = ap.parse_args()
    records = history(args.models, args.requests)
    m, r = fold(MetricsProjection(), records), fold(ResidencyProjection(), records)
    live = {f"model-{i}": {"queued": 0, "busy": 1, "slots": 2} for i in range(args.models)}
    spans = {"exported": 10, "failed": 0, "dropped": 0, "queued": 0}

    def families() -> list[Any]:
        return metric_families(m, r, live=live, otlp=spans, otlp_metrics={"exported": 1, "failed": 0, "skipped": 0})

    fams = families()
    dropping = FamilyExport(Dropping(), resource_for("bench"), fams)
    receiver = OtlpReceiver()
    posting = FamilyExport(OTLPMetricExporter(endpoint=f"{receiver.url}/v1/metrics", timeout=10),
                           resource_for("bench"), fams)
    try:
        result = {
            "families": len(fams), "points": sum(len(f.samples) + len(f.series) for f in fams),
            "loop_families_us": round(median_us(families, args.repeat), 1),
            "metrics_text_us": round(median_us(lambda: prometheus_text(families()), args.repeat), 1),
            "thread_collect_us": round(median_us(lambda: dropping.export(fams, 10), args.repeat), 1),
            "thread_export_local_receiver_us": round(median_us(lambda: posting.export(fams, 10), args.repeat), 1),
            "python": platform.python_version(), "machine": platform.machine(),
        }
    finally:
        receiver.close()
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
