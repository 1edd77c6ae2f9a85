"""The `traces` projection: a summary of each of the most recent requests (outcome, status, timings, tokens), the
latest failed or rejected one (what `blazar why` explains when given no trace id), and counts since the log began.
"""

from __future__ import annotations

from typing import Any

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
from blazar.projections.base import Projection, State, TypedState

# Summaries kept, newest last; the oldest is dropped past this.
TRACES_KEPT = 1000
# How many summaries `blazar state` shows (newest first); the state itself keeps TRACES_KEPT.
VIEW_RECENT = 20


def _new(state: State, trace_id: str, rec: Recorded) -> dict[str, Any]:
    summary: dict[str, Any] = {
        "trace_id": trace_id, "dialect": None, "route": None, "model": None, "stream": None, "status": None,
        "outcome": "in_progress", "reason": None, "received_ts": None, "ended_ts": None, "ttft_ms": None,
        "duration_ms": None, "waited_ms": None, "queued_position": None, "instance_id": None, "cold": None,
        "tokens": {"in": None, "out": None}, "seq": rec.seq,
    }
    state["traces"][trace_id] = summary
    # NOTE: an explicit order list, not dict order: checkpoints are stored with sorted keys.
    order: list[str] = state["order"]
    order.append(trace_id)
    while len(order) > TRACES_KEPT:
        state["traces"].pop(order.pop(0), None)
    return summary


def _summary(state: State, trace_id: str, rec: Recorded) -> dict[str, Any]:
    """The trace's summary; a trace seen first past its `received` (lost in a crash, or dropped as old while it
    ran) gets one too, with what its later events tell."""
    return state["traces"].get(trace_id) or _new(state, trace_id, rec)


def _end(state: State, s: dict[str, Any], rec: Recorded, outcome: str, status: int) -> None:
    s["outcome"], s["status"], s["ended_ts"] = outcome, status, rec.ts
    state["counts"][outcome] += 1


class TracesState(TypedState):
    """The `traces` projection's state, read through `known` and `last_failed`."""

    __slots__ = ()


class TracesProjection(Projection[State]):
    name = "traces"
    state_type = TracesState
    version = 1
    types = frozenset({
        RequestReceived.TYPE, RequestQueued.TYPE, RequestAdmitted.TYPE, RequestRejected.TYPE, RequestRouted.TYPE,
        RequestFirstToken.TYPE, RequestCompleted.TYPE, RequestFailed.TYPE,
    })

    def initial(self) -> State:
        return {"traces": {}, "order": [], "last_failed": None,
                "counts": {"received": 0, "completed": 0, "failed": 0, "rejected": 0}}

    def apply(self, state: State, rec: Recorded) -> State:
        ev = rec.event
        assert isinstance(ev, RequestReceived | RequestQueued | RequestAdmitted | RequestRejected | RequestRouted
                          | RequestFirstToken | RequestCompleted | RequestFailed)
        if rec.actor.startswith(HOP_ACTOR):
            # The hop on the node it was forwarded to: part of this trace (why shows its steps), summarised and
            # counted once, where it came in.
            return state
        s = _summary(state, ev.trace_id, rec)
        if isinstance(ev, RequestReceived):
            s.update(dialect=ev.dialect, route=ev.route, model=ev.model, stream=ev.stream, received_ts=rec.ts)
            state["counts"]["received"] += 1
            return state
        # The later events name the model as resolved (a client's "gemma" may be "gemma:latest").
        if ev.model is not None:
            s["model"] = ev.model
        if isinstance(ev, RequestQueued):
            s["queued_position"] = ev.position
        elif isinstance(ev, RequestAdmitted):
            s["waited_ms"] = ev.waited_ms
            s["instance_id"] = ev.instance_id or s["instance_id"]
        elif isinstance(ev, RequestRouted):
            s["instance_id"], s["cold"] = ev.instance_id, ev.cold
        elif isinstance(ev, RequestFirstToken):
            s["ttft_ms"] = ev.ttft_ms
        elif isinstance(ev, RequestCompleted):
            _end(state, s, rec, "completed", ev.status)
            s["duration_ms"] = ev.duration_ms
            s["tokens"] = {"in": ev.prompt_tokens, "out": ev.completion_tokens}
            s["reason"] = ev.finish_reason
        elif isinstance(ev, RequestRejected | RequestFailed):
            _end(state, s, rec, "rejected" if isinstance(ev, RequestRejected) else "failed", ev.status)
            s["reason"] = ev.reason
            took = ev.duration_ms if isinstance(ev, RequestFailed) else 0.0
            if not took and s["received_ts"] is not None:
                took = round((rec.ts - s["received_ts"]) * 1000.0, 3)
            s["duration_ms"] = took
            state["last_failed"] = ev.trace_id
        return state

    def view(self, state: State) -> Any:
        """Counts, the latest failure and the newest summaries: all kept ones would drown `blazar state`."""
        return {"counts": state["counts"], "last_failed": state["last_failed"], "kept": len(state["order"]),
                "in_progress": sum(1 for s in state["traces"].values() if s["outcome"] == "in_progress"),
                "recent": _recent(state, VIEW_RECENT)}


def _recent(state: State, n: int = VIEW_RECENT, *, outcome: str | None = None) -> list[dict[str, Any]]:
    """Up to `n` summaries, newest first, optionally only those with this outcome."""
    rows = []
    for trace_id in reversed(state["order"]):
        s = state["traces"][trace_id]
        if outcome is None or s["outcome"] == outcome:
            rows.append(s)
            if len(rows) >= n:
                break
    return rows


def known(state: TracesState, trace_id: str) -> bool:
    """The log holds a summary of `trace_id` (one of the newest TRACES_KEPT requests)."""
    return trace_id in state._raw["traces"]


def last_failed(state: TracesState) -> str | None:
    """The trace id of the latest failed or rejected request, or None."""
    trace_id = state._raw["last_failed"]
    return None if trace_id is None else str(trace_id)
