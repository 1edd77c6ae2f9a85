"""The dashboard fold (blazar/queries/dashboard.py): given request events and residency rows, expect the snapshot;
time comes from an injected FakeClock, never from the machine."""

from __future__ import annotations

from blazar.clock import FakeClock
from blazar.events import Event
from blazar.events.base import Recorded
from blazar.events.instances import InstanceReady, InstanceStarted
from blazar.events.models import InstanceMemoryMeasured
from blazar.events.requests import (
    RequestAdmitted,
    RequestCacheHit,
    RequestCompleted,
    RequestFailed,
    RequestFirstToken,
    RequestReceived,
    RequestRejected,
)
from blazar.projections.residency import ResidencyProjection, ResidencyState, ps_rows
from blazar.queries.dashboard import (
    RECENT_REQUESTS,
    Activity,
    DaemonStatus,
    Dashboard,
    fold,
    parse_metrics,
    snapshot,
    tokens_per_s,
)
from blazar.queries.metrics import render_prometheus
from tests.support.events import rec

MiB = 1 << 20
DOWN = DaemonStatus(up=False)


class Feed:
    """Records stamped with the clock's time and increasing seq, folded as they are made."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.activity = Activity()
        self.seq = 0

    def at(self, dt: float, event: Event) -> Recorded:
        self.clock.advance(dt)
        self.seq += 1
        recorded = rec(self.seq, event, ts=self.clock.now())
        fold(self.activity, recorded)
        return recorded

    def completed(self, trace: str, *, model: str = "gemma", tokens: int = 100, decode_ms: float = 1000.0,
                  ttft_ms: float | None = 50.0) -> None:
        self.at(0.0, RequestReceived(trace_id=trace, dialect="openai", route="/v1/chat/completions", model=model))
        self.at(0.0, RequestAdmitted(trace_id=trace, model=model, slots=1, busy=1))
        if ttft_ms is not None:
            self.at(ttft_ms / 1000.0, RequestFirstToken(trace_id=trace, model=model, ttft_ms=ttft_ms))
        self.at(decode_ms / 1000.0, RequestCompleted(trace_id=trace, model=model, duration_ms=decode_ms + 50.0,
                                                     completion_tokens=tokens,
                                                     engine_timings={"predicted_ms": decode_ms}))

    def snap(self, rows: list[dict] | None = None, **kw: object) -> Dashboard:
        return snapshot(self.activity, rows=rows or [], now=self.clock.now(), daemon=DOWN,
                        queues=kw.pop("queues", {}), **kw)  # type: ignore[arg-type]


def test_a_completed_request_is_listed_with_its_status_and_ttft() -> None:
    f = Feed()
    f.completed("t1", ttft_ms=42.0)
    [row] = f.snap().requests
    assert (row.trace_id, row.model, row.dialect, row.outcome, row.status, row.ttft_ms, row.completion_tokens) == (
        "t1", "gemma", "openai", "completed", 200, 42.0, 100)
    assert f.snap().failures == []


def test_requests_are_newest_first_and_bounded() -> None:
    f = Feed()
    for i in range(RECENT_REQUESTS + 3):
        f.completed(f"t{i}")
    traces = [r.trace_id for r in f.snap().requests]
    assert traces == [f"t{i}" for i in reversed(range(3, RECENT_REQUESTS + 3))]


def test_a_failure_carries_the_why_verdict() -> None:
    f = Feed()
    f.at(0.0, RequestReceived(trace_id="bad", dialect="ollama", route="/api/chat", model="gemma"))
    f.at(0.0, RequestAdmitted(trace_id="bad", model="gemma", slots=1, busy=1))
    f.at(0.3, RequestFailed(trace_id="bad", model="gemma", status=502, reason="engine_crashed", detail="exit 139",
                            duration_ms=300.0))
    f.at(0.1, RequestRejected(trace_id="full", model="gemma", status=429, reason="queue_full", detail="8 waiting"))
    rejected, failed = f.snap().failures
    assert (failed.trace_id, failed.outcome, failed.status, failed.reason) == ("bad", "failed", 502, "engine_crashed")
    assert failed.verdict.startswith("failed 502 after 300 ms") and "exit 139" in failed.verdict
    assert rejected.outcome == "rejected" and rejected.verdict.startswith("rejected 429")
    assert [r.outcome for r in f.snap().requests] == ["rejected", "failed"]


def test_tokens_per_s_counts_only_the_decode_inside_the_last_10_s() -> None:
    f = Feed()
    f.completed("a", tokens=200, decode_ms=2000.0, ttft_ms=None)  # 100 tok/s for 2 s, just ended
    assert f.snap().tokens_per_s == {"gemma": 20.0}  # 200 tokens over a 10 s window
    f.clock.advance(9.0)  # the window now holds the last 1 s of that decode: 100 tokens
    assert tokens_per_s(f.activity, now=f.clock.now()) == {"gemma": 10.0}
    f.clock.advance(1.5)
    assert f.snap().tokens_per_s == {}


def test_tokens_per_s_is_per_model() -> None:
    f = Feed()
    f.completed("a", model="gemma", tokens=50, decode_ms=500.0)
    f.completed("b", model="qwen", tokens=30, decode_ms=500.0)
    assert f.snap().tokens_per_s == {"gemma": 5.0, "qwen": 3.0}


def test_records_seen_already_are_not_folded_twice() -> None:
    f = Feed()
    f.completed("a")
    again = Activity()
    again.seq = f.activity.seq
    seen = rec(1, RequestReceived(trace_id="x", dialect="openai", route="/", model="m"), ts=0.0, actor="d")
    assert fold(again, seen).open_traces == {}


def _residency(clock: FakeClock) -> ResidencyState:
    proj = ResidencyProjection()
    state = proj.initial()
    for seq, ev in enumerate([
        InstanceStarted(instance_id="g1", model="gemma", engine_tag="b1", pid=11, port=40001, argv=["x"],
                        log_path="instances/g1.log", ctx_tokens=4096, engine_ctx=4096, slots=2,
                        planned_bytes=300 * MiB, estimate_bytes=300 * MiB, keep_alive_s=300.0),
        InstanceReady(instance_id="g1", model="gemma", load_ms=900),
        InstanceMemoryMeasured(model="gemma", instance_id="g1", ctx_tokens=4096, slots=2, planned_bytes=300 * MiB,
                               measured_bytes=280 * MiB),
    ], start=1):
        state = proj.apply(state, rec(seq, ev, ts=clock.now()))
    return state


def test_an_instance_shows_memory_slots_and_keep_alive_left() -> None:
    f = Feed()
    state = _residency(f.clock)
    f.clock.advance(100.0)
    rows = [r.to_json() for r in ps_rows(state, now=f.clock.now())]
    [inst] = f.snap(rows, slots_busy={"gemma": 1}).instances
    assert (inst.model, inst.state, inst.planned_bytes, inst.measured_bytes, inst.slots, inst.slots_busy) == (
        "gemma", "ready", 300 * MiB, 280 * MiB, 2, 1)
    assert inst.keep_alive_left_s == 200.0 and inst.ctx_tokens == 4096
    assert f.snap(rows).instances[0].slots_busy is None  # nothing says how busy it is
    live = [r.to_json() for r in ps_rows(state, now=f.clock.now(),
                                         live={"g1": {"in_flight": 2, "last_used": f.clock.now()}})]
    [busy] = f.snap(live, live_rows=True).instances
    assert busy.slots_busy == 2 and busy.keep_alive_left_s is None  # busy: the countdown has not started


def test_the_same_picture_ignores_only_the_time() -> None:
    f = Feed()
    f.completed("a")
    first = f.snap()
    f.clock.advance(0.1)
    assert f.snap().same_picture(first)
    f.completed("b")
    assert not f.snap().same_picture(first)


def test_parse_metrics_reads_what_render_prometheus_writes() -> None:
    from blazar.projections.metrics import MetricsProjection

    live = {'we"ird\\name': {"queued": 3, "busy": 1, "slots": 2}, "gemma": {"queued": 0, "busy": 2, "slots": 2}}
    text = render_prometheus(MetricsProjection().initial(), ResidencyProjection().initial(), live=live)
    sample = parse_metrics(text)
    assert sample.queue_depth == {'we"ird\\name': 3, "gemma": 0}
    assert sample.slots_busy == {'we"ird\\name': 1, "gemma": 2}


def test_the_json_shape_is_stable() -> None:
    f = Feed()
    f.completed("a")
    dumped = f.snap(queues={"gemma": 2}).model_dump(mode="json")
    assert sorted(dumped) == ["at", "cache_hits", "daemon", "failures", "instances", "prefix_clients", "queues",
                              "requests", "seq", "tokens_per_s", "version", "window_s"]
    assert dumped["version"] == 1 and dumped["queues"] == {"gemma": 2}
    assert sorted(dumped["requests"][0]) == ["completion_tokens", "dialect", "duration_ms", "model", "outcome",
                                             "status", "trace_id", "ts", "ttft_ms"]


def test_response_cache_hits_are_counted_per_model() -> None:
    f = Feed()
    f.completed("miss")
    for trace, model in (("h1", "gemma"), ("h2", "gemma"), ("h3", "qwen")):
        f.at(0.0, RequestReceived(trace_id=trace, dialect="openai", route="/v1/chat/completions", model=model))
        f.at(0.0, RequestCacheHit(trace_id=trace, model=model, source="exact", entry="ab" * 32, age_s=1.0))
        f.at(0.001, RequestCompleted(trace_id=trace, model=model, duration_ms=1.0, completion_tokens=8))
    assert f.snap().cache_hits == {"gemma": 2, "qwen": 1}
    assert [r.trace_id for r in f.snap().requests][:3] == ["h3", "h2", "h1"]
