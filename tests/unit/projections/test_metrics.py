"""The metrics projection fed request and instance events, and its Prometheus text rendering: every family with HELP
and TYPE, cumulative buckets, the right counts, escaped labels, the live admission snapshot laid over the log."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blazar.events import Event, Recorded
from blazar.events.audio import RequestAudio
from blazar.events.instances import InstanceEvicted, InstanceExited, InstanceReady, InstanceStarted
from blazar.events.models import InstanceMemoryMeasured
from blazar.events.requests import (
    RequestAdmitted,
    RequestCacheHit,
    RequestCompleted,
    RequestEnergy,
    RequestFailed,
    RequestFirstToken,
    RequestQueued,
    RequestReceived,
    RequestRejected,
)
from blazar.events.tuning import SpecSwitched
from blazar.projections import MetricsProjection, ResidencyProjection, TracesProjection, fold
from blazar.projections import metrics as metrics_mod
from blazar.projections import traces as traces_mod
from blazar.projections.metrics import (
    ITL_BUCKETS_S,
    QUEUE_WAIT_BUCKETS_S,
    REFUSAL_BUCKETS_S,
    TTFT_BUCKETS_S,
    MetricsState,
)
from blazar.projections.residency import ResidencyState
from blazar.queries.metrics import escape_label, render_prometheus
from tests.support.events import rec
from tests.support.states import state_bytes, through_checkpoint

MiB = 1 << 20
FAMILIES = {
    "blazar_requests_total": "counter", "blazar_ttft_seconds": "histogram",
    "blazar_inter_token_latency_seconds": "histogram", "blazar_queue_wait_seconds": "histogram",
    "blazar_refusal_seconds": "histogram",
    "blazar_queue_depth": "gauge", "blazar_tokens_total": "counter", "blazar_instances": "gauge",
    "blazar_instances_by_kind": "gauge",
    "blazar_instance_planned_bytes": "gauge", "blazar_instance_measured_bytes": "gauge",
    "blazar_loads_total": "counter", "blazar_evictions_total": "counter", "blazar_engine_crashes_total": "counter",
    "blazar_shared_requests_total": "counter", "blazar_session_turns_total": "counter",
    "blazar_cache_hits_total": "counter",
    "blazar_key_requests_total": "counter", "blazar_key_tokens_total": "counter",
    "blazar_otlp_spans_exported_total": "counter", "blazar_otlp_spans_failed_total": "counter",
    "blazar_otlp_spans_dropped_total": "counter", "blazar_otlp_queue_spans": "gauge",
    "blazar_otlp_metric_exports_total": "counter", "blazar_otlp_metric_exports_failed_total": "counter",
    "blazar_otlp_metric_exports_skipped_total": "counter",
    "blazar_audio_real_time_factor": "histogram", "blazar_route_requests_total": "counter",
    "blazar_audio_requests_total": "counter", "blazar_audio_seconds_total": "counter",
    "blazar_key_audio_seconds_total": "counter",
    "blazar_spec_switches_total": "counter", "blazar_spec_enabled": "gauge", "blazar_spec_requests_total": "counter",
    "blazar_energy_requests_total": "counter", "blazar_energy_joules_total": "counter",
    "blazar_energy_completion_tokens_total": "counter",
}


def render(m: MetricsState, r: ResidencyState, **kw: Any) -> str:
    """/metrics over folded states, as the runner holds them."""
    return render_prometheus(m, r, **kw)



def received(trace: str, model: str = "gemma", dialect: str = "openai", stream: bool = True) -> RequestReceived:
    return RequestReceived(trace_id=trace, dialect=dialect, route="/v1/chat/completions", model=model,  # type: ignore[arg-type]
                           stream=stream)


def admitted(trace: str, waited_ms: float = 0.0, model: str = "gemma") -> RequestAdmitted:
    return RequestAdmitted(trace_id=trace, model=model, instance_id="i1", waited_ms=waited_ms, slots=2, busy=1)


def queued(trace: str, model: str = "gemma") -> RequestQueued:
    return RequestQueued(trace_id=trace, model=model, position=1, depth=1, slots=2, busy=2)


def done(trace: str, duration_ms: float, out: int | None, prompt: int = 10, model: str = "gemma") -> RequestCompleted:
    return RequestCompleted(trace_id=trace, model=model, duration_ms=duration_ms, prompt_tokens=prompt,
                            completion_tokens=out)


def started(iid: str, model: str) -> InstanceStarted:
    return InstanceStarted(instance_id=iid, model=model, engine_tag="b1", pid=1, port=40001, argv=["llama-server"],
                           log_path=f"instances/{iid}.log", ctx_tokens=4096, engine_ctx=8192, slots=2,
                           planned_bytes=500 * MiB, estimate_bytes=480 * MiB)


def exited(iid: str, model: str, reason: str) -> InstanceExited:
    return InstanceExited(instance_id=iid, model=model, reason=reason)  # type: ignore[arg-type]


def evicted(iid: str, model: str, reason: str) -> InstanceEvicted:
    return InstanceEvicted(instance_id=iid, model=model, reason=reason)  # type: ignore[arg-type]


def story() -> list[Recorded]:
    """Three gemma requests (one queued 1.5 s, one streamed 41 tokens, one cut off by the client), one anthropic
    request for qwen, two rejections; loads, a crash, evictions; one instance of each model still running."""
    events: list[Event] = [
        started("i1", "gemma"), InstanceReady(instance_id="i1", model="gemma", load_ms=900),
        received("t1"), admitted("t1"), RequestFirstToken(trace_id="t1", model="gemma", ttft_ms=200.0),
        done("t1", duration_ms=2200.0, out=41),  # ITL: (2200 - 200) / 40 = 50 ms
        received("t2"), queued("t2"), admitted("t2", waited_ms=1500.0),
        RequestFirstToken(trace_id="t2", model="gemma", ttft_ms=1600.0), done("t2", duration_ms=1700.0, out=1),
        received("t3"), queued("t3"),  # still waiting
        received("t4", model="qwen", dialect="anthropic"), admitted("t4", model="qwen"),
        RequestFailed(trace_id="t4", status=499, reason="client_disconnected"),
        received("t5", model="nope"),
        RequestRejected(trace_id="t5", model="nope", status=404, reason="model_not_found", detail="no model 'nope'"),
        received("t6", dialect="ollama"),
        RequestRejected(trace_id="t6", model="gemma", status=429, reason="queue_full", detail="64 waiting"),
        started("i2", "qwen"), exited("i2", "qwen", "load_failed"),
        started("i3", "qwen"), exited("i3", "qwen", "load_timeout"),
        started("i4", "qwen"), InstanceReady(instance_id="i4", model="qwen", load_ms=700),
        InstanceMemoryMeasured(model="qwen", instance_id="i4", ctx_tokens=4096, slots=2, planned_bytes=500 * MiB,
                               measured_bytes=520 * MiB),
        exited("i4", "qwen", "crashed"),
        started("i5", "qwen"), InstanceReady(instance_id="i5", model="qwen", load_ms=650),
        started("i6", "llama"), InstanceReady(instance_id="i6", model="llama", load_ms=650),
        evicted("i6", "llama", "memory"), exited("i6", "llama", "evicted"),
        started("i7", "llama"), evicted("i7", "llama", "idle"),  # stopping, not yet gone
    ]
    return [rec(i + 1, e) for i, e in enumerate(events)]


def states() -> tuple[MetricsState, ResidencyState]:
    events = story()
    return fold(MetricsProjection(), events), fold(ResidencyProjection(), events)


# -- a strict reader of the text format (0.0.4) --------------------------------------------------------------------

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_SAMPLE = re.compile(rf"^({_NAME})(?:\{{(.*)\}})? (\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\\\|\\"|\\n)*)"(,|$)')


def _labels(body: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    pos = 0
    while pos < len(body):
        m = _LABEL.match(body, pos)
        assert m is not None, f"bad labels at {body[pos:]!r}"
        raw = m.group(2)
        value = re.sub(r"\\(.)", lambda e: {"n": "\n", "\\": "\\", '"': '"'}[e.group(1)], raw)
        assert m.group(1) not in labels, f"label {m.group(1)} twice"
        labels[m.group(1)] = value
        pos = m.end()
    return labels


def parse(text: str) -> dict[str, dict[str, Any]]:
    """{family: {type, help, samples: [(name, labels, value)]}}; asserts every rule a scraper relies on."""
    assert text.endswith("\n") and "\n\n" not in text
    families: dict[str, dict[str, Any]] = {}
    current: str | None = None
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name = line.split(" ", 3)[2]
            assert re.fullmatch(_NAME, name) and name not in families, f"HELP {name}: bad or repeated"
            families[name] = {"help": line.split(" ", 3)[3], "type": None, "samples": []}
            current = name
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert name == current and families[name]["type"] is None, f"TYPE {name} out of place"
            assert kind in ("counter", "gauge", "histogram", "summary", "untyped")
            families[name]["type"] = kind
        else:
            m = _SAMPLE.match(line)
            assert m is not None and current is not None, f"not a sample line: {line!r}"
            name, body, value = m.group(1), m.group(2) or "", m.group(3)
            fam = families[current]
            assert fam["type"] is not None, f"{name}: a sample before its family's TYPE"
            allowed = {current} | ({f"{current}_bucket", f"{current}_sum", f"{current}_count"}
                                   if fam["type"] == "histogram" else set())
            assert name in allowed, f"{name} outside its family {current}"
            labels = _labels(body)
            series = (name, tuple(sorted(labels.items())))
            assert series not in seen, f"duplicate series {series}"
            seen.add(series)
            fam["samples"].append((name, labels, float(value)))
    for name, fam in families.items():
        assert fam["type"] is not None, f"{name}: HELP without TYPE"
        if fam["type"] == "histogram":
            _check_histogram(name, fam["samples"])
    return families


def _check_histogram(name: str, samples: list[tuple[str, dict[str, str], float]]) -> None:
    by_series: dict[tuple, dict[str, Any]] = {}
    for sname, labels, value in samples:
        rest = tuple(sorted((k, v) for k, v in labels.items() if k != "le"))
        h = by_series.setdefault(rest, {"buckets": []})
        if sname.endswith("_bucket"):
            h["buckets"].append((float(labels["le"]), value))
        else:
            h[sname.rsplit("_", 1)[1]] = value
    for rest, h in by_series.items():
        les = [le for le, _ in h["buckets"]]
        counts = [c for _, c in h["buckets"]]
        assert les == sorted(les) and les[-1] == math.inf, f"{name}{rest}: le not ascending to +Inf"
        assert counts == sorted(counts), f"{name}{rest}: buckets not cumulative"
        assert counts[-1] == h["count"] and "sum" in h, f"{name}{rest}: +Inf bucket != _count"


def value(families: dict, name: str, sample: str | None = None, **labels: str) -> float:
    family = families[name]
    hits = [v for n, lb, v in family["samples"] if n == (sample or name) and lb == labels]
    assert len(hits) == 1, f"{sample or name}{labels}: {len(hits)} samples"
    return hits[0]


def buckets(families: dict, name: str, model: str) -> dict[float, float]:
    return {float(lb["le"]): v for n, lb, v in families[name]["samples"]
            if n == f"{name}_bucket" and lb["model"] == model}


# -- the projection ------------------------------------------------------------------------------------------------

def test_requests_are_counted_by_status_dialect_and_model() -> None:
    m, _ = states()
    assert m.requests == {"200|openai|gemma": 2, "499|anthropic|qwen": 1, "404|openai|": 1, "429|ollama|gemma": 1}


def test_histograms_hold_per_bucket_counts_sums_and_counts() -> None:
    m, _ = states()
    ttft = m.histograms["ttft"]["gemma"]
    assert ttft.count == 2 and ttft.sum == pytest.approx(1.8)
    assert ttft.counts[TTFT_BUCKETS_S.index(0.25)] == 1 and ttft.counts[TTFT_BUCKETS_S.index(2.5)] == 1
    itl = m.histograms["itl"]
    assert list(itl) == ["gemma"] and itl["gemma"].count == 1  # one token only: no gap to measure
    assert itl["gemma"].sum == pytest.approx(0.05) and itl["gemma"].counts[ITL_BUCKETS_S.index(0.05)] == 1
    wait = m.histograms["queue_wait"]
    assert wait["gemma"].count == 2 and wait["gemma"].counts[0] == 1
    assert wait["gemma"].counts[QUEUE_WAIT_BUCKETS_S.index(2.5)] == 1 and wait["qwen"].count == 1


def test_queue_depth_follows_queued_and_the_way_out_of_the_queue() -> None:
    m, _ = states()
    assert m.queue_depth == {"gemma": 1}  # t2 was admitted, t3 still waits
    m = fold(MetricsProjection(), [
        rec(100, RequestRejected(trace_id="t3", model="gemma", status=503, reason="queue_timeout", detail="30 s"))], m)
    assert m.queue_depth == {"gemma": 0} and "t3" not in m.pending


def test_tokens_loads_evictions_and_crashes() -> None:
    m, _ = states()
    assert m.tokens == {"in|gemma": 20, "out|gemma": 42}
    assert m.loads == {"ready|gemma": 1, "load_failed|qwen": 1, "load_timeout|qwen": 1, "ready|qwen": 2,
                          "ready|llama": 1}
    assert m.evictions == {"memory": 1, "idle": 1}
    assert m.crashes == {"qwen": 1}
    assert m.pending.keys() == {"t3"}


def test_a_whole_answer_feeds_neither_ttft_nor_inter_token_latency() -> None:
    m = fold(MetricsProjection(), [
        rec(1, received("t", stream=False)), rec(2, RequestFirstToken(trace_id="t", model="gemma", ttft_ms=900.0)),
        rec(3, done("t", duration_ms=901.0, out=40)),
    ])
    assert m.histograms["ttft"] == {} and m.histograms["itl"] == {}
    assert m.requests == {"200|openai|gemma": 1} and m.tokens == {"in|gemma": 10, "out|gemma": 40}


def test_a_model_name_holding_the_separator_comes_back_whole() -> None:
    m = fold(MetricsProjection(), [rec(1, received("t", model="a|b")), rec(2, done("t", 10.0, 1, model="a|b"))])
    assert metrics_mod.split(next(iter(m.requests)), 3) == ["200", "openai", "a|b"]


def test_requests_whose_outcome_never_came_are_pruned_with_their_queue_place(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics_mod, "PENDING_KEPT", 4)
    events = []
    for i in range(5):
        events += [received(f"t{i}"), queued(f"t{i}")]
    m = fold(MetricsProjection(), [rec(i + 1, e) for i, e in enumerate(events)])
    assert sorted(m.pending) == ["t3", "t4"] and m.queue_depth == {"gemma": 2}


def test_state_survives_a_checkpoint_round_trip() -> None:
    events = story()
    whole = fold(MetricsProjection(), events)
    p = MetricsProjection()
    part = through_checkpoint(p, fold(p, events[:9]))
    assert state_bytes(p, fold(p, events[9:], part)) == state_bytes(p, whole)


# -- the rendering -------------------------------------------------------------------------------------------------

def test_the_speculation_governor_counts_its_switches_its_verdicts_and_the_requests() -> None:
    switched = [SpecSwitched(instance_id=iid, model="gemma", enabled=on, reason="r", window_s=1.0)
                for iid, on in (("s1", False), ("s1", True), ("s1", False), ("s2", False))]
    events: list[Event] = [
        *switched, exited("s2", "gemma", "stopped"),
        received("a"), RequestAdmitted(trace_id="a", model="gemma", instance_id="s1", slots=2, busy=1,
                                       spec="off_governor"),
        received("b"), RequestAdmitted(trace_id="b", model="gemma", instance_id="s1", slots=2, busy=2,
                                       spec="off_client"),
        received("c"), admitted("c"),  # not a speculative instance: not counted
    ]
    fams = parse(render(fold(MetricsProjection(), [rec(i + 1, e) for i, e in enumerate(events)]),
                        ResidencyProjection().initial()))
    assert value(fams, "blazar_spec_switches_total", model="gemma", to="off") == 3
    assert value(fams, "blazar_spec_switches_total", model="gemma", to="on") == 1
    assert fams["blazar_spec_enabled"]["samples"] == [("blazar_spec_enabled", {"model": "gemma", "instance": "s1"}, 0)]
    assert value(fams, "blazar_spec_requests_total", model="gemma", spec="off_governor") == 1
    assert value(fams, "blazar_spec_requests_total", model="gemma", spec="off_client") == 1
    assert len(fams["blazar_spec_requests_total"]["samples"]) == 2


def test_every_family_is_announced_with_help_and_type_even_on_an_empty_log() -> None:
    text = render(MetricsProjection().initial(), ResidencyProjection().initial())
    families = parse(text)
    assert {n: f["type"] for n, f in families.items()} == FAMILIES
    assert all(f["help"] and not f["samples"] for f in families.values())


def test_rendered_counters_and_gauges_match_the_log() -> None:
    fams = parse(render(*states()))
    assert {n: f["type"] for n, f in fams.items()} == FAMILIES
    assert value(fams, "blazar_requests_total", model="gemma", status="200", dialect="openai") == 2
    assert value(fams, "blazar_requests_total", model="", status="404", dialect="openai") == 1
    assert value(fams, "blazar_queue_depth", model="gemma") == 1
    assert value(fams, "blazar_tokens_total", model="gemma", direction="in") == 20
    assert value(fams, "blazar_tokens_total", model="gemma", direction="out") == 42
    assert value(fams, "blazar_loads_total", model="qwen", outcome="load_timeout") == 1
    assert value(fams, "blazar_evictions_total", reason="memory") == 1
    assert value(fams, "blazar_engine_crashes_total", model="qwen") == 1
    # Instances: gemma i1 and qwen i5 ready, llama i7 stopping; llama's ready count stays, at 0.
    assert value(fams, "blazar_instances", model="gemma", state="ready") == 1
    assert value(fams, "blazar_instances", model="llama", state="stopping") == 1
    assert value(fams, "blazar_instances", model="llama", state="ready") == 0
    assert len(fams["blazar_instances"]["samples"]) == 3 * 3
    assert value(fams, "blazar_instances_by_kind", kind="llama-server") == 3
    assert value(fams, "blazar_instances_by_kind", kind="whisper") == 0
    assert value(fams, "blazar_instance_planned_bytes", model="qwen") == 500 * MiB
    # qwen's measured instance crashed; the one running now was never measured.
    assert fams["blazar_instance_measured_bytes"]["samples"] == []


def test_rendered_histograms_are_cumulative_and_end_at_the_count() -> None:
    fams = parse(render(*states()))
    ttft = buckets(fams, "blazar_ttft_seconds", "gemma")
    assert list(ttft) == [*TTFT_BUCKETS_S, math.inf]
    assert ttft[0.1] == 0 and ttft[0.25] == 1 and ttft[1.0] == 1 and ttft[2.5] == 2 and ttft[math.inf] == 2
    assert value(fams, "blazar_ttft_seconds", "blazar_ttft_seconds_count", model="gemma") == 2
    assert value(fams, "blazar_ttft_seconds", "blazar_ttft_seconds_sum", model="gemma") == pytest.approx(1.8)
    itl = buckets(fams, "blazar_inter_token_latency_seconds", "gemma")
    assert itl[0.035] == 0 and itl[0.05] == 1 and itl[math.inf] == 1
    wait = buckets(fams, "blazar_queue_wait_seconds", "gemma")
    assert wait[0.005] == 1 and wait[1.0] == 1 and wait[2.5] == 2
    assert 'le="0.005"' in render(*states()) and 'le="60.0"' in render(*states())


def test_the_live_snapshot_replaces_the_queue_depth_and_adds_slot_gauges() -> None:
    m, r = states()
    live = {"qwen": {"queued": 3, "busy": 2, "slots": 2}, "_global": {"cap": 0, "busy": 2, "queued": 3}}
    fams = parse(render(m, r, live=live))
    assert value(fams, "blazar_queue_depth", model="qwen") == 3
    assert value(fams, "blazar_queue_depth", model="gemma") == 0  # the snapshot lists nobody waiting for gemma
    assert fams["blazar_slots_busy"]["type"] == "gauge" and value(fams, "blazar_slots_busy", model="qwen") == 2
    assert value(fams, "blazar_slots", model="qwen") == 2
    assert len(fams["blazar_slots"]["samples"]) == 1  # "_global" is not a model
    assert "blazar_slots" not in parse(render(m, r))


def test_label_values_are_escaped() -> None:
    assert escape_label('a"b\\c\nd') == 'a\\"b\\\\c\\nd'
    odd = 'we"ird\\mo\ndel'
    m = fold(MetricsProjection(), [rec(1, received("t", model=odd)), rec(2, done("t", 10.0, 1, model=odd))])
    fams = parse(render(m, ResidencyProjection().initial()))
    assert value(fams, "blazar_requests_total", model=odd, status="200", dialect="openai") == 1


# -- replay: a checkpoint (plain JSON, sorted keys) plus the tail equals the whole fold ------------------------------

_TRACES = ["t0", "t1", "t2", "t3", "t4", "t5"]
_REQUEST_EVENT = st.one_of(
    st.builds(received, st.sampled_from(_TRACES), st.sampled_from(["gemma", "qwen"]),
              st.sampled_from(["openai", "ollama", "anthropic"])),
    st.builds(queued, st.sampled_from(_TRACES)),
    st.builds(admitted, st.sampled_from(_TRACES), st.floats(0, 200_000)),
    st.builds(lambda t, ms: RequestFirstToken(trace_id=t, model="gemma", ttft_ms=ms), st.sampled_from(_TRACES),
              st.floats(0, 90_000)),
    st.builds(done, st.sampled_from(_TRACES), st.floats(0, 90_000), st.none() | st.integers(0, 500)),
    st.builds(lambda t: RequestRejected(trace_id=t, model="gemma", status=429, reason="queue_full", detail=""),
              st.sampled_from(_TRACES)),
    st.builds(lambda t: RequestFailed(trace_id=t, status=499, reason="client_disconnected"),
              st.sampled_from(_TRACES)),
    st.builds(lambda iid, r: exited(iid, "gemma", r), st.sampled_from(["i1", "i2"]),
              st.sampled_from(["crashed", "load_failed", "load_timeout", "evicted"])),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_REQUEST_EVENT, max_size=40), st.integers(0, 40))
def test_checkpoint_plus_tail_equals_the_whole_fold(events: list[Event], cut: int) -> None:
    recs = [rec(i + 1, e) for i, e in enumerate(events)]
    kept = traces_mod.TRACES_KEPT, metrics_mod.PENDING_KEPT
    traces_mod.TRACES_KEPT, metrics_mod.PENDING_KEPT = 3, 4  # small, so that dropping and pruning happen too
    try:
        for p in (TracesProjection(), MetricsProjection()):
            whole = fold(p, recs)
            restored = through_checkpoint(p, fold(p, recs[:cut]))
            assert state_bytes(p, fold(p, recs[cut:], restored)) == state_bytes(p, whole)
            if isinstance(whole, MetricsState):
                assert all(n >= 0 for n in whole.queue_depth.values())
    finally:
        traces_mod.TRACES_KEPT, metrics_mod.PENDING_KEPT = kept


def test_a_refusals_server_time_lands_in_the_refusal_histogram() -> None:
    events = [RequestReceived(trace_id="r1", dialect="openai", route="/v1/chat/completions", model="gemma"),
              RequestRejected(trace_id="r1", model="gemma", status=429, reason="queue_full", detail="64 waiting",
                              duration_ms=0.8),
              RequestReceived(trace_id="r2", dialect="openai", route="/v1/chat/completions", model="gemma"),
              RequestRejected(trace_id="r2", model="gemma", status=429, reason="queue_full", detail="64 waiting",
                              duration_ms=7.0)]
    state = MetricsProjection().initial()
    for i, ev in enumerate(events, 1):
        state = MetricsProjection().apply(state, rec(i, ev, actor="d"))
    h = state.histograms["refusal"]["gemma"]
    assert h.count == 2 and h.sum == pytest.approx(0.0078)
    assert h.counts[REFUSAL_BUCKETS_S.index(0.001)] == 1 and h.counts[REFUSAL_BUCKETS_S.index(0.01)] == 1
    fams = parse(render(state, ResidencyProjection().initial()))
    assert buckets(fams, "blazar_refusal_seconds", "gemma")[0.005] == 1


def test_the_otlp_export_counters_are_sampled_only_while_spans_are_exported() -> None:
    m, r = MetricsProjection().initial(), ResidencyProjection().initial()
    assert not parse(render(m, r))["blazar_otlp_spans_dropped_total"]["samples"]
    fams = parse(render(m, r, otlp={"exported": 12, "failed": 3, "dropped": 5, "queued": 2}))
    assert value(fams, "blazar_otlp_spans_exported_total") == 12
    assert value(fams, "blazar_otlp_spans_failed_total") == 3
    assert value(fams, "blazar_otlp_spans_dropped_total") == 5
    assert value(fams, "blazar_otlp_queue_spans") == 2


# -- speech requests -----------------------------------------------------------------------------------------------

def audio(trace: str, route: str, seconds: float, rtf: float | None, model: str = "whisper-base") -> RequestAudio:
    return RequestAudio(trace_id=trace, model=model, kind="whisper" if route != "speech" else "piper",
                        route=route, audio_seconds=seconds, response_format="json",  # type: ignore[arg-type]
                        processing_ms=(rtf or 0) * seconds * 1000, real_time_factor=rtf)


def test_audio_seconds_and_the_real_time_factor_count_by_route_model_and_key() -> None:
    def transcription(trace: str, seconds: float, rtf: float) -> list[Event]:
        return [RequestReceived(trace_id=trace, dialect="openai", route="/v1/audio/transcriptions",
                                model="whisper-base"), audio(trace, "transcriptions", seconds, rtf),
                done(trace, 100.0, None, prompt=0, model="whisper-base")]

    events = [*transcription("a", 3.0, 0.04), *transcription("b", 1.5, 0.3)]
    m = fold(MetricsProjection(), [rec(i, e, actor="key:alice") for i, e in enumerate(events, 1)])
    assert m.audio_seconds == {"transcriptions|whisper-base": 4.5}
    assert m.audio_requests == {"transcriptions|whisper-base": 2}
    assert m.routes == {"/v1/audio/transcriptions": 2}
    assert m.key_audio_seconds == {"alice": 4.5}
    assert m.keys["alice"].audio_seconds_today == 4.5 and m.keys["alice"].requests_today == 2
    assert m.histograms["rtf"]["whisper-base"].count == 2
    text = render(m, ResidencyProjection().initial())
    assert 'blazar_audio_seconds_total{model="whisper-base",route="transcriptions"} 4.5' in text
    assert 'blazar_key_audio_seconds_total{key="alice"} 4.5' in text
    assert 'blazar_audio_real_time_factor_bucket{model="whisper-base",le="0.05"} 1' in text
    assert 'blazar_route_requests_total{route="/v1/audio/transcriptions"} 2' in text
    usage = metrics_mod.key_usage(m, "alice")
    assert usage is not None and usage.audio_seconds_today == 4.5


def test_a_forwarded_hop_s_audio_is_counted_where_it_came_in_only() -> None:
    m = fold(MetricsProjection(), [rec(1, audio("t", "speech", 2.0, 0.1, model="joe"), actor="node:a")])
    assert m.audio_seconds == {} and m.histograms["rtf"] == {}


def test_the_view_shows_requests_in_flight_as_a_count_and_everything_else_as_json() -> None:
    m, _ = states()
    view = MetricsProjection().view(m)
    assert "pending" not in view and view["in_flight"] == 1
    assert view["requests"]["200|openai|gemma"] == 2 and view["histograms"]["ttft"]["gemma"]["count"] == 2
    assert m.pending.keys() == {"t3"}  # the view took nothing from the state


def test_energy_counts_measured_and_unmeasured_requests_and_the_measured_ones_joules_and_tokens() -> None:
    def ended(trace: str, energy: RequestEnergy | None, out: int) -> list[Event]:
        return [received(trace), RequestCompleted(trace_id=trace, model="gemma", duration_ms=5.0,
                                                  completion_tokens=out, energy=energy)]

    events = [*ended("a", RequestEnergy(source="rapl", joules=2.5, machine_joules=5.0, tokens_per_joule=4.0,
                                        overlapped=2), 10),
              *ended("b", RequestEnergy(source="rapl", joules=1.5, machine_joules=1.5, tokens_per_joule=4.0,
                                        overlapped=1), 6),
              *ended("c", RequestEnergy(source="not_measured"), 7),
              *ended("d", None, 9)]  # recorded before energy was measured: in neither count
    m = fold(MetricsProjection(), [rec(i + 1, e) for i, e in enumerate(events)])
    fams = parse(render(m, ResidencyProjection().initial()))
    assert value(fams, "blazar_energy_requests_total", model="gemma", measured="true") == 2
    assert value(fams, "blazar_energy_requests_total", model="gemma", measured="false") == 1
    assert value(fams, "blazar_energy_joules_total", model="gemma") == 4.0
    assert value(fams, "blazar_energy_completion_tokens_total", model="gemma") == 16
    assert through_checkpoint(MetricsProjection(), m) == m


def test_a_cache_hit_is_counted_by_source_key_and_model_and_its_tokens_are_not_generated_ones() -> None:
    hit = RequestCacheHit(trace_id="h1", model="gemma", source="exact", entry="ab" * 32, age_s=3.0)
    events = [rec(1, received("m1")), rec(2, done("m1", duration_ms=900.0, out=8), actor="key:alice"),
              rec(3, received("h1"), actor="key:alice"), rec(4, hit, actor="key:alice"),
              rec(5, done("h1", duration_ms=2.0, out=8), actor="key:alice")]
    m = fold(MetricsProjection(), events)
    assert metrics_mod.counter(m, "cache_hits") == [(("exact", "alice", "gemma"), 1)]
    assert m.tokens == {"in|gemma": 10, "out|gemma": 8}  # the miss's: the hit's were not generated again
    assert m.requests == {"200|openai|gemma": 2}
    text = render(m, ResidencyProjection().initial())
    assert 'blazar_cache_hits_total{model="gemma",key="alice",source="exact"} 1' in text
