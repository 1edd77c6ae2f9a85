"""`/metrics`: the `metrics` and `residency` projections (and, from a running daemon, the admission snapshot) as
metric families (blazar/metric_families.py), rendered in the Prometheus text exposition format, version 0.0.4. The
OTLP metrics export sends the same families (blazar/adapters/otel/metrics.py).

Every family is announced with HELP and TYPE even when it has no sample yet, so dashboards and alerts can name it
from the first scrape. Histogram buckets are cumulative and end with le="+Inf", whose count equals `_count`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from blazar.adapters.engines.kinds import KINDS
from blazar.context import Blazar
from blazar.metric_families import Buckets, Family, Kind, Labels
from blazar.projections import metrics
from blazar.projections.metrics import BUCKETS, HistogramName, MetricsState, counter, histograms
from blazar.projections.residency import ResidencyState, instances, models_seen

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
INSTANCE_STATES = ("starting", "ready", "stopping")

_HISTOGRAMS: tuple[tuple[HistogramName, str, str], ...] = (
    ("ttft", "blazar_ttft_seconds", "Time from a streamed request's arrival to its first generated token, in "
     "seconds."),
    ("itl", "blazar_inter_token_latency_seconds",
     "Mean time between generated tokens after the first, per streamed request, in seconds."),
    ("queue_wait", "blazar_queue_wait_seconds", "Time a request waited for a slot before admission, in seconds."),
    ("refusal", "blazar_refusal_seconds", "Time from a refused request's arrival to its refusal, at the server, in "
     "seconds."),
    ("rtf", "blazar_audio_real_time_factor", "Speech requests' processing seconds per second of audio heard or made "
     "(under 1: faster than real time)."),
)


def escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def fmt_value(v: float) -> str:
    if isinstance(v, bool):
        return str(int(v))
    if isinstance(v, int):
        return str(v)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))


def fmt_le(bound: float) -> str:
    # The form client libraries write (0.005, 1.0, 60.0), so series from Blazar and from them line up.
    return "+Inf" if math.isinf(bound) else repr(float(bound))


def daemon_families(app: Blazar, admission: Mapping[str, Mapping[str, Any]]) -> list[Family]:
    """A running daemon's families now: the live projections, its admission snapshot (`Admission.snapshot()`) and
    the span export's counters where spans are exported. What `/metrics` shows and the OTLP metrics export sends."""
    live = {model: s for model, s in admission.items() if not model.startswith("_")}
    otlp = app.span_export_stats() if app.span_export_stats is not None else None
    sent = app.metric_export_stats() if app.metric_export_stats is not None else None
    return metric_families(app.runner.state("metrics"), app.runner.state("residency"), live=live, otlp=otlp,
                           otlp_metrics=sent)


def queue_depth(app: Blazar) -> dict[str, int]:
    """Requests queued now per model as far as the log knows (a running daemon's admission snapshot knows better)."""
    return dict(app.runner.state("metrics").queue_depth)


class _Writer:
    """Collects the families in the order they are announced; `sample` and `histogram` add to the last one."""

    def __init__(self) -> None:
        self.families: list[Family] = []

    def family(self, name: str, kind: Kind, help_text: str) -> None:
        self.families.append(Family(name, kind, help_text))

    def sample(self, name: str, labels: Iterable[tuple[str, str]], value: float) -> None:
        assert self.families[-1].name == name, f"{name} sampled outside its family"
        self.families[-1].samples.append((tuple((k, str(v)) for k, v in labels), value))

    def histogram(self, name: str, labels: Labels, buckets: Buckets) -> None:
        assert self.families[-1].name == name, f"{name} sampled outside its family"
        self.families[-1].series.append((labels, buckets))


def _line(name: str, labels: Iterable[tuple[str, str]], value: float) -> str:
    body = ",".join(f'{k}="{escape_label(v)}"' for k, v in labels)
    return f"{name}{{{body}}} {fmt_value(value)}" if body else f"{name} {fmt_value(value)}"


def prometheus_text(families: Iterable[Family]) -> str:
    """The exposition text of `families`: HELP and TYPE for each, then its samples; a histogram's buckets cumulative
    and ending with le="+Inf", whose count equals `_count`."""
    lines: list[str] = []
    for f in families:
        lines.append(f"# HELP {f.name} {escape_help(f.help)}")
        lines.append(f"# TYPE {f.name} {f.kind}")
        lines.extend(_line(f.name, labels, value) for labels, value in f.samples)
        for labels, h in f.series:
            cumulative = 0
            for bound, count in zip((*h.bounds, math.inf), h.counts, strict=True):
                cumulative += count
                lines.append(_line(f"{f.name}_bucket", (*labels, ("le", fmt_le(bound))), cumulative))
            lines.append(_line(f"{f.name}_sum", labels, h.sum))
            lines.append(_line(f"{f.name}_count", labels, h.count))
    return "\n".join(lines) + "\n"


def render_prometheus(metrics_state: MetricsState, residency_state: ResidencyState, *,
                      live: Mapping[str, Mapping[str, Any]] | None = None,
                      otlp: Mapping[str, int] | None = None, otlp_metrics: Mapping[str, int] | None = None) -> str:
    """The exposition text of `metric_families`."""
    return prometheus_text(metric_families(metrics_state, residency_state, live=live, otlp=otlp,
                                           otlp_metrics=otlp_metrics))


def metric_families(metrics_state: MetricsState, residency_state: ResidencyState, *,
                    live: Mapping[str, Mapping[str, Any]] | None = None,
                    otlp: Mapping[str, int] | None = None,
                    otlp_metrics: Mapping[str, int] | None = None) -> list[Family]:
    """Every family, in the order /metrics shows them. `live` ({model: {"queued", "busy", "slots"}}, from the
    admission controller of a running daemon) replaces the log's queue depth, which lags by the projection runner's
    poll and cannot see requests that a crash cut short, and adds the slot gauges. `otlp`, `otlp_metrics`: the span
    and metrics exports' counters, where they run."""
    w = _Writer()
    m = metrics_state

    w.family("blazar_requests_total", "counter", "Requests that ended, by model, HTTP status and API dialect.")
    for (status, dialect, model), n in counter(m, "requests"):
        w.sample("blazar_requests_total", (("model", model), ("status", status), ("dialect", dialect)), n)
    _histograms(w, m)
    _queue_and_slots(w, m, live)

    w.family("blazar_tokens_total", "counter", "Tokens of completed requests, by model and direction (in: prompt, "
             "out: completion).")
    for (direction, model), n in counter(m, "tokens"):
        w.sample("blazar_tokens_total", (("model", model), ("direction", direction)), n)

    w.family("blazar_key_requests_total", "counter", "Requests that ended, by API key and HTTP status.")
    for (status, name), n in counter(m, "key_requests"):
        w.sample("blazar_key_requests_total", (("key", name), ("status", status)), n)
    w.family("blazar_key_tokens_total", "counter", "Tokens of completed requests, by API key and direction (in: "
             "prompt, out: completion).")
    for (direction, name), n in counter(m, "key_tokens"):
        w.sample("blazar_key_tokens_total", (("key", name), ("direction", direction)), n)

    _instances(w, residency_state)

    w.family("blazar_loads_total", "counter", "Instance loads that ended, by model and outcome (ready, load_failed, "
             "load_timeout).")
    for (outcome, model), n in counter(m, "loads"):
        w.sample("blazar_loads_total", (("model", model), ("outcome", outcome)), n)
    w.family("blazar_evictions_total", "counter", "Instances chosen for eviction, by reason.")
    for (reason,), n in counter(m, "evictions"):
        w.sample("blazar_evictions_total", (("reason", reason),), n)
    w.family("blazar_engine_crashes_total", "counter", "Engine instances that crashed (exited on their own), "
             "by model.")
    for (model,), n in counter(m, "crashes"):
        w.sample("blazar_engine_crashes_total", (("model", model),), n)
    w.family("blazar_shared_requests_total", "counter", "Requests in a shared generation (single-flight), by model and "
             "role: leader (ran it), follower (got its answer), promoted (took it over when the leader left).")
    for (role, model), n in counter(m, "shared"):
        w.sample("blazar_shared_requests_total", (("model", model), ("role", role)), n)
    w.family("blazar_cache_hits_total", "counter", "Requests answered from the response cache (no engine asked), by "
             "model, key (\"\" for the owner) and source: exact (the same request again).")
    for (source, key_name, model), n in counter(m, "cache_hits"):
        w.sample("blazar_cache_hits_total", (("model", model), ("key", key_name), ("source", source)), n)
    w.family("blazar_session_turns_total", "counter", "Session turns by model and how they found the session's prefix: "
             "warm (still in its slot), restored (from the KV bank), cold.")
    for (kv, model), n in counter(m, "session_turns"):
        w.sample("blazar_session_turns_total", (("model", model), ("kv", kv)), n)
    w.family("blazar_route_requests_total", "counter", "Requests received, by the client's HTTP route.")
    for (route,), n in counter(m, "routes"):
        w.sample("blazar_route_requests_total", (("route", route),), n)
    w.family("blazar_audio_requests_total", "counter", "Speech requests completed, by model and route "
             "(transcriptions, translations, speech).")
    for (route, model), n in counter(m, "audio_requests"):
        w.sample("blazar_audio_requests_total", (("model", model), ("route", route)), n)
    w.family("blazar_audio_seconds_total", "counter", "Seconds of audio transcribed, translated or spoken, by model "
             "and route.")
    for (route, model), seconds in metrics.audio_seconds(m):
        w.sample("blazar_audio_seconds_total", (("model", model), ("route", route)), seconds)
    w.family("blazar_key_audio_seconds_total", "counter", "Seconds of audio of completed speech requests, by API key.")
    for name, seconds in sorted(m.key_audio_seconds.items()):
        w.sample("blazar_key_audio_seconds_total", (("key", name),), seconds)
    _spec(w, m)
    _energy(w, m)
    _otlp(w, otlp, _OTLP)
    _otlp(w, otlp_metrics, _OTLP_METRICS)
    return w.families


def _energy(w: _Writer, m: MetricsState) -> None:
    """Energy per request (blazar/serving/energy.py): the requests' shares of the machine's RAPL or NVML joules, and
    how many requests were measured or not (a machine that reports neither counter: every one `false`)."""
    w.family("blazar_energy_requests_total", "counter", "Completed requests by model and whether their energy was "
             "measured (false: the machine reports no RAPL or NVML counter that can be read).")
    for (measured, model), n in counter(m, "energy_requests"):
        w.sample("blazar_energy_requests_total", (("model", model), ("measured", str(measured == "measured").lower())),
                 n)
    w.family("blazar_energy_joules_total", "counter", "Joules of measured requests, by model: each request's share "
             "of the machine's energy over its span, split evenly among the requests in flight (machine-wide "
             "counters: idle draw and other programs included).")
    for model, joules in sorted(m.energy_joules.items()):
        w.sample("blazar_energy_joules_total", (("model", model),), joules)
    w.family("blazar_energy_completion_tokens_total", "counter", "Completion tokens of measured requests, by model "
             "(over blazar_energy_joules_total: tokens per joule).")
    for (model,), n in counter(m, "energy_tokens"):
        w.sample("blazar_energy_completion_tokens_total", (("model", model),), n)


def _spec(w: _Writer, m: MetricsState) -> None:
    """The speculation governor (blazar/serving/spec_governor.py): its switches, its verdict per instance it has
    switched, and requests on speculative instances by whether they could draft."""
    w.family("blazar_spec_switches_total", "counter", "Times the speculation governor turned speculative decoding "
             "on or off, by model and direction.")
    for (direction, model), n in counter(m, "spec_switches"):
        w.sample("blazar_spec_switches_total", (("model", model), ("to", direction)), n)
    w.family("blazar_spec_enabled", "gauge", "Whether speculative decoding is on (1) or turned off (0) by the "
             "governor, per running instance it has switched.")
    for iid, (model, on) in sorted(metrics.spec_enabled(m).items()):
        w.sample("blazar_spec_enabled", (("model", model), ("instance", iid)), on)
    w.family("blazar_spec_requests_total", "counter", "Requests on speculative instances, by model and whether they "
             "could draft (on, off_client: the client asked, off_governor: the governor had turned it off).")
    for (spec, model), n in counter(m, "spec_requests"):
        w.sample("blazar_spec_requests_total", (("model", model), ("spec", spec)), n)


_OTLP: tuple[tuple[str, str, Kind, str], ...] = (
    ("exported", "blazar_otlp_spans_exported_total", "counter", "Request spans the OTLP collector accepted."),
    ("failed", "blazar_otlp_spans_failed_total", "counter",
     "Request spans in OTLP exports that failed (the collector refused them or could not be reached)."),
    ("dropped", "blazar_otlp_spans_dropped_total", "counter",
     "Request spans dropped before export because the export queue was full (a slow or dead collector)."),
    ("queued", "blazar_otlp_queue_spans", "gauge", "Request spans waiting in the OTLP export queue."),
)

_OTLP_METRICS: tuple[tuple[str, str, Kind, str], ...] = (
    ("exported", "blazar_otlp_metric_exports_total", "counter", "OTLP metrics exports the collector accepted."),
    ("failed", "blazar_otlp_metric_exports_failed_total", "counter",
     "OTLP metrics exports that failed (the collector refused them or could not be reached)."),
    ("skipped", "blazar_otlp_metric_exports_skipped_total", "counter",
     "OTLP metrics exports not made because the one before was still out (a slow or hanging collector)."),
)


def _otlp(w: _Writer, stats: Mapping[str, int] | None, families: tuple[tuple[str, str, Kind, str], ...]) -> None:
    """Announced always; sampled only while the export runs (spans: otlp_endpoint set; metrics: and otlp_metrics)."""
    for key, name, kind, help_text in families:
        w.family(name, kind, help_text)
        if stats is not None:
            w.sample(name, (), stats.get(key, 0))


def _histograms(w: _Writer, m: MetricsState) -> None:
    """One histogram family per entry of `_HISTOGRAMS`, a series per model."""
    for name, metric, help_text in _HISTOGRAMS:
        w.family(metric, "histogram", help_text)
        for model, h in histograms(m, name):
            w.histogram(metric, (("model", model),), Buckets(BUCKETS[name], tuple(h.counts), h.sum, h.count))


def _queue_and_slots(w: _Writer, m: MetricsState, live: Mapping[str, Mapping[str, Any]] | None) -> None:
    """The queue depth gauge (from `live` when given, else the log's), and the slot gauges only `live` knows."""
    depth = m.queue_depth
    if live is not None:
        live = {model: s for model, s in live.items() if not model.startswith("_")}  # "_global" is no model
        # NOTE: the snapshot is the truth while a daemon runs; a model it does not list has nobody waiting.
        depth = {model: 0 for model in depth} | {model: int(s.get("queued", 0)) for model, s in live.items()}
    w.family("blazar_queue_depth", "gauge", "Requests waiting for a slot now, by model.")
    for model, n in sorted(depth.items()):
        w.sample("blazar_queue_depth", (("model", model),), n)
    if live is not None:
        w.family("blazar_slots_busy", "gauge", "Slots serving a request now, by model.")
        for model, s in sorted(live.items()):
            w.sample("blazar_slots_busy", (("model", model),), int(s.get("busy", 0)))
        w.family("blazar_slots", "gauge", "Slots of the loaded instances, by model.")
        for model, s in sorted(live.items()):
            w.sample("blazar_slots", (("model", model),), int(s.get("slots", 0)))


def _instances(w: _Writer, residency: ResidencyState) -> None:
    """Instance gauges from `residency`, the projection `blazar ps` and the supervisor read, so they agree. A model
    ever loaded keeps its series at 0 once unloaded instead of vanishing."""
    models = models_seen(residency)
    count: dict[tuple[str, str], int] = {}
    planned: dict[str, int] = {}
    measured: dict[str, int] = {}
    kinds: dict[str, int] = {}
    for inst in instances(residency):
        model = inst.model
        models.add(model)
        kinds[inst.kind] = kinds.get(inst.kind, 0) + 1
        count[model, inst.state] = count.get((model, inst.state), 0) + 1
        planned[model] = planned.get(model, 0) + inst.planned_bytes
        if inst.measured_bytes is not None:
            measured[model] = measured.get(model, 0) + inst.measured_bytes
    w.family("blazar_instances", "gauge", "Engine instances now, by model and state (starting, ready, stopping).")
    for model in sorted(models):
        for state in INSTANCE_STATES:
            w.sample("blazar_instances", (("model", model), ("state", state)), count.get((model, state), 0))
    w.family("blazar_instances_by_kind", "gauge", "Engine instances now, by engine kind (llama-server, whisper, "
             "piper).")
    for kind in KINDS if models else ():  # once anything was loaded, every kind has its series (0 when none runs)
        w.sample("blazar_instances_by_kind", (("kind", kind),), kinds.get(kind, 0))
    w.family("blazar_instance_planned_bytes", "gauge", "Memory the fit plan reserved for the running instances, "
             "by model.")
    for model in sorted(models):
        w.sample("blazar_instance_planned_bytes", (("model", model),), planned.get(model, 0))
    w.family("blazar_instance_measured_bytes", "gauge", "Memory the engine reported allocating, for running "
             "instances that were measured, by model.")
    for model, n in sorted(measured.items()):
        w.sample("blazar_instance_measured_bytes", (("model", model),), n)
