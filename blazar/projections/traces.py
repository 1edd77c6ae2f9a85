"""The `traces` projection: a summary of each of the most recent requests (outcome, status, timings, tokens), the
latest failed or rejected one (what `blazar why` explains when given no trace id), and counts since the log began.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from blazar.events.base import Recorded
from blazar.events.requests import (
    HOP_ACTOR,
    RequestAdmitted,
    RequestCompleted,
    RequestFailed,
    RequestFirstToken,
    RequestQueued,
    RequestReceived,
    RequestRejected,
    RequestRouted,
)
from blazar.projections.base import Projection

# Summaries kept, newest last; the oldest is dropped past this.
TRACES_KEPT = 1000
# How many summaries `blazar state` shows (newest first); the state itself keeps TRACES_KEPT.
VIEW_RECENT = 20

Outcome = Literal["in_progress", "completed", "failed", "rejected"]


@dataclass(slots=True)
class TraceSummary:
    """One recent request: what it asked, where it ran, how it ended and how long it took. Updated in place by each
    of its events."""

    trace_id: str
    seq: int  # of the first event of it the projection saw
    dialect: str | None = None
    route: str | None = None
    model: str | None = None  # as resolved, once a later event names it
    stream: bool | None = None
    status: int | None = None
    outcome: Outcome = "in_progress"
    reason: str | None = None  # the finish reason of a completion, the reason of a failure or refusal
    received_ts: float | None = None
    ended_ts: float | None = None
    ttft_ms: float | None = None
    duration_ms: float | None = None
    waited_ms: float | None = None
    queued_position: int | None = None
    instance_id: str | None = None
    cold: bool | None = None
    tokens_in: int | None = None
    tokens_out: int | None = None


@dataclass(slots=True)
class TraceCounts:
    """Requests since the log began, by how far they got."""

    received: int = 0
    completed: int = 0
    failed: int = 0
    rejected: int = 0


@dataclass(slots=True)
class TracesState:
    """The `traces` projection's state: `traces` in the order they were first seen, oldest first (NOTE: dict order,
    which the codec writes and reads back as it is)."""

    traces: dict[str, TraceSummary] = field(default_factory=dict)
    last_failed: str | None = None  # the trace id of the latest failed or rejected request
    counts: TraceCounts = field(default_factory=TraceCounts)


def _new(state: TracesState, trace_id: str, rec: Recorded) -> TraceSummary:
    traces = state.traces
    summary = traces[trace_id] = TraceSummary(trace_id, rec.seq)
    while len(traces) > TRACES_KEPT:
        del traces[next(iter(traces))]
    return summary


def _summary(state: TracesState, trace_id: str, rec: Recorded) -> TraceSummary:
    """The trace's summary; a trace seen first past its `received` (lost in a crash, or dropped as old while it
    ran) gets one too, with what its later events tell."""
    return state.traces.get(trace_id) or _new(state, trace_id, rec)


_REQUEST = (RequestReceived, RequestQueued, RequestAdmitted, RequestRejected, RequestRouted, RequestFirstToken,
            RequestCompleted, RequestFailed)


class TracesProjection(Projection[TracesState]):
    name = "traces"
    state_type = TracesState
    # 2: a typed state (the summaries in first-seen order, with no separate order list; tokens_in, tokens_out)
    version = 2
    types = frozenset(t.TYPE for t in _REQUEST)

    def initial(self) -> TracesState:
        return TracesState()

    def apply(self, state: TracesState, rec: Recorded) -> TracesState:
        ev = rec.event
        assert isinstance(ev, _REQUEST)
        if rec.actor.startswith(HOP_ACTOR):
            # The hop on the node it was forwarded to: part of this trace (why shows its steps), summarised and
            # counted once, where it came in.
            return state
        s = _summary(state, ev.trace_id, rec)
        if isinstance(ev, RequestReceived):
            s.dialect, s.route, s.model, s.stream, s.received_ts = ev.dialect, ev.route, ev.model, ev.stream, rec.ts
            state.counts.received += 1
            return state
        # The later events name the model as resolved (a client's "gemma" may be "gemma:latest").
        if ev.model is not None:
            s.model = ev.model
        if isinstance(ev, RequestQueued):
            s.queued_position = ev.position
        elif isinstance(ev, RequestAdmitted):
            s.waited_ms = ev.waited_ms
            s.instance_id = ev.instance_id or s.instance_id
        elif isinstance(ev, RequestRouted):
            s.instance_id, s.cold = ev.instance_id, ev.cold
        elif isinstance(ev, RequestFirstToken):
            s.ttft_ms = ev.ttft_ms
        elif isinstance(ev, RequestCompleted):
            s.outcome, s.status, s.ended_ts = "completed", ev.status, rec.ts
            state.counts.completed += 1
            s.duration_ms = ev.duration_ms
            s.tokens_in, s.tokens_out = ev.prompt_tokens, ev.completion_tokens
            s.reason = ev.finish_reason
        else:
            if isinstance(ev, RequestRejected):
                s.outcome = "rejected"
                state.counts.rejected += 1
                took = 0.0
            else:
                s.outcome = "failed"
                state.counts.failed += 1
                took = ev.duration_ms
            s.status, s.ended_ts, s.reason = ev.status, rec.ts, ev.reason
            if not took and s.received_ts is not None:
                took = round((rec.ts - s.received_ts) * 1000.0, 3)
            s.duration_ms = took
            state.last_failed = ev.trace_id
        return state

    def view(self, state: TracesState) -> Any:
        """Counts, the latest failure and the newest summaries: all kept ones would drown `blazar state`."""
        return {"counts": asdict(state.counts), "last_failed": state.last_failed, "kept": len(state.traces),
                "in_progress": sum(1 for s in state.traces.values() if s.outcome == "in_progress"),
                "recent": [asdict(s) for s in _recent(state)]}


def _recent(state: TracesState, n: int = VIEW_RECENT, *, outcome: Outcome | None = None) -> list[TraceSummary]:
    """Up to `n` summaries, newest first, optionally only those with this outcome."""
    rows = []
    for s in reversed(state.traces.values()):
        if outcome is None or s.outcome == outcome:
            rows.append(s)
            if len(rows) >= n:
                break
    return rows


def known(state: TracesState, trace_id: str) -> bool:
    """The log holds a summary of `trace_id` (one of the newest TRACES_KEPT requests)."""
    return trace_id in state.traces
