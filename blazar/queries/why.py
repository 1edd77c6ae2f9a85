"""`blazar why TRACE`: one request's story told from the log: every decision on its way with the numbers it was
based on, as offsets from its arrival, and a one-line verdict. `explain` is pure (records in, words out);
`resolve_trace` and `load_trace` read the log for it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from blazar.errors import TraceNotFound
from blazar.events.audio import RequestAudio
from blazar.events.base import Recorded
from blazar.events.instances import (
    InstanceEvicted,
    InstanceExited,
    InstanceReady,
    InstanceStarted,
    InstanceStarting,
)
from blazar.events.log import EventLog
from blazar.events.requests import (
    HOP_ACTOR,
    MediaFacts,
    ReasoningFacts,
    RequestAdmitted,
    RequestBestOfChosen,
    RequestBounded,
    RequestCacheHit,
    RequestCacheMissed,
    RequestCandidateScored,
    RequestCascadeJudged,
    RequestCompleted,
    RequestEnergy,
    RequestFailed,
    RequestFirstToken,
    RequestForwarded,
    RequestLoopStopped,
    RequestMediaChecked,
    RequestPlaced,
    RequestPrefixCompared,
    RequestQueued,
    RequestReceived,
    RequestRejected,
    RequestRerouted,
    RequestRouted,
    RequestShared,
)
from blazar.events.tuning import Posture
from blazar.queries.prefix_words import prefix_text, prefix_verdict
from blazar.queries.why_swaps import SWAP_TEXT

# A trace id prefix shorter than this is too likely to be ambiguous to be worth a look-up.
MIN_PREFIX = 8
# Instance events this long after the request's last event still belong to its story (a crash is noticed late).
GRACE_S = 5.0
_INSTANCE_TYPES = (InstanceStarting.TYPE, InstanceStarted.TYPE, InstanceReady.TYPE, InstanceEvicted.TYPE,
                   InstanceExited.TYPE)

REJECT_WORDS = {
    "queue_full": "queue full", "queue_timeout": "waited too long in the queue",
    "global_cap": "the gateway's request cap was reached", "context_length_exceeded": "prompt longer than the context",
    "model_not_found": "no such model", "invalid_request": "invalid request",
    "circuit_open": "the model's crash circuit is open", "insufficient_memory": "not enough memory to load the model",
    "no_engine": "no engine is installed", "load_failed": "the model failed to load",
    "shutting_down": "the daemon is shutting down",
    "model_not_allowed": "the model is outside the key's scope",
    "rate_limit_exceeded": "a limit of the key was reached",
    "deadline_unmeetable": "the deadline could not be met",
}
FAIL_WORDS = {
    "client_disconnected": "the client disconnected", "engine_error": "the engine returned an error",
    "engine_crashed": "the engine crashed", "timeout": "timed out", "internal_error": "internal error",
}




@dataclass(frozen=True, slots=True)
class Step:
    offset_ms: float  # from the request's arrival; negative for an instance event before it (a load it joined)
    seq: int
    type: str
    text: str
    data: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"offset_ms": self.offset_ms, "seq": self.seq, "type": self.type, "text": self.text, "data": self.data}


@dataclass(frozen=True, slots=True)
class Explanation:
    trace_id: str
    outcome: str  # completed | failed | rejected | in_progress
    status: int | None
    model: str | None
    dialect: str | None
    route: str | None
    received_ts: float
    verdict: str
    steps: list[Step]
    actor: str | None  # who asked: "key:<name>" where keys are on, else the daemon's actor
    # queue_wait_ms, load_ms, ttft_ms, duration_ms, tokens_in, tokens_out, tokens_per_s (None: not recorded)
    figures: dict[str, float | None]
    posture: ServedPosture | None = None  # the posture of the instance that served it (None: no start in the log)

    def to_json(self) -> dict[str, Any]:
        return {"trace_id": self.trace_id, "outcome": self.outcome, "status": self.status, "model": self.model,
                "dialect": self.dialect, "route": self.route, "actor": self.actor, "received_ts": self.received_ts,
                "verdict": self.verdict, "figures": self.figures, "steps": [s.to_json() for s in self.steps],
                "posture": None if self.posture is None else self.posture.to_json()}


@dataclass(frozen=True)
class ServedPosture:
    """The tuned posture the instance that served a request ran (from its instance.starting), and the
    profile.adopted that chose it, or the stale one its load passed by."""

    instance_id: str
    posture: Posture | None
    profile_seq: int | None
    profile_stale_seq: int | None

    @property
    def label(self) -> str:
        return self.posture.label() if self.posture is not None else "defaults"

    def text(self) -> str:
        if self.profile_seq is not None:
            why = f"chosen by profile.adopted seq {self.profile_seq}"
        elif self.profile_stale_seq is not None:
            why = (f"profile.adopted seq {self.profile_stale_seq} was stale (measured on another engine build) and "
                   "not applied")
        else:
            why = "no profile adopted"
        return f"instance {self.instance_id} ran at {self.label}: {why}"

    def to_json(self) -> dict[str, Any]:
        return {"instance_id": self.instance_id, "posture": self.label,
                "posture_fields": None if self.posture is None else self.posture.model_dump(exclude_none=True),
                "profile_seq": self.profile_seq, "profile_stale_seq": self.profile_stale_seq, "text": self.text()}


# -- words and numbers ---------------------------------------------------------------------------------------------

def fmt_ms(ms: float | None) -> str:
    if ms is None:
        return "?"
    if abs(ms) < 1000:
        return f"{ms:.0f} ms"
    if abs(ms) < 10_000:
        return f"{ms / 1000:.1f} s"
    if abs(ms) < 60_000:
        return f"{ms / 1000:.0f} s"
    minutes, seconds = divmod(round(ms / 1000), 60)
    return f"{minutes} min {seconds} s" if seconds else f"{minutes} min"


def fmt_bytes(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.0f} MiB"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _victim(ev: InstanceEvicted) -> str:
    why = f"idle {fmt_ms(ev.idle_s * 1000)}" if ev.reason == "idle" or ev.idle_s else ev.reason.replace("_", " ")
    return f"{ev.model} ({why})"


def tokens_per_s(done: RequestCompleted, ttft_ms: float | None) -> float | None:
    """The decode rate the client saw: the tokens after the first over the time after it; else the engine's own
    figure; else all tokens over the whole request."""
    n = done.completion_tokens
    if n is not None and n > 1 and ttft_ms is not None and done.duration_ms > ttft_ms:
        return (n - 1) / ((done.duration_ms - ttft_ms) / 1000.0)
    engine = done.engine_timings.get("predicted_per_second")
    if engine is not None and math.isfinite(engine):
        return float(engine)
    if n and done.duration_ms > 0:
        return n / (done.duration_ms / 1000.0)
    return None


# -- the story -----------------------------------------------------------------------------------------------------

# The events a story keeps one of, by the attribute that holds it.
_ONE_OF: dict[type, str] = {
    RequestReceived: "received", RequestQueued: "queued", RequestAdmitted: "admitted", RequestRouted: "routed",
    RequestFirstToken: "first", RequestPlaced: "placed", RequestShared: "shared", RequestBestOfChosen: "best_of",
    RequestRerouted: "rerouted", RequestAudio: "audio", RequestPrefixCompared: "prefix", RequestCacheHit: "cache_hit",
}


class _Story:
    """Reads one trace's records in seq order, keeping what the verdict needs."""

    def __init__(self, records: list[Recorded]) -> None:
        self.records = records
        self.received: RequestReceived | None = None
        self.queued: RequestQueued | None = None
        self.admitted: RequestAdmitted | None = None
        self.routed: RequestRouted | None = None
        self.first: RequestFirstToken | None = None
        self.placed: RequestPlaced | None = None
        self.shared: RequestShared | None = None
        self.cache_hit: RequestCacheHit | None = None
        self.best_of: RequestBestOfChosen | None = None
        self.cascade: list[RequestCascadeJudged] = []
        self.rerouted: RequestRerouted | None = None
        self.end: RequestCompleted | RequestFailed | RequestRejected | None = None
        self.audio: RequestAudio | None = None
        self.prefix: RequestPrefixCompared | None = None
        self.evictions: dict[str, InstanceEvicted] = {}
        for rec in records:
            ev = rec.event
            if rec.actor.startswith(HOP_ACTOR):
                continue  # the hop on the node it was forwarded to: its steps are shown, the verdict is this node's
            one = _ONE_OF.get(type(ev))
            if one is not None:
                setattr(self, one, ev)  # the last of its type is the one the verdict reads
            elif isinstance(ev, RequestCascadeJudged):
                self.cascade.append(ev)
            elif isinstance(ev, RequestCompleted | RequestFailed | RequestRejected):
                self.end = ev
            elif isinstance(ev, InstanceEvicted):
                self.evictions[ev.instance_id] = ev

    @property
    def streamed(self) -> bool:
        return self.received is None or self.received.stream

    @property
    def ttft_ms(self) -> float | None:
        """Time to the first token of a streamed answer; None for a whole answer (its first byte is its last)."""
        return self.first.ttft_ms if self.first is not None and self.streamed else None

    def evicted(self) -> list[str]:
        """The routed event's victims, with the eviction's own reason and idle time where that event is known."""
        if self.routed is None:
            return []
        named = []
        for victim in self.routed.evicted:
            found = self.evictions.get(victim.instance_id)
            named.append(_victim(found) if found is not None
                         else f"{victim.model} ({victim.instance_id}, {victim.reason})")
        return named

    def text(self, rec: Recorded) -> str:
        ev = rec.event
        render = _TEXT.get(type(ev))
        if render is not None:
            return render(self, ev)
        fields = ", ".join(f"{k}={v}" for k, v in ev.model_dump(mode="json").items() if k != "trace_id")
        return f"{rec.type}: {fields}"

    def waited(self) -> str | None:
        a = self.admitted
        if a is None or a.waited_ms <= 0:
            return None
        ahead = a.queued_behind or (self.queued.position - 1 if self.queued is not None else 0)
        share = "" if a.share_wait is None else \
            f" ({_plural(a.share_wait.ahead_other_tenants, 'request')} of other keys went first by fair share)"
        return f"waited {fmt_ms(a.waited_ms)} behind {_plural(ahead, 'request')}{share}"

    def loaded(self) -> str | None:
        r = self.routed
        if r is None or not r.cold:
            return None
        victims = self.evicted()
        return f"cold load {fmt_ms(r.load_ms)}" + (f", evicted {', '.join(victims)}" if victims else "")

    def again(self) -> str | None:
        """A request routed again because its first instance was gone."""
        r = self.rerouted
        if r is not None and r.reason == "swap_recalled":
            return "routed again: recalled behind a swap"
        return None if r is None else f"routed again: instance {r.instance_id} of {r.model} was gone"

    def session(self) -> str | None:
        """How a session's turn found its prefix: warm, restored (with the tokens it saved), or cold and why."""
        p = self.placed
        if p is None:
            return None
        if p.kv == "warm":
            return f"session {p.session} warm on slot {p.slot_id}"
        if p.kv == "restored":
            return f"session {p.session} restored from the KV bank ({p.restored_tokens} tokens not prefilled again)"
        return f"session {p.session} cold: {p.reason}"

    def fan_out(self) -> str | None:
        """Cached, shared, best-of-N or cascade: what the answer came from."""
        if self.cache_hit is not None:
            return f"answered from the response cache ({self.cache_hit.source}), no engine asked"
        if self.shared is not None and self.shared.role != "leader":
            how = "shared the generation of" if self.shared.role == "follower" else "took over the generation of"
            return f"{how} {self.shared.leader_trace_id}"
        if self.shared is not None:
            return "led a shared generation"
        if self.best_of is not None:
            b = self.best_of
            return f"best of {b.used} (asked {b.asked}): candidate {b.winner} won, {b.reason}"
        if self.cascade:
            tried = ", ".join(f"{c.model} ({c.reason.replace('_', ' ')})" for c in self.cascade)
            return f"cascade: {tried}"
        return None

    def verdict(self, duration_ms: float | None) -> str:
        end = self.end
        context = [p for p in (self.again(), self.waited(), self.loaded(), self.session(), self.fan_out(),
                               prefix_verdict(self.prefix)) if p]
        if isinstance(end, RequestRejected):
            words = REJECT_WORDS.get(end.reason, end.reason)
            retry = f", retry after {end.retry_after_s:g} s" if end.retry_after_s is not None else ""
            detail = f" ({end.detail})" if end.detail else ""
            return f"rejected {end.status}: {words}{detail}{retry}"
        if isinstance(end, RequestFailed):
            detail = f": {end.detail}" if end.detail else ""
            head = f"failed {end.status} after {fmt_ms(duration_ms)}: {FAIL_WORDS.get(end.reason, end.reason)}{detail}"
            return "; ".join([head, *context])
        if isinstance(end, RequestCompleted):
            parts = context or ["no wait, warm instance"]
            if self.audio is not None:
                parts.append(_audio_words(self.audio))
            if self.ttft_ms is not None:
                parts.append(f"first token at {fmt_ms(self.ttft_ms)}")
            tps = tokens_per_s(end, self.ttft_ms)
            if end.completion_tokens is not None:
                parts.append(f"{_plural(end.completion_tokens, 'token')} out"
                             + (f" at {tps:.0f} tok/s" if tps is not None else ""))
            if end.forced_call == "cut":
                parts.append(_forced_words(end))
            if end.energy is not None and end.energy.joules is not None:  # not measured: said in its step
                parts.append(energy_words(end.energy))
            return f"completed {end.status} in {fmt_ms(end.duration_ms)}: " + "; ".join(parts)
        last = self.records[-1]
        return (f"no outcome recorded: last {last.type} ({self.text(last)}); still running, or its end was lost "
                "when the daemon stopped")


def _media(m: MediaFacts) -> str:
    """What a request's images and audio were (their bytes are never recorded), and the prompt tokens the images
    became where the projector says; the usage counts them with the text."""
    said = []
    if m.images:
        fetched = f", {m.images_fetched} fetched" if m.images_fetched else ""
        tokens = f", {m.image_tokens} prompt tokens" if m.image_tokens is not None else ""
        said.append(f"{m.images} image{'s' if m.images != 1 else ''} ({', '.join(m.image_types)}; {m.image_bytes} B, "
                    f"{m.image_pixels / 1e6:.2f} Mpx{tokens}{fetched})")
    if m.audio_clips:
        said.append(f"{m.audio_clips} audio clip{'s' if m.audio_clips != 1 else ''} ({', '.join(m.audio_formats)}; "
                    f"{m.audio_bytes} B)")
    return " and ".join(said)


def _received(s: _Story, ev: RequestReceived) -> str:
    extra = [p for p in (
        "streaming" if ev.stream else None,
        f"{ev.body_bytes} B body" if ev.body_bytes else None,
        f"max_tokens {ev.max_tokens}" if ev.max_tokens is not None else None,
        f"priority {ev.priority}" if ev.priority else None,
        f"from {ev.client}" if ev.client else None,
        _media(ev.media) if ev.media is not None else None,
    ) if p]
    head = f"on the node it was forwarded to by {ev.forwarded_from}: " if ev.forwarded_from else ""
    model = f" for {ev.model}" if ev.model else ""  # an upload or a batch names no model
    return f"{head}received {ev.route} ({ev.dialect}){model}" + (f": {', '.join(extra)}" if extra else "")


def _forwarded(s: _Story, ev: RequestForwarded) -> str:
    why = ("it is not in this node's store" if ev.reason == "not_stored_here"
           else "it is ready there and not loaded here")
    took = ev.observations.get("peer_load_ms")
    cost = f"; loading it took {fmt_ms(float(took))} there" if took is not None else ""
    return f"forwarded to node {ev.node} ({ev.url}), instance {ev.instance_id}: {why}{cost}"


def _queued(s: _Story, ev: RequestQueued) -> str:
    return (f"queued at position {ev.position} behind {ev.position - 1} ({ev.busy} of {ev.slots} slots busy, "
            f"{ev.depth} waiting)")


_SPEC_WORDS = {"on": "speculative decoding on", "off_client": "speculative decoding off (the client asked)",
               "off_governor": "speculative decoding off (the governor turned it off: `blazar events --type "
                               "spec.switched` says why)"}


def _admitted(s: _Story, ev: RequestAdmitted) -> str:
    when = f"after {fmt_ms(ev.waited_ms)}" if ev.waited_ms > 0 else "at once"
    spec = f"; {_SPEC_WORDS[ev.spec]}" if ev.spec is not None else ""
    share = ev.share_wait
    waited = "" if share is None else (
        f"; it waited for other keys' fair share of the slots: {_plural(share.ahead_other_tenants, 'request')} of "
        f"other keys, queued after it, went first (its key's weight {share.tenant_weight}; `blazar keys limits "
        "--weight` sets it)")
    return f"admitted {when} ({ev.busy} of {ev.slots} slots busy now{spec}){waited}"


def _drafted(s: _Story, ev: RequestCompleted) -> str | None:
    """What speculation did for the request (the engine's timings), and whether an "off" was honoured."""
    drafted, accepted = ev.engine_timings.get("draft_n"), ev.engine_timings.get("draft_n_accepted")
    if not drafted:
        return None
    words = f"{drafted:.0f} tokens drafted, {accepted or 0:.0f} accepted"
    if s.admitted is not None and s.admitted.spec in ("off_client", "off_governor"):
        words += " although speculation was off (this engine build ignores speculative.n_max per request)"
    return words


def _placed(s: _Story, ev: RequestPlaced) -> str:
    head = f"placed on slot {ev.slot_id} for session {ev.session}: "
    if ev.kv == "warm":
        return head + f"warm ({ev.reason})"
    if ev.kv == "restored":
        took = f" in {fmt_ms(ev.restore_ms)}" if ev.restore_ms is not None else ""
        return head + f"restored {ev.restored_tokens} tokens from the KV bank{took} ({ev.reason})"
    return head + f"cold: {ev.reason}"


def _shared(s: _Story, ev: RequestShared) -> str:
    if ev.role == "leader":
        return f"leads a shared generation (flight {ev.flight}): identical deterministic requests join it"
    if ev.role == "follower":
        return (f"joined the identical generation of {ev.leader_trace_id} (flight {ev.flight}) at chunk "
                f"{ev.joined_at_chunk}; its answer is replayed from the start")
    return f"took over the shared generation of {ev.leader_trace_id}: its client went away"


def _cache_hit(s: _Story, ev: RequestCacheHit) -> str:
    similar = f", similarity {ev.similarity:.3f}" if ev.similarity is not None else ""
    return (f"answered from the response cache ({ev.source}{similar}): entry {ev.entry[:16]}, stored "
            f"{fmt_ms(ev.age_s * 1000)} before; played back in the caller's dialect, no engine asked")


def _cache_missed(s: _Story, ev: RequestCacheMissed) -> str:
    if ev.unavailable is not None:
        embed = f" (embedding request {ev.embed_trace_id})" if ev.embed_trace_id else ""
        return f"not answered from the {ev.source} cache: the prompt could not be embedded: {ev.unavailable}{embed}"
    if ev.best_similarity is None:
        return f"not answered from the {ev.source} cache: no stored prompt of the same tenant and request to compare"
    return (f"not answered from the {ev.source} cache: the nearest stored prompt's similarity "
            f"{ev.best_similarity:.3f} is below the threshold {ev.threshold:.3f}")


def _candidate(s: _Story, ev: RequestCandidateScored) -> str:
    score = f"mean logprob {ev.mean_logprob:.3f}" if ev.mean_logprob is not None else "no logprobs"
    valid = "valid" if ev.valid else f"invalid ({ev.invalid_reason})"
    return (f"candidate {ev.index} (seed {ev.seed}): {valid}, {score}, finish {ev.finish_reason}, "
            f"{ev.completion_tokens} tokens" + (": the winner" if ev.won else ""))


def _best_of(s: _Story, ev: RequestBestOfChosen) -> str:
    return f"best of {ev.used} (asked {ev.asked}): candidate {ev.winner} won: {ev.reason}"


def _cascade(s: _Story, ev: RequestCascadeJudged) -> str:
    score = f", mean logprob {ev.mean_logprob:.3f}" if ev.mean_logprob is not None else ""
    floor = f" (needs {ev.min_logprob:g})" if ev.min_logprob is not None and ev.reason == "low_confidence" else ""
    verb = "accepted" if ev.accepted else "passed on"
    return (f"cascade step {ev.step}: {ev.model} {verb}: {ev.reason.replace('_', ' ')}{score}{floor}"
            + (f": {ev.detail}" if ev.detail else ""))


def _rejected(s: _Story, ev: RequestRejected) -> str:
    text = f"rejected {ev.status}: {REJECT_WORDS.get(ev.reason, ev.reason)}" + (f": {ev.detail}" if ev.detail else "")
    if ev.retry_after_s is not None:
        text += f"; retry after {ev.retry_after_s:g} s"
    if ev.observations:
        text += " [" + ", ".join(f"{k}={v}" for k, v in sorted(ev.observations.items())) + "]"
    return text


def _routed(s: _Story, ev: RequestRouted) -> str:
    if not ev.cold:
        return f"routed to warm instance {ev.instance_id} of {ev.model} ({_where(ev.port, ev.instance_id)})"
    victims = s.evicted()
    return (f"cold load of {ev.model} on instance {ev.instance_id}: {fmt_ms(ev.load_ms)}"
            + (f", evicted {', '.join(victims)}" if victims else ""))


def _rerouted(s: _Story, ev: RequestRerouted) -> str:
    if ev.reason == "swap_recalled":
        return f"recalled from {ev.model}'s queue: {ev.detail}; routed again, behind the swap"
    return (f"instance {ev.instance_id} of {ev.model} was gone before it took the request ({ev.detail}): its slot "
            "given back, routed again")


def _bounded(s: _Story, ev: RequestBounded) -> str:
    return (f"output bounded: {ev.prompt_tokens} prompt tokens + {ev.max_tokens} max_tokens exceed the context of "
            f"{ev.ctx_tokens}, so max_tokens is {ev.bounded_max_tokens}")


def _media_checked(s: _Story, ev: RequestMediaChecked) -> str:
    return f"read its media: {_media(ev.media) or 'none'}"


def _loop_stopped(s: _Story, ev: RequestLoopStopped) -> str:
    return (f"stopped in a loop after {ev.completion_tokens} tokens: the answer's last {ev.span_chars} characters "
            f"were one {ev.period_chars}-character piece over and over (a base model served greedy), so the "
            "generation was ended there as a stop")


def _first(s: _Story, ev: RequestFirstToken) -> str:
    when = fmt_ms(ev.ttft_ms)
    return f"first token at {when}" if s.streamed else f"whole answer ready at {when} (not streamed)"


def _completed(s: _Story, ev: RequestCompleted) -> str:
    tps = tokens_per_s(ev, s.ttft_ms)
    parts = [f"{ev.prompt_tokens if ev.prompt_tokens is not None else '?'} in / "
             f"{ev.completion_tokens if ev.completion_tokens is not None else '?'} out"]
    if tps is not None:
        parts.append(f"{tps:.0f} tok/s")
    if ev.cached_tokens:
        parts.append(f"{ev.cached_tokens} prompt tokens cached")
    if ev.finish_reason:
        parts.append(f"finish: {ev.finish_reason}")
    if ev.forced_call is not None:
        parts.append(_forced_words(ev))
    if ev.reasoning is not None:
        parts.append(_reasoning_words(ev.reasoning))
    if (drafted := _drafted(s, ev)) is not None:
        parts.append(drafted)
    if ev.energy is not None:
        parts.append(energy_words(ev.energy))
    return f"completed {ev.status} in {fmt_ms(ev.duration_ms)}: " + ", ".join(parts)


def _reasoning_words(r: ReasoningFacts) -> str:
    """How the thinking was bounded, and by whom (blazar/serving/reasoning.py)."""
    budget = "no thinking budget" if r.budget is None else f"thinking budget {_plural(r.budget, 'token')}"
    effort = f" (effort {r.effort})" if r.effort is not None else ""
    held = (", held by the engine" if r.enforced_by == "engine"
            else f" (the request asked {_plural(r.requested, 'token')}): this engine build ignores the request's "
                 f"thinking budget; the model's load flag ({r.budget} tokens) held it"
            if r.enforced_by == "load_flag" and r.requested is not None
            else ", held by the model's load flag (--reasoning-budget)" if r.enforced_by == "load_flag"
            else ", not enforced (this engine build has no per-request budget)" if r.budget is not None else "")
    used = f", {_plural(r.reasoning_tokens, 'token')} of thinking streamed" if r.reasoning_tokens is not None else ""
    return f"{budget}{effort}{held}{used}"
def energy_words(e: RequestEnergy) -> str:
    """A request's energy: its share, per token, and whose joules it is a share of; or that none was measured."""
    if e.joules is None:
        return "energy not measured (this machine reports no readable RAPL or NVML counter)"
    source = {"rapl": "RAPL", "nvml": "NVML", "rapl+nvml": "RAPL + NVML"}.get(e.source, e.source)
    per = f", {e.tokens_per_joule:g} tokens/J" if e.tokens_per_joule else ""
    shared = (f" (its share of the machine's {e.machine_joules:g} J, {e.overlapped} requests in flight over its span)"
              if (e.overlapped or 1) > 1 else " (the machine's, over its span)")
    return f"energy {e.joules:g} J{per} by {source}{shared}"


def _forced_words(ev: RequestCompleted) -> str:
    if ev.forced_call == "made":
        return "the forced tool call made"
    at = f" at {_plural(ev.completion_tokens, 'token')}" if ev.completion_tokens is not None else ""
    return f"the forced tool call was cut{at} by max_tokens: no call, no text"


def _audio_words(ev: RequestAudio) -> str:
    """A speech request's audio in words: what was heard or made, its format, how fast."""
    did = {"transcriptions": "transcribed", "translations": "translated", "speech": "spoke"}[ev.route]
    rtf = f", real-time factor {ev.real_time_factor:.3f}" if ev.real_time_factor is not None else ""
    size = (f" from {ev.input_chars} characters" if ev.input_chars is not None
            else f" ({fmt_bytes(ev.input_bytes)} uploaded)" if ev.input_bytes is not None else "")
    return f"{ev.kind} {did} {ev.audio_seconds:.2f} s of audio{size} as {ev.response_format}{rtf}"


def _audio(s: _Story, ev: RequestAudio) -> str:
    extra = [p for p in (f"language {ev.language}" if ev.language else None,
                         f"voice {ev.voice}" if ev.voice else None, "streamed" if ev.streamed else None) if p]
    return (f"{ev.model}: {_audio_words(ev)} in {fmt_ms(ev.processing_ms)}"
            + (f" ({', '.join(extra)})" if extra else ""))


def _failed(s: _Story, ev: RequestFailed) -> str:
    return (f"failed {ev.status}: {FAIL_WORDS.get(ev.reason, ev.reason)}" + (f": {ev.detail}" if ev.detail else "")
            + (f" after {fmt_ms(ev.duration_ms)}" if ev.duration_ms else ""))


def _shape(ev: InstanceStarting | InstanceStarted) -> str:
    """A llama-server child's slots and context; a whisper or piper child's kind (it has no context)."""
    if ev.kind != "llama-server":
        return f"a {ev.kind} child, {_plural(ev.slots, 'slot')}"
    return f"{_plural(ev.slots, 'slot')} of {ev.ctx_tokens} ctx"


def _where(port: int, instance_id: str) -> str:
    """Where an instance listens: its port, or a Unix socket of its own (port 0 for a child of ours; a remote's or
    another node's stand-in, `remote:NAME` or `node:NAME`, has port 0 too)."""
    return f"port {port}" if port or ":" in instance_id else "a Unix socket"


def _started(s: _Story, ev: InstanceStarted) -> str:
    shape = _shape(ev)
    return (f"instance {ev.instance_id} of {ev.model} spawned (pid {ev.pid}, {_where(ev.port, ev.instance_id)}, "
            f"{shape}, planned {fmt_bytes(ev.planned_bytes)})")


def _starting(s: _Story, ev: InstanceStarting) -> str:
    shape = _shape(ev)
    return (f"instance {ev.instance_id} of {ev.model} starting ({_where(ev.port, ev.instance_id)}, {shape}, "
            f"planned {fmt_bytes(ev.planned_bytes)})")


def _ready(s: _Story, ev: InstanceReady) -> str:
    return f"instance {ev.instance_id} of {ev.model} ready after {fmt_ms(ev.load_ms)}"


def _eviction(s: _Story, ev: InstanceEvicted) -> str:
    parts = [f"reason {ev.reason.replace('_', ' ')}"]
    if ev.idle_s:
        parts.append(f"idle {fmt_ms(ev.idle_s * 1000)}")
    if ev.for_model:
        parts.append(f"for {ev.for_model}")
    if ev.bytes_freed:
        parts.append(f"frees {fmt_bytes(ev.bytes_freed)}")
    return f"evicted {ev.model} instance {ev.instance_id}: " + ", ".join(parts)


def _exited(s: _Story, ev: InstanceExited) -> str:
    code = f" (exit code {ev.exit_code})" if ev.exit_code is not None else ""
    detail = f": {ev.detail}" if ev.detail else ""
    return f"instance {ev.instance_id} of {ev.model} exited: {ev.reason}{code}{detail}"


_TEXT: dict[type, Callable[[_Story, Any], str]] = {
    RequestReceived: _received, RequestQueued: _queued, RequestAdmitted: _admitted, RequestRejected: _rejected,
    RequestRouted: _routed, RequestFirstToken: _first, RequestCompleted: _completed, RequestFailed: _failed,
    RequestPlaced: _placed, RequestShared: _shared, RequestCacheHit: _cache_hit, RequestCacheMissed: _cache_missed,
    RequestCandidateScored: _candidate,
    RequestBestOfChosen: _best_of,
    RequestCascadeJudged: _cascade, RequestForwarded: _forwarded, RequestRerouted: _rerouted,
    RequestBounded: _bounded, RequestLoopStopped: _loop_stopped, RequestAudio: _audio,
    RequestMediaChecked: _media_checked, RequestPrefixCompared: lambda s, ev: prefix_text(ev),
    InstanceStarting: _starting, InstanceStarted: _started,
    InstanceReady: _ready, InstanceEvicted: _eviction, InstanceExited: _exited,
    **SWAP_TEXT,
}


def _belongs(rec: Recorded, routed: RequestRouted | None, start: float, end: float) -> bool:
    """A request event always; an instance event inside the request's time (a warm instance's start an hour ago is
    not part of this story), except the start of the instance a cold request waited for, which may predate it."""
    if rec.type.startswith("request."):
        return True
    iid = getattr(rec.event, "instance_id", None)
    if routed is not None and routed.cold and iid == routed.instance_id and rec.type != InstanceExited.TYPE:
        return rec.ts <= end + GRACE_S
    return start <= rec.ts <= end + GRACE_S


def explain(records: Iterable[Recorded]) -> Explanation:
    """The story of one trace from its request events plus, where given, the events of the instance it was routed
    to and of the instances evicted for it. Records may come in any order; duplicates (by seq) count once."""
    recs = sorted({r.seq: r for r in records}.values(), key=lambda r: r.seq)
    requests = [r for r in recs if r.type.startswith("request.")] or recs
    if not requests:
        raise ValueError("explain() needs at least one record")
    first = next((r for r in requests if isinstance(r.event, RequestReceived) and not r.actor.startswith(HOP_ACTOR)),
                 next((r for r in requests if isinstance(r.event, RequestReceived)), requests[0]))
    start, end = first.ts, requests[-1].ts
    probe = _Story(requests)
    kept = [r for r in recs if _belongs(r, probe.routed, start, end)]
    story = _Story(kept)
    end_ev = story.end
    trace_id = getattr(first.event, "trace_id", None) or first.trace_id or ""
    duration: float | None = None
    if isinstance(end_ev, RequestCompleted | RequestFailed) and end_ev.duration_ms:
        duration = end_ev.duration_ms
    elif end_ev is not None:
        duration = (end - start) * 1000.0
    outcome = ("completed" if isinstance(end_ev, RequestCompleted) else "failed" if isinstance(end_ev, RequestFailed)
               else "rejected" if isinstance(end_ev, RequestRejected) else "in_progress")
    steps = [Step(round((r.ts - start) * 1000.0, 3), r.seq, r.type, story.text(r), r.event.model_dump(mode="json"))
             for r in kept]
    done = end_ev if isinstance(end_ev, RequestCompleted) else None
    model = next((getattr(r.event, "model", None) for r in reversed(requests) if getattr(r.event, "model", None)),
                 None)
    figures: dict[str, float | None] = {
        "queue_wait_ms": story.admitted.waited_ms if story.admitted is not None else None,
        "load_ms": story.routed.load_ms if story.routed is not None and story.routed.cold else None,
        "ttft_ms": story.ttft_ms,
        "duration_ms": duration,
        "tokens_in": done.prompt_tokens if done is not None else None,
        "tokens_out": done.completion_tokens if done is not None else None,
        "tokens_per_s": tokens_per_s(done, story.ttft_ms) if done is not None else None,
    }
    if story.audio is not None:
        figures |= {"audio_seconds": story.audio.audio_seconds, "real_time_factor": story.audio.real_time_factor,
                    "processing_ms": story.audio.processing_ms}
    return Explanation(
        trace_id=trace_id, outcome=outcome, status=end_ev.status if end_ev is not None else None, model=model,
        dialect=story.received.dialect if story.received else None,
        route=story.received.route if story.received else None, received_ts=start,
        verdict=story.verdict(duration), steps=steps, figures=figures, actor=first.actor,
        posture=_served_posture(recs, probe.routed),
    )


def _served_posture(recs: list[Recorded], routed: RequestRouted | None) -> ServedPosture | None:
    """The posture of the instance the request was routed to, from its start (however long before the request it
    was: load_trace reads that instance's events)."""
    if routed is None:
        return None
    for rec in recs:
        ev = rec.event
        if isinstance(ev, InstanceStarting | InstanceStarted) and ev.instance_id == routed.instance_id:
            return ServedPosture(instance_id=ev.instance_id, posture=ev.posture, profile_seq=ev.profile_seq,
                                 profile_stale_seq=ev.profile_stale_seq)
    return None


# -- reading the log -----------------------------------------------------------------------------------------------

async def resolve_trace(log: EventLog, text: str) -> str:
    """The trace id `text` names: itself when the log has it, else the one trace id it is a unique prefix of."""
    async for _ in log.read(trace_id=text, limit=1):
        return text
    if len(text) < MIN_PREFIX:
        raise TraceNotFound(f"no trace {text!r} in the log (a prefix must be at least {MIN_PREFIX} characters)")
    found = await log.trace_ids_starting(text, limit=2)
    if not found:
        raise TraceNotFound(f"no trace {text!r} in the log")
    if len(found) > 1:
        raise TraceNotFound(f"{text!r} is the start of more than one trace id ({found[0]}, {found[1]}, ...): "
                            "give more of it")
    return found[0]


async def load_trace(log: EventLog, trace_id: str) -> list[Recorded]:
    """The trace's records, the events of the instance each `request.routed` names, and the evictions made for it."""
    records = [r async for r in log.read(trace_id=trace_id)]
    routed = [r for r in records if isinstance(r.event, RequestRouted)]
    for rec in routed:
        ev = rec.event
        assert isinstance(ev, RequestRouted)
        records += [r async for r in log.read(stream=f"instance:{ev.instance_id}", types=_INSTANCE_TYPES)]
        # The routed event names its victims; their eviction events hold the why.
        for victim in ev.evicted:
            if victim.instance_id:
                records += [r async for r in log.read(stream=f"instance:{victim.instance_id}",
                                                      types=[InstanceEvicted.TYPE])]
    return sorted({r.seq: r for r in records}.values(), key=lambda r: r.seq)
