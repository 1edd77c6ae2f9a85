"""The `metrics` projection: the counters and histograms that `/metrics` exposes (blazar/queries/metrics.py),
folded from request and instance events: requests by model, status and dialect, and by route;
TTFT, inter-token latency and
queue wait; queue depth; tokens; loads, evictions and engine crashes; per API key (the actor "key:<name>" of its
request events) requests by status, tokens, audio seconds, and the UTC day's usage; speech requests' audio seconds
and real-time factor (`request.audio`); the speculation governor's switches (`spec.switched`) and verdict per
instance, and requests by whether they could draft. Instance gauges come from `residency`.

Label values are joined with SEP into plain string keys, the model always last so that a model name is the only
value that may itself hold SEP (`split(SEP, n - 1)` gives it back whole).
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from typing import Any, Literal

from blazar.events.audio import RequestAudio
from blazar.events.base import Recorded
from blazar.events.instances import InstanceEvicted, InstanceExited, InstanceReady
from blazar.events.requests import (
    HOP_ACTOR,
    RequestAdmitted,
    RequestCompleted,
    RequestFailed,
    RequestFirstToken,
    RequestPlaced,
    RequestQueued,
    RequestReceived,
    RequestRejected,
    RequestShared,
)
from blazar.events.tuning import SpecSwitched
from blazar.projections.base import Projection, State, TypedState

SEP = "|"

# Upper bounds in seconds (the +Inf bucket is implicit). NOTE: changing a tuple changes what the stored counts mean:
# bump MetricsProjection.version with it.
TTFT_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0)
QUEUE_WAIT_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
# A refusal should cost the server well under 5 ms: the buckets are fine below that.
REFUSAL_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
# Processing seconds per audio second (under 1: faster than real time), not seconds.
RTF_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0)
HistogramName = Literal["ttft", "itl", "queue_wait", "refusal", "rtf"]
BUCKETS: dict[HistogramName, tuple[float, ...]] = {
    "ttft": TTFT_BUCKETS_S, "itl": ITL_BUCKETS_S, "queue_wait": QUEUE_WAIT_BUCKETS_S, "refusal": REFUSAL_BUCKETS_S,
    "rtf": RTF_BUCKETS,
}

# Requests with no outcome yet. Their outcome is lost when the daemon dies mid-request (or with the writer's last
# batch), so the table is pruned to its newest PENDING_KEPT // 2 once it passes PENDING_KEPT.
PENDING_KEPT = 10_000
# Rejections whose model is whatever the client typed: labelled "" so that a client cannot mint label values.
_UNRESOLVED = frozenset({"model_not_found", "invalid_request"})
LOAD_OUTCOMES = ("ready", "load_failed", "load_timeout")
KEY_ACTOR = "key:"
DAY_S = 86400.0


def key(*values: object) -> str:
    return SEP.join(str(v) for v in values)


def observe(state: State, histogram: HistogramName, model: str, seconds: float) -> None:
    bounds = BUCKETS[histogram]
    h = state["histograms"][histogram].get(model)
    if h is None:
        h = state["histograms"][histogram][model] = {"counts": [0] * (len(bounds) + 1), "sum": 0.0, "count": 0}
    # Per-bucket (not cumulative) counts: one increment per observation; the renderer accumulates. A value equal
    # to a bound belongs to that bound's bucket (le = less than or equal), which bisect_left gives.
    h["counts"][bisect_left(bounds, seconds)] += 1
    h["sum"] += seconds
    h["count"] += 1


def _inc(counter: dict[str, int], k: str, n: int = 1) -> None:
    counter[k] = counter.get(k, 0) + n


def _dequeue(state: State, p: dict[str, Any]) -> None:
    model = p.get("queued")
    if model is not None:
        depth = state["queue_depth"]
        depth[model] = max(0, depth.get(model, 0) - 1)
        p["queued"] = None


def _prune(state: State) -> None:
    pending: dict[str, dict[str, Any]] = state["pending"]
    if len(pending) <= PENDING_KEPT:
        return
    by_age = sorted(pending, key=lambda t: pending[t]["seq"])
    for trace_id in by_age[: len(by_age) - PENDING_KEPT // 2]:
        _dequeue(state, pending.pop(trace_id))


class MetricsState(TypedState):
    """The `metrics` projection's state, read through `counter`, `histograms`, `queue_depth`, `key_usage` and
    `tokens_on`."""

    __slots__ = ()


class MetricsProjection(Projection[State]):
    name = "metrics"
    state_type = MetricsState
    # 3: the refusal histogram; 4: shared generations (single-flight); 5: tokens relayed before a failure; 6: audio
    # seconds and the real-time factor, requests by route; 7: speculation (switches, verdicts, requests)
    version = 7
    types = frozenset({
        RequestAudio.TYPE, RequestReceived.TYPE, RequestQueued.TYPE, RequestAdmitted.TYPE, RequestRejected.TYPE,
        RequestFirstToken.TYPE, RequestCompleted.TYPE, RequestFailed.TYPE, RequestShared.TYPE, RequestPlaced.TYPE,
        InstanceReady.TYPE, InstanceExited.TYPE, InstanceEvicted.TYPE, SpecSwitched.TYPE,
    })

    def initial(self) -> State:
        return {
            "requests": {},  # status|dialect|model -> n
            "histograms": {name: {} for name in BUCKETS},  # name -> model -> {counts, sum, count}
            "queue_depth": {},  # model -> requests queued now (as far as the log knows)
            "tokens": {},  # in|model, out|model -> n
            "loads": {},  # outcome|model -> n
            "evictions": {},  # reason -> n
            "crashes": {},  # model -> n
            "pending": {},  # trace id -> {seq, dialect, model, stream, queued, ttft_ms}
            "key_requests": {},  # status|key -> n
            "key_tokens": {},  # in|key, out|key -> n
            "keys": {},  # key -> {day (UTC day number), requests_today, tokens_today}
            "shared": {},  # role|model -> requests that led, followed or took over a shared generation
            "session_turns": {},  # kv|model -> a session's turns by how they found its prefix: warm, restored, cold
            "routes": {},  # route -> requests received (the client's HTTP route: bounded, never the model typed)
            "audio_requests": {},  # route|model -> speech requests completed (transcriptions, translations, speech)
            "audio_seconds": {},  # route|model -> seconds of audio heard or made (a float)
            "key_audio_seconds": {},  # key -> seconds of audio (a float)
            "spec_switches": {},  # on|model, off|model -> times the governor switched speculation
            "spec_enabled": {},  # instance id -> [model, 1 or 0]: the governor's verdict (instances it switched)
            "spec_requests": {},  # on|model, off_client|model, off_governor|model -> requests on speculative instances
        }

    def apply(self, state: State, rec: Recorded) -> State:
        ev = rec.event
        if isinstance(ev, InstanceReady | InstanceExited | InstanceEvicted | RequestShared | RequestPlaced
                      | RequestAudio | SpecSwitched):
            self._count(state, ev, rec)
            return state
        assert isinstance(ev, RequestReceived | RequestQueued | RequestAdmitted | RequestRejected
                          | RequestFirstToken | RequestCompleted | RequestFailed)
        if rec.actor.startswith(HOP_ACTOR):
            return state  # a forwarded request's hop: counted once, where it came in (its tokens are in that answer)
        pending: dict[str, dict[str, Any]] = state["pending"]
        if isinstance(ev, RequestReceived):
            _inc(state["routes"], ev.route)
            pending[ev.trace_id] = {"seq": rec.seq, "dialect": ev.dialect, "model": ev.model, "stream": ev.stream,
                                    "queued": None, "ttft_ms": None}
            _prune(state)
            return state
        p = pending.get(ev.trace_id)
        ended = isinstance(ev, RequestCompleted | RequestRejected | RequestFailed)
        if p is None:  # its `received` was lost (a crash) or pruned: what the later events tell
            p = {"seq": rec.seq, "dialect": "", "model": ev.model or "", "stream": None, "queued": None,
                 "ttft_ms": None}
            if not ended:
                pending[ev.trace_id] = p
                _prune(state)
        if isinstance(ev, RequestQueued):
            if p["queued"] is None:
                p["queued"] = ev.model
                _inc(state["queue_depth"], ev.model)
        elif isinstance(ev, RequestAdmitted):
            _admitted(state, p, ev)
        elif isinstance(ev, RequestFirstToken):
            p["ttft_ms"] = ev.ttft_ms
            # NOTE: only streamed requests: a whole (non-streamed) answer's "first token" is its last one too, which
            # would fill TTFT with total latencies and ITL with zeros.
            if p["stream"]:
                observe(state, "ttft", ev.model, ev.ttft_ms / 1000.0)
        else:
            pending.pop(ev.trace_id, None)
            _dequeue(state, p)
            if rec.actor.startswith(KEY_ACTOR):
                _by_key(state, rec.actor[len(KEY_ACTOR):], rec, ev)
            if isinstance(ev, RequestCompleted):
                self._completed(state, ev, p)
            else:
                model = ev.model or p["model"]
                if isinstance(ev, RequestRejected) and ev.reason in _UNRESOLVED:
                    model = ""
                _inc(state["requests"], key(ev.status, p["dialect"], model))
                if isinstance(ev, RequestRejected) and ev.duration_ms is not None:
                    observe(state, "refusal", model, ev.duration_ms / 1000.0)
        return state

    def _completed(self, state: State, ev: RequestCompleted, p: dict[str, Any]) -> None:
        _inc(state["requests"], key(ev.status, p["dialect"], ev.model))
        if ev.shared == "follower":
            return  # its tokens are the leader's: the engine did not generate them again
        if ev.prompt_tokens:
            _inc(state["tokens"], key("in", ev.model), ev.prompt_tokens)
        n = ev.completion_tokens
        if n:
            _inc(state["tokens"], key("out", ev.model), n)
        ttft = p["ttft_ms"]
        # The time between tokens after the first: (duration - ttft) spread over the n - 1 gaps.
        if p["stream"] and n is not None and n > 1 and ttft is not None and ev.duration_ms >= ttft:
            observe(state, "itl", ev.model, (ev.duration_ms - ttft) / (n - 1) / 1000.0)

    def _count(self, state: State,
               ev: InstanceReady | InstanceExited | InstanceEvicted | RequestShared | RequestPlaced | RequestAudio
               | SpecSwitched, rec: Recorded) -> None:
        if isinstance(ev, InstanceExited):
            state["spec_enabled"].pop(ev.instance_id, None)
        if isinstance(ev, SpecSwitched):
            _inc(state["spec_switches"], key("on" if ev.enabled else "off", ev.model))
            state["spec_enabled"][ev.instance_id] = [ev.model, int(ev.enabled)]
        elif isinstance(ev, RequestAudio):
            if not rec.actor.startswith(HOP_ACTOR):  # counted once, where the request came in
                _audio(state, rec, ev)
        elif isinstance(ev, RequestShared):
            _inc(state["shared"], key(ev.role, ev.model))
        elif isinstance(ev, RequestPlaced):
            _inc(state["session_turns"], key(ev.kv, ev.model))
        elif isinstance(ev, InstanceReady):
            _inc(state["loads"], key("ready", ev.model))
        elif isinstance(ev, InstanceEvicted):
            _inc(state["evictions"], ev.reason)
        elif ev.reason in ("load_failed", "load_timeout"):
            _inc(state["loads"], key(ev.reason, ev.model))
        elif ev.reason == "crashed":
            _inc(state["crashes"], ev.model)

    def view(self, state: State) -> Any:
        """Everything but the table of requests still in flight (shown as a count)."""
        return {k: v for k, v in state.items() if k != "pending"} | {"in_flight": len(state["pending"])}


def _admitted(state: State, p: dict[str, Any], ev: RequestAdmitted) -> None:
    _dequeue(state, p)
    observe(state, "queue_wait", ev.model, ev.waited_ms / 1000.0)
    if ev.spec is not None:
        _inc(state["spec_requests"], key(ev.spec, ev.model))


def _audio(state: State, rec: Recorded, ev: RequestAudio) -> None:
    """A speech request's audio: its seconds by route and model (and its key's), its real-time factor."""
    _inc(state["audio_requests"], key(ev.route, ev.model))
    seconds = state["audio_seconds"]
    k = key(ev.route, ev.model)
    seconds[k] = seconds.get(k, 0.0) + ev.audio_seconds
    if ev.real_time_factor is not None:
        observe(state, "rtf", ev.model, ev.real_time_factor)
    if rec.actor.startswith(KEY_ACTOR):
        name = rec.actor[len(KEY_ACTOR):]
        by_key = state["key_audio_seconds"]
        by_key[name] = by_key.get(name, 0.0) + ev.audio_seconds
        day = int(rec.ts // DAY_S)
        usage = state["keys"].get(name)
        if usage is None or usage["day"] != day:
            usage = state["keys"][name] = {"day": day, "requests_today": 0, "tokens_today": 0}
        usage["audio_seconds_today"] = usage.get("audio_seconds_today", 0.0) + ev.audio_seconds


def _by_key(state: State, name: str, rec: Recorded, ev: RequestCompleted | RequestRejected | RequestFailed) -> None:
    """One ended request of key `name`: its status, its tokens, and today's (UTC, from the envelope) usage."""
    _inc(state["key_requests"], key(ev.status, name))
    day = int(rec.ts // DAY_S)
    usage = state["keys"].get(name)
    if usage is None or usage["day"] != day:
        usage = state["keys"][name] = {"day": day, "requests_today": 0, "tokens_today": 0}
    usage["requests_today"] += 1
    if isinstance(ev, RequestCompleted | RequestFailed):
        # A failed stream's tokens are those it relayed before it ended (a hang-up counts what the client got).
        tokens_in = (ev.prompt_tokens or 0) if isinstance(ev, RequestCompleted) else 0
        tokens_out = ev.completion_tokens or 0
        if tokens_in:
            _inc(state["key_tokens"], key("in", name), tokens_in)
        if tokens_out:
            _inc(state["key_tokens"], key("out", name), tokens_out)
        usage["tokens_today"] += tokens_in + tokens_out


def split(k: str, n: int) -> list[str]:
    """The `n` label values joined in `k` (the last, a model name, whole even if it holds SEP)."""
    return k.split(SEP, n - 1)


# The counters and how many label values each joins into its keys (the model, where there is one, last).
Counter = Literal["requests", "tokens", "loads", "evictions", "crashes", "key_requests", "key_tokens", "shared",
                  "session_turns", "routes", "audio_requests", "spec_switches", "spec_requests"]
LABELS: dict[Counter, int] = {"requests": 3, "tokens": 2, "loads": 2, "evictions": 1, "crashes": 1,
                              "key_requests": 2, "key_tokens": 2, "shared": 2, "session_turns": 2, "routes": 1,
                              "audio_requests": 2, "spec_switches": 2, "spec_requests": 2}


def counter(state: MetricsState, name: Counter) -> list[tuple[tuple[str, ...], int]]:
    """Counter `name`'s samples, each its label values (in the order the comment in `initial` gives) and its count,
    in a stable order (by the joined key)."""
    n = LABELS[name]
    return [(tuple(split(k, n)), int(v)) for k, v in sorted(state._raw.get(name, {}).items())]


def spec_enabled(state: MetricsState) -> dict[str, tuple[str, int]]:
    """The governor's verdict per running instance it has switched: instance id -> (model, 1 on / 0 off)."""
    return {iid: (v[0], int(v[1])) for iid, v in state._raw.get("spec_enabled", {}).items()}


def audio_seconds(state: MetricsState) -> list[tuple[tuple[str, str], float]]:
    """Seconds of audio heard or made, by (route, model), in a stable order."""
    out: list[tuple[tuple[str, str], float]] = []
    for k, v in sorted(state._raw.get("audio_seconds", {}).items()):
        route, model = split(k, 2)
        out.append(((route, model), float(v)))
    return out


def key_audio_seconds(state: MetricsState) -> dict[str, float]:
    """Seconds of audio per key, ever (a copy)."""
    return {k: float(v) for k, v in state._raw.get("key_audio_seconds", {}).items()}


@dataclass(frozen=True, slots=True)
class Histogram:
    """One model's histogram: per-bucket counts (not cumulative; the last is the +Inf bucket), sum and count."""

    counts: tuple[int, ...]
    sum: float
    count: int


def histograms(state: MetricsState, name: HistogramName) -> list[tuple[str, Histogram]]:
    """Histogram `name` per model, by model."""
    return [(model, Histogram(counts=tuple(h["counts"]), sum=float(h["sum"]), count=int(h["count"])))
            for model, h in sorted(state._raw["histograms"][name].items())]


def queue_depth(state: MetricsState) -> dict[str, int]:
    """Requests queued now per model, as far as the log knows (a copy)."""
    return dict(state._raw["queue_depth"])


@dataclass(frozen=True, slots=True)
class KeyUsage:
    """What a key used on one UTC day (the day of its latest ended request), as the log tells."""

    day: int  # UTC day number (epoch s // 86400)
    requests_today: int
    tokens_today: int
    audio_seconds_today: float = 0.0


def key_usage(state: MetricsState, name: str) -> KeyUsage | None:
    """Key `name`'s usage on the UTC day of its latest ended request, or None before its first."""
    u = state._raw["keys"].get(name)
    return None if u is None else KeyUsage(day=int(u["day"]), requests_today=int(u["requests_today"]),
                                           tokens_today=int(u["tokens_today"]),
                                           audio_seconds_today=float(u.get("audio_seconds_today", 0.0)))


def audio_seconds_on(state: MetricsState, name: str, day: int) -> float:
    """The seconds of audio key `name` used on UTC day `day` (a restarted daemon keeps counting daily_audio_s)."""
    u = key_usage(state, name)
    return u.audio_seconds_today if u is not None and u.day == day else 0.0


def tokens_on(state: MetricsState, name: str, day: int) -> int:
    """The tokens key `name` used on UTC day `day` (a restarted daemon keeps counting the daily limit)."""
    u = key_usage(state, name)
    return u.tokens_today if u is not None and u.day == day else 0
