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
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from blazar.events.audio import RequestAudio
from blazar.events.base import Recorded
from blazar.events.instances import InstanceEvicted, InstanceExited, InstanceReady
from blazar.events.requests import (
    HOP_ACTOR,
    RequestAdmitted,
    RequestCacheHit,
    RequestCompleted,
    RequestEnergy,
    RequestFailed,
    RequestFirstToken,
    RequestPlaced,
    RequestQueued,
    RequestReceived,
    RequestRejected,
    RequestShared,
)
from blazar.events.tuning import SpecSwitched
from blazar.projections.base import Projection
from blazar.projections.codec import codec_for

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


@dataclass(slots=True)
class Histogram:
    """One model's histogram: per-bucket counts (not cumulative; the last is the +Inf bucket), sum and count.
    Updated in place, once per observation."""

    counts: list[int]
    sum: float = 0.0
    count: int = 0


@dataclass(slots=True)
class Pending:
    """A request with no outcome yet: what its later events need of the earlier ones."""

    seq: int  # of its first event: the oldest go first when the table is pruned
    dialect: str = ""
    model: str = ""
    stream: bool | None = None  # None: its `received` was lost
    queued: str | None = None  # the model whose queue it waits in, while it waits
    ttft_ms: float | None = None
    cached: bool = False  # answered from the response cache: its tokens were not generated again


@dataclass(slots=True)
class KeyUsage:
    """What a key used on one UTC day (the day of its latest ended request), as the log tells."""

    day: int  # UTC day number (epoch s // 86400)
    requests_today: int = 0
    tokens_today: int = 0
    audio_seconds_today: float = 0.0


@dataclass(frozen=True, slots=True)
class SpecVerdict:
    """The speculation governor's latest verdict on one instance it switched."""

    model: str
    enabled: bool


def _no_histograms() -> dict[HistogramName, dict[str, Histogram]]:
    return {name: {} for name in BUCKETS}


@dataclass(slots=True)
class MetricsState:
    """The `metrics` projection's state. The counters map keys of label values joined with SEP (in the order each
    comment gives, the model last) to counts; `counter` splits them."""

    requests: dict[str, int] = field(default_factory=dict)  # status|dialect|model -> n
    histograms: dict[HistogramName, dict[str, Histogram]] = field(default_factory=_no_histograms)  # by model
    queue_depth: dict[str, int] = field(default_factory=dict)  # model -> requests queued now (as the log knows)
    tokens: dict[str, int] = field(default_factory=dict)  # in|model, out|model -> n
    loads: dict[str, int] = field(default_factory=dict)  # outcome|model -> n
    evictions: dict[str, int] = field(default_factory=dict)  # reason -> n
    crashes: dict[str, int] = field(default_factory=dict)  # model -> n
    pending: dict[str, Pending] = field(default_factory=dict)  # trace id -> its request, oldest first
    key_requests: dict[str, int] = field(default_factory=dict)  # status|key -> n
    key_tokens: dict[str, int] = field(default_factory=dict)  # in|key, out|key -> n
    keys: dict[str, KeyUsage] = field(default_factory=dict)  # key -> its usage on the day of its latest request
    shared: dict[str, int] = field(default_factory=dict)  # role|model -> requests in a shared generation
    cache_hits: dict[str, int] = field(default_factory=dict)  # source|key|model -> response cache hits (key "" owner)
    session_turns: dict[str, int] = field(default_factory=dict)  # kv|model -> turns by how they found the prefix
    routes: dict[str, int] = field(default_factory=dict)  # route -> requests received (the client's HTTP route)
    audio_requests: dict[str, int] = field(default_factory=dict)  # route|model -> speech requests completed
    audio_seconds: dict[str, float] = field(default_factory=dict)  # route|model -> seconds of audio heard or made
    key_audio_seconds: dict[str, float] = field(default_factory=dict)  # key -> seconds of audio
    spec_switches: dict[str, int] = field(default_factory=dict)  # on|model, off|model -> governor switches
    spec_enabled: dict[str, SpecVerdict] = field(default_factory=dict)  # instance id -> the governor's verdict
    spec_requests: dict[str, int] = field(default_factory=dict)  # on|model, off_client|model, off_governor|model
    # Completed requests' energy (request.completed's `energy`): measured|model, not_measured|model -> n; and, of the
    # measured ones, model -> their shares of the machine's joules and their completion tokens.
    energy_requests: dict[str, int] = field(default_factory=dict)
    energy_joules: dict[str, float] = field(default_factory=dict)
    energy_tokens: dict[str, int] = field(default_factory=dict)


def key(*values: object) -> str:
    return SEP.join(map(str, values))


def observe(state: MetricsState, histogram: HistogramName, model: str, seconds: float) -> None:
    bounds = BUCKETS[histogram]
    by_model = state.histograms[histogram]
    h = by_model.get(model)
    if h is None:
        h = by_model[model] = Histogram([0] * (len(bounds) + 1))
    # Per-bucket (not cumulative) counts: one increment per observation; the renderer accumulates. A value equal
    # to a bound belongs to that bound's bucket (le = less than or equal), which bisect_left gives.
    h.counts[bisect_left(bounds, seconds)] += 1
    h.sum += seconds
    h.count += 1


def _inc(counter: dict[str, int], k: str, n: int = 1) -> None:
    counter[k] = counter.get(k, 0) + n


def _dequeue(state: MetricsState, p: Pending) -> None:
    model = p.queued
    if model is not None:
        depth = state.queue_depth
        depth[model] = max(0, depth.get(model, 0) - 1)
        p.queued = None


def _prune(state: MetricsState) -> None:
    pending = state.pending
    if len(pending) <= PENDING_KEPT:
        return
    by_age = sorted(pending, key=lambda t: pending[t].seq)
    for trace_id in by_age[: len(by_age) - PENDING_KEPT // 2]:
        _dequeue(state, pending.pop(trace_id))


def _usage(state: MetricsState, name: str, rec: Recorded) -> KeyUsage:
    """Key `name`'s usage on the UTC day of `rec` (from the envelope): a new day starts from nothing."""
    day = int(rec.ts // DAY_S)
    usage = state.keys.get(name)
    if usage is None or usage.day != day:
        usage = state.keys[name] = KeyUsage(day)
    return usage


# The events `apply` reads, by what it does with them (a tuple: isinstance with a `X | Y` union builds it per call).
_COUNTED = (InstanceReady, InstanceExited, InstanceEvicted, RequestShared, RequestPlaced, RequestAudio, SpecSwitched,
            RequestCacheHit)
_ENDED = (RequestCompleted, RequestRejected, RequestFailed)
_REQUEST = (RequestReceived, RequestQueued, RequestAdmitted, RequestFirstToken, *_ENDED)


class MetricsProjection(Projection[MetricsState]):
    name = "metrics"
    state_type = MetricsState
    # 3: the refusal histogram; 4: shared generations (single-flight); 5: tokens relayed before a failure; 6: audio
    # seconds and the real-time factor, requests by route; 7: speculation (switches, verdicts, requests); 8: a typed
    # state (entries are objects: a histogram's, a pending request's, a key's usage, a speculation verdict); 9: energy
    # per request; 10: response cache hits (and a hit's tokens not counted as generated)
    version = 10
    types = frozenset({
        RequestAudio.TYPE, RequestReceived.TYPE, RequestQueued.TYPE, RequestAdmitted.TYPE, RequestRejected.TYPE,
        RequestFirstToken.TYPE, RequestCompleted.TYPE, RequestFailed.TYPE, RequestShared.TYPE, RequestPlaced.TYPE,
        RequestCacheHit.TYPE, InstanceReady.TYPE, InstanceExited.TYPE, InstanceEvicted.TYPE, SpecSwitched.TYPE,
    })

    def initial(self) -> MetricsState:
        return MetricsState()

    def apply(self, state: MetricsState, rec: Recorded) -> MetricsState:
        ev = rec.event
        if isinstance(ev, _COUNTED):
            self._count(state, ev, rec)
            return state
        assert isinstance(ev, _REQUEST)
        if rec.actor.startswith(HOP_ACTOR):
            return state  # a forwarded request's hop: counted once, where it came in (its tokens are in that answer)
        pending = state.pending
        if isinstance(ev, RequestReceived):
            _inc(state.routes, ev.route)
            pending[ev.trace_id] = Pending(rec.seq, ev.dialect, ev.model, ev.stream)
            _prune(state)
            return state
        p = pending.get(ev.trace_id)
        ended = isinstance(ev, _ENDED)
        if p is None:  # its `received` was lost (a crash) or pruned: what the later events tell
            p = Pending(rec.seq, model=ev.model or "")
            if not ended:
                pending[ev.trace_id] = p
                _prune(state)
        if isinstance(ev, RequestQueued):
            if p.queued is None:
                p.queued = ev.model
                _inc(state.queue_depth, ev.model)
        elif isinstance(ev, RequestAdmitted):
            _admitted(state, p, ev)
        elif isinstance(ev, RequestFirstToken):
            p.ttft_ms = ev.ttft_ms
            # NOTE: only streamed requests: a whole (non-streamed) answer's "first token" is its last one too, which
            # would fill TTFT with total latencies and ITL with zeros.
            if p.stream:
                observe(state, "ttft", ev.model, ev.ttft_ms / 1000.0)
        else:
            pending.pop(ev.trace_id, None)
            _dequeue(state, p)
            if rec.actor.startswith(KEY_ACTOR):
                _by_key(state, rec.actor[len(KEY_ACTOR):], rec, ev)
            if isinstance(ev, RequestCompleted):
                self._completed(state, ev, p)
            else:
                model = ev.model or p.model
                if isinstance(ev, RequestRejected) and ev.reason in _UNRESOLVED:
                    model = ""
                _inc(state.requests, key(ev.status, p.dialect, model))
                if isinstance(ev, RequestRejected) and ev.duration_ms is not None:
                    observe(state, "refusal", model, ev.duration_ms / 1000.0)
        return state

    def _completed(self, state: MetricsState, ev: RequestCompleted, p: Pending) -> None:
        _inc(state.requests, key(ev.status, p.dialect, ev.model))
        if ev.energy is not None:
            _energy(state, ev.model, ev.energy, ev.completion_tokens)
        if ev.shared == "follower" or p.cached:
            return  # its tokens are the leader's, or the cache's: the engine did not generate them again
        if ev.prompt_tokens:
            _inc(state.tokens, key("in", ev.model), ev.prompt_tokens)
        n = ev.completion_tokens
        if n:
            _inc(state.tokens, key("out", ev.model), n)
        ttft = p.ttft_ms
        # The time between tokens after the first: (duration - ttft) spread over the n - 1 gaps.
        if p.stream and n is not None and n > 1 and ttft is not None and ev.duration_ms >= ttft:
            observe(state, "itl", ev.model, (ev.duration_ms - ttft) / (n - 1) / 1000.0)

    def _count(self, state: MetricsState,
               ev: InstanceReady | InstanceExited | InstanceEvicted | RequestShared | RequestPlaced | RequestAudio
               | SpecSwitched | RequestCacheHit, rec: Recorded) -> None:
        if isinstance(ev, InstanceExited):
            state.spec_enabled.pop(ev.instance_id, None)
        if isinstance(ev, SpecSwitched):
            _inc(state.spec_switches, key("on" if ev.enabled else "off", ev.model))
            state.spec_enabled[ev.instance_id] = SpecVerdict(ev.model, ev.enabled)
        elif isinstance(ev, RequestAudio):
            if not rec.actor.startswith(HOP_ACTOR):  # counted once, where the request came in
                _audio(state, rec, ev)
        elif isinstance(ev, RequestShared):
            _inc(state.shared, key(ev.role, ev.model))
        elif isinstance(ev, RequestCacheHit):
            _cache_hit(state, rec, ev)
        elif isinstance(ev, RequestPlaced):
            _inc(state.session_turns, key(ev.kv, ev.model))
        elif isinstance(ev, InstanceReady):
            _inc(state.loads, key("ready", ev.model))
        elif isinstance(ev, InstanceEvicted):
            _inc(state.evictions, ev.reason)
        elif ev.reason in ("load_failed", "load_timeout"):
            _inc(state.loads, key(ev.reason, ev.model))
        elif ev.reason == "crashed":
            _inc(state.crashes, ev.model)

    def view(self, state: MetricsState) -> Any:
        """Everything but the table of requests still in flight (shown as a count)."""
        shown = codec_for(MetricsState).jsonable(replace(state, pending={}))
        del shown["pending"]
        return shown | {"in_flight": len(state.pending)}


def _energy(state: MetricsState, model: str, energy: RequestEnergy, tokens: int | None) -> None:
    if energy.joules is None:
        _inc(state.energy_requests, key("not_measured", model))
        return
    _inc(state.energy_requests, key("measured", model))
    state.energy_joules[model] = round(state.energy_joules.get(model, 0.0) + energy.joules, 6)
    _inc(state.energy_tokens, model, tokens or 0)


def _cache_hit(state: MetricsState, rec: Recorded, ev: RequestCacheHit) -> None:
    """A hit, counted by source, key and model; its request's tokens are then not counted as generated."""
    p = state.pending.get(ev.trace_id)
    if p is not None:
        p.cached = True
    who = rec.actor[len(KEY_ACTOR):] if rec.actor.startswith(KEY_ACTOR) else ""
    _inc(state.cache_hits, key(ev.source, who, ev.model))


def _admitted(state: MetricsState, p: Pending, ev: RequestAdmitted) -> None:
    _dequeue(state, p)
    observe(state, "queue_wait", ev.model, ev.waited_ms / 1000.0)
    if ev.spec is not None:
        _inc(state.spec_requests, key(ev.spec, ev.model))


def _audio(state: MetricsState, rec: Recorded, ev: RequestAudio) -> None:
    """A speech request's audio: its seconds by route and model (and its key's), its real-time factor."""
    k = key(ev.route, ev.model)
    _inc(state.audio_requests, k)
    state.audio_seconds[k] = state.audio_seconds.get(k, 0.0) + ev.audio_seconds
    if ev.real_time_factor is not None:
        observe(state, "rtf", ev.model, ev.real_time_factor)
    if rec.actor.startswith(KEY_ACTOR):
        name = rec.actor[len(KEY_ACTOR):]
        state.key_audio_seconds[name] = state.key_audio_seconds.get(name, 0.0) + ev.audio_seconds
        _usage(state, name, rec).audio_seconds_today += ev.audio_seconds


def _by_key(state: MetricsState, name: str, rec: Recorded,
            ev: RequestCompleted | RequestRejected | RequestFailed) -> None:
    """One ended request of key `name`: its status, its tokens, and today's (UTC, from the envelope) usage."""
    _inc(state.key_requests, key(ev.status, name))
    usage = _usage(state, name, rec)
    usage.requests_today += 1
    if isinstance(ev, RequestCompleted | RequestFailed):
        # A failed stream's tokens are those it relayed before it ended (a hang-up counts what the client got).
        tokens_in = (ev.prompt_tokens or 0) if isinstance(ev, RequestCompleted) else 0
        tokens_out = ev.completion_tokens or 0
        if tokens_in:
            _inc(state.key_tokens, key("in", name), tokens_in)
        if tokens_out:
            _inc(state.key_tokens, key("out", name), tokens_out)
        usage.tokens_today += tokens_in + tokens_out


def split(k: str, n: int) -> list[str]:
    """The `n` label values joined in `k` (the last, a model name, whole even if it holds SEP)."""
    return k.split(SEP, n - 1)


# The counters (MetricsState's fields of that name) and how many label values each joins into its keys (the model,
# where there is one, last).
Counter = Literal["requests", "tokens", "loads", "evictions", "crashes", "key_requests", "key_tokens", "shared",
                  "cache_hits", "session_turns", "routes", "audio_requests", "spec_switches", "spec_requests",
                  "energy_requests", "energy_tokens"]
LABELS: dict[Counter, int] = {"requests": 3, "tokens": 2, "loads": 2, "evictions": 1, "crashes": 1,
                              "key_requests": 2, "key_tokens": 2, "shared": 2, "cache_hits": 3, "session_turns": 2,
                              "routes": 1, "audio_requests": 2, "spec_switches": 2, "spec_requests": 2,
                              "energy_requests": 2, "energy_tokens": 1}


def counter(state: MetricsState, name: Counter) -> list[tuple[tuple[str, ...], int]]:
    """Counter `name`'s samples, each its label values (in the order MetricsState's comments give) and its count,
    in a stable order (by the joined key)."""
    n = LABELS[name]
    counts: dict[str, int] = getattr(state, name)
    return [(tuple(split(k, n)), v) for k, v in sorted(counts.items())]


def spec_enabled(state: MetricsState) -> dict[str, tuple[str, int]]:
    """The governor's verdict per running instance it has switched: instance id -> (model, 1 on / 0 off)."""
    return {iid: (v.model, int(v.enabled)) for iid, v in state.spec_enabled.items()}


def audio_seconds(state: MetricsState) -> list[tuple[tuple[str, str], float]]:
    """Seconds of audio heard or made, by (route, model), in a stable order."""
    out: list[tuple[tuple[str, str], float]] = []
    for k, v in sorted(state.audio_seconds.items()):
        route, model = split(k, 2)
        out.append(((route, model), v))
    return out


def histograms(state: MetricsState, name: HistogramName) -> list[tuple[str, Histogram]]:
    """Histogram `name` per model, by model (the state's own entries: read them, do not keep them)."""
    return sorted(state.histograms[name].items())


def key_usage(state: MetricsState, name: str) -> KeyUsage | None:
    """Key `name`'s usage on the UTC day of its latest ended request (a copy), or None before its first."""
    u = state.keys.get(name)
    return None if u is None else replace(u)


def audio_seconds_on(state: MetricsState, name: str, day: int) -> float:
    """The seconds of audio key `name` used on UTC day `day` (a restarted daemon keeps counting daily_audio_s)."""
    u = state.keys.get(name)
    return u.audio_seconds_today if u is not None and u.day == day else 0.0


def tokens_on(state: MetricsState, name: str, day: int) -> int:
    """The tokens key `name` used on UTC day `day` (a restarted daemon keeps counting the daily limit)."""
    u = state.keys.get(name)
    return u.tokens_today if u is not None and u.day == day else 0
