"""The traces projection, fed request events: a summary per recent request, bounded; the latest failure; counts."""

from __future__ import annotations

from blazar.events import Recorded
from blazar.events.requests import (
    RequestAdmitted,
    RequestCompleted,
    RequestFailed,
    RequestFirstToken,
    RequestQueued,
    RequestReceived,
    RequestRejected,
    RequestRouted,
)
from blazar.projections import TracesProjection, fold
from blazar.projections.traces import TRACES_KEPT, TraceCounts, TraceSummary
from blazar.projections.traces import _recent as recent
from tests.support.events import rec
from tests.support.states import state_bytes, through_checkpoint

T1, T2, T3 = "a" * 32, "b" * 32, "c" * 32


def received(trace: str, model: str = "gemma", dialect: str = "openai") -> RequestReceived:
    return RequestReceived(trace_id=trace, dialect=dialect, route="/v1/chat/completions", model=model)  # type: ignore[arg-type]


def completed_trace(trace: str, seq: int, ts: float) -> list[Recorded]:
    return [
        rec(seq, received(trace), ts=ts),
        rec(seq + 1, RequestQueued(trace_id=trace, model="gemma:latest", position=2, depth=2, slots=1, busy=1),
            ts=ts + 0.001),
        rec(seq + 2, RequestAdmitted(trace_id=trace, model="gemma:latest", instance_id="i1", waited_ms=1500.0,
                                     slots=1, busy=1, queued_behind=1), ts=ts + 1.5),
        rec(seq + 3, RequestRouted(trace_id=trace, model="gemma:latest", instance_id="i1", port=40001, cold=False),
            ts=ts + 1.5),
        rec(seq + 4, RequestFirstToken(trace_id=trace, model="gemma:latest", ttft_ms=1680.0), ts=ts + 1.68),
        rec(seq + 5, RequestCompleted(trace_id=trace, model="gemma:latest", instance_id="i1", duration_ms=2500.0,
                                      prompt_tokens=12, completion_tokens=40, finish_reason="stop"), ts=ts + 2.5),
    ]


def test_a_completed_request_is_summarised_with_its_timings_and_tokens() -> None:
    state = fold(TracesProjection(), completed_trace(T1, 1, 5000.0))
    assert state.traces[T1] == TraceSummary(
        trace_id=T1, dialect="openai", route="/v1/chat/completions", model="gemma:latest",
        stream=False, status=200, outcome="completed", reason="stop", received_ts=5000.0,
        ended_ts=5002.5, ttft_ms=1680.0, duration_ms=2500.0, waited_ms=1500.0, queued_position=2,
        instance_id="i1", cold=False, tokens_in=12, tokens_out=40, seq=1,
    )
    assert list(state.traces) == [T1]
    assert state.counts == TraceCounts(received=1, completed=1, failed=0, rejected=0)
    assert state.last_failed is None


def test_a_request_without_an_outcome_is_in_progress() -> None:
    state = fold(TracesProjection(), [rec(1, received(T1))])
    assert state.traces[T1].outcome == "in_progress"
    assert TracesProjection().view(state)["in_progress"] == 1


def test_rejected_and_failed_requests_set_last_failed_and_their_reason() -> None:
    state = fold(TracesProjection(), [
        rec(1, received(T1), ts=100.0),
        rec(2, RequestRejected(trace_id=T1, model="gemma", status=429, reason="queue_full", detail="64 waiting",
                               retry_after_s=4.0), ts=100.25),
    ])
    s = state.traces[T1]
    assert (s.outcome, s.status, s.reason, s.duration_ms) == ("rejected", 429, "queue_full", 250.0)
    assert state.last_failed == T1
    state = fold(TracesProjection(), [
        rec(3, received(T2)),
        rec(4, RequestFailed(trace_id=T2, status=502, reason="engine_crashed", duration_ms=900.0)),
        *completed_trace(T3, 5, 2000.0),  # a later success does not hide the failure
    ], state)
    assert state.last_failed == T2
    assert state.traces[T2].outcome == "failed" and state.traces[T2].duration_ms == 900.0
    assert state.traces[T2].model == "gemma"  # the failure named none: the received model stays
    assert state.counts == TraceCounts(received=3, completed=1, failed=1, rejected=1)


def test_a_rejection_without_a_received_event_still_gets_a_summary() -> None:
    state = fold(TracesProjection(), [
        rec(7, RequestRejected(trace_id=T1, status=400, reason="invalid_request", detail="messages is required")),
    ])
    assert state.traces[T1].outcome == "rejected" and state.traces[T1].received_ts is None
    assert state.traces[T1].duration_ms == 0.0
    assert state.last_failed == T1


def test_only_the_most_recent_traces_are_kept_and_the_oldest_go_first() -> None:
    traces = [f"{i:032x}" for i in range(TRACES_KEPT + 5)]
    state = fold(TracesProjection(), [rec(i + 1, received(t)) for i, t in enumerate(traces)])
    assert list(state.traces) == traces[5:]
    assert state.counts.received == TRACES_KEPT + 5
    p = TracesProjection()  # the order survives a checkpoint: the next one dropped is still the oldest
    state = fold(p, [rec(TRACES_KEPT + 6, received("f" * 32))], through_checkpoint(p, state))
    assert list(state.traces) == [*traces[6:], "f" * 32]


def test_recent_is_newest_first_and_filters_by_outcome() -> None:
    state = fold(TracesProjection(), [
        *completed_trace(T1, 1, 100.0),
        rec(10, received(T2)),
        rec(11, RequestFailed(trace_id=T2, status=499, reason="client_disconnected")),
        rec(12, received(T3)),
    ])
    assert [s.trace_id for s in recent(state)] == [T3, T2, T1]
    assert [s.trace_id for s in recent(state, 1)] == [T3]
    assert [s.trace_id for s in recent(state, outcome="failed")] == [T2]
    view = TracesProjection().view(state)
    assert view["kept"] == 3 and view["last_failed"] == T2 and view["recent"][0]["trace_id"] == T3


def test_a_checkpoint_round_trip_changes_nothing() -> None:
    p = TracesProjection()
    events = [*completed_trace(T1, 1, 100.0), rec(10, received(T2)), rec(11, received(T3))]
    whole = fold(p, events)
    # Restore the first part from its checkpoint, then fold the rest.
    part = through_checkpoint(p, fold(p, events[:7]))
    assert state_bytes(p, fold(p, events[7:], part)) == state_bytes(p, whole)


def test_the_view_shows_counts_and_the_newest_summaries_as_json() -> None:
    state = fold(TracesProjection(), [*completed_trace(T1, 1, 100.0), rec(10, received(T2))])
    view = TracesProjection().view(state)
    assert view["counts"] == {"received": 2, "completed": 1, "failed": 0, "rejected": 0}
    assert view["in_progress"] == 1 and view["kept"] == 2
    assert [(s["trace_id"], s["outcome"], s["tokens_out"]) for s in view["recent"]] == [
        (T2, "in_progress", None), (T1, "completed", 40)]
