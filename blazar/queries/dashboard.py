"""The dashboard's read side, shared by `blazar watch` and `GET /api/blazar/dashboard` (the web console): a fold of
request events into recent activity (`Activity`, `fold`), and `snapshot`, which joins it with the residency rows
(`ps_rows`) and the queue and slot figures into one frozen `Dashboard`. No terminal, no HTTP, no clock: `now` is given.

The JSON shape of `Dashboard.model_dump(mode="json")` (version 1; fields are only ever added):

    {"version": 1, "at": <epoch s>, "seq": <last seq folded>, "window_s": 10.0,
     "daemon": {"up": bool, "url": str | null},
     "instances": [{"model", "instance_id", "state": "starting|ready|stopping", "planned_bytes": int,
                    "measured_bytes": int | null, "slots": int, "slots_busy": int | null (null: not known),
                    "keep_alive_left_s": float | null (null: busy, pinned, forever or not ready), "pinned": bool,
                    "ctx_tokens": int | null}],
     "queues": {model: waiting requests},
     "tokens_per_s": {model: generated tokens per second over the last window_s},
     "cache_hits": {model: requests answered from the response cache, since the dashboard's feed began},
     "requests": [{"trace_id", "ts", "model": str | null, "dialect": str | null,
                   "outcome": "completed|failed|rejected", "status": int, "ttft_ms": float | null,
                   "duration_ms": float | null, "completion_tokens": int | null}],   (newest first)
     "failures": [{"trace_id", "ts", "model": str | null, "outcome": "failed|rejected", "status": int,
                   "reason": str, "verdict": str (what `blazar why` says)}],         (newest first)
     "prefix_clients": [{"actor", "agent": str | null, "streak", "turns", "breaks", "reprocessed_tokens",
                         "prefill_ms", "break_trace_id": str | null, "changed": str | null (where the last break's
                         prompt first differed)}]}   (flagged clients only: blazar/queries/prefix_clients.py)
"""

from __future__ import annotations

import re
from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from blazar.events.base import Recorded
from blazar.events.log import EventLog
from blazar.events.requests import (
    RequestCacheHit,
    RequestCompleted,
    RequestFailed,
    RequestFirstToken,
    RequestReceived,
    RequestRejected,
)
from blazar.queries.why import explain

VERSION = 1
WINDOW_S = 10.0
RECENT_REQUESTS = 10
RECENT_FAILURES = 5
# Traces still open (received, no outcome yet) whose records are kept for the verdict; the oldest is dropped first.
OPEN_TRACES = 256
RECORDS_PER_TRACE = 32
# How far back a dashboard opened on a busy log reads to fill its lists.
SEED_EVENTS = 5000
REQUEST_TYPES = ("request.received", "request.queued", "request.admitted", "request.rejected", "request.routed",
                 "request.first_token", "request.completed", "request.failed", "request.cache_hit")


# -- the snapshot ---------------------------------------------------------------------------------------------------

class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class DaemonStatus(_Frozen):
    up: bool
    url: str | None = None


class InstanceRow(_Frozen):
    model: str
    instance_id: str
    state: str
    planned_bytes: int
    measured_bytes: int | None
    slots: int
    slots_busy: int | None
    keep_alive_left_s: float | None
    pinned: bool
    ctx_tokens: int | None = None
    kind: str = "llama-server"  # llama-server, whisper or piper


class RequestRow(_Frozen):
    trace_id: str
    ts: float
    model: str | None
    dialect: str | None
    outcome: Literal["completed", "failed", "rejected"]
    status: int
    ttft_ms: float | None
    duration_ms: float | None
    completion_tokens: int | None


class FailureRow(_Frozen):
    trace_id: str
    ts: float
    model: str | None
    outcome: Literal["failed", "rejected"]
    status: int
    reason: str
    verdict: str


class PrefixClientRow(_Frozen):
    """A client flagged for breaking the prefix cache turn after turn (`blazar why --clients`)."""

    actor: str
    agent: str | None
    streak: int
    turns: int
    breaks: int
    reprocessed_tokens: int
    prefill_ms: float
    break_trace_id: str | None
    changed: str | None


class Dashboard(_Frozen):
    version: int = VERSION
    at: float
    seq: int
    window_s: float = WINDOW_S
    daemon: DaemonStatus
    instances: list[InstanceRow]
    queues: dict[str, int]
    tokens_per_s: dict[str, float]
    requests: list[RequestRow]
    failures: list[FailureRow]
    prefix_clients: list[PrefixClientRow] = []
    cache_hits: dict[str, int] = Field(default_factory=dict)

    def same_picture(self, other: Dashboard | None) -> bool:
        """True when `other` would draw the same (everything but the time it was taken)."""
        return other is not None and self.model_copy(update={"at": 0.0}) == other.model_copy(update={"at": 0.0})


# -- the fold -------------------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class _Generated:
    """Tokens a request generated between start_ts and end_ts (counted as spread evenly over that time)."""

    model: str
    start_ts: float
    end_ts: float
    tokens: int


@dataclass(slots=True)
class Activity:
    """What the fold keeps: bounded, so a dashboard open for a week costs what it cost after a minute. Like a
    projection's state it is changed in place by `fold`; `snapshot` copies out of it."""

    seq: int = 0
    open_traces: OrderedDict[str, list[Recorded]] = field(default_factory=OrderedDict)
    requests: deque[RequestRow] = field(default_factory=lambda: deque(maxlen=RECENT_REQUESTS))
    failures: deque[FailureRow] = field(default_factory=lambda: deque(maxlen=RECENT_FAILURES))
    generated: deque[_Generated] = field(default_factory=deque)
    cache_hits: dict[str, int] = field(default_factory=dict)  # model -> response cache hits folded


def fold(activity: Activity, rec: Recorded) -> Activity:
    """Fold one record; records at or below `activity.seq` (seen already) and non-request events are skipped."""
    if rec.seq <= activity.seq:
        return activity
    activity.seq = rec.seq
    ev = rec.event
    trace = getattr(ev, "trace_id", None)
    if trace is None or not rec.type.startswith("request."):
        return activity
    records = activity.open_traces.get(trace)
    if records is None:
        records = activity.open_traces[trace] = []
        if len(activity.open_traces) > OPEN_TRACES:
            activity.open_traces.popitem(last=False)
    if isinstance(ev, RequestCacheHit):
        activity.cache_hits[ev.model] = activity.cache_hits.get(ev.model, 0) + 1
    if len(records) < RECORDS_PER_TRACE or isinstance(ev, RequestCompleted | RequestFailed | RequestRejected):
        records.append(rec)
    if isinstance(ev, RequestCompleted | RequestFailed | RequestRejected):
        del activity.open_traces[trace]
        _finished(activity, rec, records)
    _prune(activity, rec.ts)
    return activity


def _finished(activity: Activity, rec: Recorded, records: list[Recorded]) -> None:
    ev = rec.event
    assert isinstance(ev, RequestCompleted | RequestFailed | RequestRejected)
    received = next((r.event for r in records if isinstance(r.event, RequestReceived)), None)
    ttft = next((r.event.ttft_ms for r in records if isinstance(r.event, RequestFirstToken)), None)
    model = ev.model or (received.model if received is not None else None)
    if isinstance(ev, RequestCompleted):
        outcome: Literal["completed", "failed", "rejected"] = "completed"
        if ev.completion_tokens:
            # NOTE: the engine's predicted_ms is the decode time; without it the whole request's time is used.
            decode_s = ev.engine_timings.get("predicted_ms", ev.duration_ms) / 1000.0
            activity.generated.append(_Generated(ev.model, rec.ts - max(0.0, decode_s), rec.ts,
                                                 ev.completion_tokens))
    else:
        outcome = "failed" if isinstance(ev, RequestFailed) else "rejected"
        activity.failures.appendleft(FailureRow(
            trace_id=ev.trace_id, ts=rec.ts, model=model, outcome=outcome, status=ev.status, reason=ev.reason,
            verdict=explain(records).verdict))
    activity.requests.appendleft(RequestRow(
        trace_id=ev.trace_id, ts=rec.ts, model=model, dialect=received.dialect if received is not None else None,
        outcome=outcome, status=ev.status, ttft_ms=ttft, duration_ms=ev.duration_ms,
        completion_tokens=ev.completion_tokens if isinstance(ev, RequestCompleted) else None))


def _prune(activity: Activity, ts: float) -> None:
    """Drop generation that ended before any window a dashboard at `ts` or later could show."""
    gen = activity.generated
    while gen and gen[0].end_ts < ts - WINDOW_S:
        gen.popleft()


def tokens_per_s(activity: Activity, *, now: float, window_s: float = WINDOW_S) -> dict[str, float]:
    """Tokens per second per model over (now - window_s, now]: each request's tokens counted for the part of its
    decode that falls in the window. A model that generated nothing in the window is left out."""
    start = now - window_s
    totals: dict[str, float] = {}
    for g in activity.generated:
        lo, hi = max(g.start_ts, start), min(g.end_ts, now)
        span = g.end_ts - g.start_ts
        # A decode of no recorded length counts whole at its end.
        share = max(0.0, hi - lo) / span if span > 0 else float(start < g.end_ts <= now)
        if share > 0:
            totals[g.model] = totals.get(g.model, 0.0) + g.tokens * share
    return {m: round(t / window_s, 2) for m, t in sorted(totals.items())}


async def read_recent(log: EventLog, activity: Activity, *, upto: int | None = None) -> Activity:
    """Fold the log's last SEED_EVENTS request events (up to `upto`): a dashboard opened now shows the last
    requests and failures at once rather than only those after it opened."""
    last = upto if upto is not None else await log.last_seq()
    async for rec in log.read(after=max(activity.seq, last - SEED_EVENTS), upto=last, types=list(REQUEST_TYPES)):
        fold(activity, rec)
    activity.seq = max(activity.seq, last)
    return activity


# -- the snapshot -----------------------------------------------------------------------------------------------------

def snapshot(activity: Activity, *, rows: Sequence[Mapping[str, Any]], now: float, daemon: DaemonStatus,
             queues: Mapping[str, int], live_rows: bool = False,
             slots_busy: Mapping[str, int] | None = None,
             prefix_clients: Sequence[Mapping[str, Any]] = ()) -> Dashboard:
    """The dashboard at `now`. `rows` are `ps_rows`; `live_rows` says their in_flight is the supervisor's (the
    daemon builds it). Otherwise `slots_busy` per model (from /metrics) gives an instance's busy slots when its
    model has one instance; without either, busy slots are not known (None). `prefix_clients`: the flagged clients'
    rows (blazar/queries/prefix_clients.py)."""
    per_model: dict[str, int] = {}
    for r in rows:
        per_model[r["model"]] = per_model.get(r["model"], 0) + 1
    instances = []
    for r in rows:
        busy: int | None = None
        if live_rows:
            busy = int(r["in_flight"])
        elif slots_busy is not None and per_model[r["model"]] == 1:
            busy = int(slots_busy.get(r["model"], 0))
        left = None if r.get("expires_at") is None else max(0.0, round(float(r["expires_at"]) - now))
        instances.append(InstanceRow(
            model=r["model"], instance_id=r["instance_id"], state=r["state"], planned_bytes=int(r["planned_bytes"]),
            measured_bytes=r.get("measured_bytes"), slots=int(r.get("slots") or 0), slots_busy=busy,
            keep_alive_left_s=left, pinned=bool(r.get("pinned")), ctx_tokens=r.get("ctx_tokens"),
            kind=str(r.get("kind") or "llama-server")))
    return Dashboard(at=now, seq=activity.seq, daemon=daemon, instances=instances,
                     queues={m: int(n) for m, n in sorted(queues.items())},
                     tokens_per_s=tokens_per_s(activity, now=now), requests=list(activity.requests),
                     failures=list(activity.failures), cache_hits=dict(sorted(activity.cache_hits.items())),
                     prefix_clients=[PrefixClientRow(**{k: r[k] for k in PrefixClientRow.model_fields})
                                     for r in prefix_clients])


# -- a /metrics sample ----------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class MetricsSample:
    """The live figures the dashboard takes from a daemon's /metrics (only the daemon knows them)."""

    queue_depth: dict[str, int]
    slots_busy: dict[str, int]


_SAMPLE = re.compile(r'^(blazar_queue_depth|blazar_slots_busy)\{model="((?:[^"\\]|\\.)*)"\} (\S+)$')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def parse_metrics(text: str) -> MetricsSample:
    """Read the queue depth and busy slots per model out of the Prometheus text `/metrics` serves."""
    found: dict[str, dict[str, int]] = {"blazar_queue_depth": {}, "blazar_slots_busy": {}}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m is None:
            continue
        model = re.sub(r"\\[\\\"n]", lambda e: _UNESCAPE[e.group(0)], m.group(2))
        try:
            found[m.group(1)][model] = int(float(m.group(3)))
        except ValueError:
            continue
    return MetricsSample(queue_depth=found["blazar_queue_depth"], slots_busy=found["blazar_slots_busy"])
