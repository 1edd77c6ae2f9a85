"""Request events: the life of one API request, every decision on its way with what it was based on. They go through
the group-commit writer (CONTROL = False): never on the token path, and a crash may lose the last batch of them.

All of one request share the envelope's trace id and the stream `trace:<id>`; `blazar why TRACE` replays them.
Content (prompts, completions) is never recorded: only sizes, counts and timings.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, TypeGuard, get_args

from pydantic import BaseModel, ConfigDict, Field

from blazar.events.base import Event
from blazar.events.bounds import NAME, OBSERVATIONS, URL, WORD, Bound, First, Text, bound_of, entries, items, name_chars
from blazar.events.types import register, upcaster

Dialect = Literal["openai", "ollama", "anthropic"]

# Why a request was refused before any token (`request.rejected`): the pipeline's refusals (blazar/serving/) and the
# load's, by their error codes (blazar/errors.py). `rejected_as` maps any error code onto it.
RejectReason = Literal[
    "queue_full", "queue_timeout", "global_cap", "context_length_exceeded", "model_not_found",
    "invalid_request", "circuit_open", "insufficient_memory", "no_engine", "load_failed", "shutting_down",
    # What else a load can refuse with (blazar/errors.py's http_status): a pin in the way, an unusable engine.
    "model_pinned", "engine_incompatible", "engine_error", "invalid_model_file", "hub_error",
    # A key's refusals: a model outside its --models scope (403), one of its limits reached (429), no room left in
    # its storage quota for a file or a batch (413).
    "model_not_allowed", "rate_limit_exceeded", "storage_quota_exceeded",
    # A deadline the measured drain says cannot be met (or that passed in the queue).
    "deadline_unmeetable",
    # A route the model's kind does not serve (a chat to a whisper model), refused before any load.
    "model_kind_mismatch",
    # A remote engine whose circuit is open, or whose key the daemon's environment lacks.
    "remote_unavailable",
]
# Why a request that had started did not complete (`request.failed`).
FailReason = Literal["client_disconnected", "engine_error", "engine_crashed", "timeout", "internal_error"]
# Single-flight: who ran the generation, who got it replayed, who took it over.
SharedRole = Literal["leader", "follower", "promoted"]
# A cascade step's verdict.
CascadeReason = Literal["accepted", "invalid", "low_confidence", "last", "refused"]

_REJECT_REASONS: frozenset[str] = frozenset(get_args(RejectReason))
_FAIL_REASONS: frozenset[str] = frozenset(get_args(FailReason))


def is_reject_reason(code: str) -> TypeGuard[RejectReason]:
    return code in _REJECT_REASONS


def is_fail_reason(code: str) -> TypeGuard[FailReason]:
    return code in _FAIL_REASONS


# The actor of a forwarded request's events on the node that serves it: "node:<the node it came in at>".
HOP_ACTOR = "node:"


class _RequestEvent(Event):
    CONTROL = False
    AUDIT = False
    ARCHIVABLE = True

    trace_id: str

    def stream_key(self) -> str:
        return f"trace:{self.trace_id}"


# The base of every request event (each carries its trace id): for readers that take any of them.
RequestEvent = _RequestEvent


# How hard a model reasons: OpenAI's `reasoning_effort` values (its SDK's), which every dialect maps to.
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]
REASONING_EFFORTS: tuple[str, ...] = get_args(ReasoningEffort)
_EFFORT_OF: dict[object, ReasoningEffort] = {e: e for e in get_args(ReasoningEffort)}


def effort_of(value: object) -> ReasoningEffort | None:
    """`value` as an effort, if it is one."""
    return _EFFORT_OF.get(value) if isinstance(value, str) else None


class ReasoningFacts(BaseModel):
    """How a chat request's thinking was bounded (blazar/serving/reasoning.py): the budget in tokens it was given
    (None: unbounded), the effort the template was told, who held the thinking to the budget ("engine": llama-server's
    per-request `thinking_budget_tokens`; "load_flag": the instance's `--reasoning-budget`, on a build without the
    per-request field; "none": nothing did, the build cannot, or there was no budget), the budget the request asked
    where the load flag held another (`requested`), and the thinking tokens the answer carried (counted in a stream,
    one per engine event; None for a whole answer)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    budget: int | None = None
    effort: ReasoningEffort | None = None
    enforced_by: Literal["engine", "load_flag", "none"] = "none"
    requested: int | None = None
    reasoning_tokens: int | None = None


class MediaFacts(BaseModel):
    """The images and audio clips a chat request carried, as their bytes showed them (never the bytes): how many, of
    which types, how large, and (where the projector says) the prompt tokens they become; the
    request's usage (`request.completed`'s prompt_tokens) counts them with the text."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    images: int = 0
    # image/png, ... one per image, in order
    image_types: Annotated[list[str], items(256, WORD)] = Field(default_factory=list)
    image_bytes: int = 0  # decoded, all images together
    image_pixels: int = 0
    images_fetched: int = 0  # of them, fetched from http(s) URLs (image_fetch)
    # The prompt tokens (embeddings) the images become, where the projector makes every image the same size
    # (blazar/fit/projector.py `tokens_per_image`); None where only the engine knows (then see prompt_tokens).
    image_tokens: int | None = None
    audio_clips: int = 0
    audio_formats: Annotated[list[str], items(256, WORD)] = Field(default_factory=list)  # wav, mp3
    audio_bytes: int = 0


@register
class RequestReceived(_RequestEvent):
    """A request arrived: what the client asked, as its dialect parsed it (sizes and options, never the content), and
    what it asked of Blazar itself."""

    TYPE = "request.received"

    dialect: Dialect
    route: str  # "/v1/chat/completions"
    model: str  # as the client named it
    stream: bool = False
    body_bytes: int = 0
    priority: int = 0  # higher is served first (X-Blazar-Priority)
    max_tokens: int | None = None
    client: str | None = None  # the peer address
    # The x-blazar-trace-id the client sent, when it is not the trace id: already used, or a traceparent's won.
    client_trace_id: str | None = None
    # The client's W3C traceparent, when it sent a valid one: the trace it belongs to and the span that is this
    # request's parent (an OpenTelemetry export makes the request's span its child).
    parent_trace_id: str | None = None
    parent_span_id: str | None = None
    # What the client asked of Blazar itself (headers X-Blazar-*, or the dialect's body fields).
    session: str | None = None  # the conversation it names (in its tenant's namespace: "key:alice/chat-1")
    deadline_ms: int | None = None  # earliest-deadline-first in the queue; refused at once when it cannot be met
    best_of: int | None = None  # N candidates, the best one answered
    # models tried in turn until one answers well
    cascade: Annotated[list[str], items(4, NAME)] = Field(default_factory=list)
    # The node that forwarded it here (one trace across nodes: this hop's events share the first node's trace id).
    forwarded_from: str | None = None
    # Whose prompts, sessions and cache it shares (keys are tenants): "key:<name>" or "group:<cache group>"; None for
    # the machine's owner (keys off, the CLI's own credential).
    tenant: str | None = None
    # Its images and audio parts (counts, types, sizes): recorded here by daemons before 2026-12-06, which checked
    # them before the key's scope and limits; now they are checked after, and `request.media_checked` says it.
    media: MediaFacts | None = None


@register
class RequestMediaChecked(_RequestEvent):
    """The request's images and audio parts were read and checked (blazar/serving/media.py), after the key's scope,
    the model's kind and the key's limits allowed it (docs/2.ARCHITECTURE.md, a request's life): what they were, by
    their bytes (counts, types, sizes; never the bytes)."""

    TYPE = "request.media_checked"

    media: MediaFacts


@register
class RequestForwarded(_RequestEvent):
    """The decision to serve a request on another node (gateways sharing the log), where its model is ready, rather
    than load it here; its reasons and the numbers they rest on."""

    TYPE = "request.forwarded"

    model: str
    node: str
    url: Annotated[str, URL]
    instance_id: str  # the peer's instance that has the model ready
    reason: Literal["ready_there", "not_stored_here"]
    observations: Annotated[dict[str, Any], OBSERVATIONS] = Field(default_factory=dict)


@register
class RequestQueued(_RequestEvent):
    """A decision: no free slot; the request waits at `position` (1 = next) behind `depth - 1` others."""

    TYPE = "request.queued"

    model: str
    instance_id: str | None = None
    position: int
    depth: int
    slots: int
    busy: int


class ShareWait(BaseModel):
    """Why a request waited for other tenants (blazar/serving/fair_queue.py): `ahead_other_tenants` requests of other
    keys (or the keyless caller), queued after it at its priority, were admitted before it because their share of the
    slots came first; `tenant_weight` is its own key's weight."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ahead_other_tenants: int = Field(ge=1)
    tenant_weight: int = Field(default=1, ge=1)


@register
class RequestAdmitted(_RequestEvent):
    """A decision: a slot is the request's; `waited_ms` in the queue (0 when it was free at once)."""

    TYPE = "request.admitted"

    model: str
    instance_id: str | None = None
    waited_ms: float = 0.0
    slots: int
    busy: int  # after admitting this one
    queued_behind: int = 0  # how many were ahead of it when it queued
    slot_id: int | None = None  # the engine slot it holds (llama-server's id_slot)
    # On a speculative instance: whether it may draft ("on"), or was sent speculative.n_max 0 because its client
    # asked (X-Blazar-Spec: off) or the speculation governor had turned it off. None: the instance does not speculate.
    spec: Literal["on", "off_client", "off_governor"] | None = None
    # It waited for other tenants' fair share (None: nobody passed it).
    share_wait: ShareWait | None = None


@register
class RequestRejected(_RequestEvent):
    """A decision: the request was refused before any token, with the status, the reason and the numbers."""

    TYPE = "request.rejected"

    model: str | None = None
    status: int
    reason: RejectReason
    detail: Text
    retry_after_s: float | None = None
    observations: Annotated[dict[str, Any], OBSERVATIONS] = Field(default_factory=dict)
    duration_ms: float | None = None  # from the request's arrival to the refusal, at the server


class Evicted(BaseModel):
    """One instance evicted to make room for a request's load."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str
    instance_id: str
    reason: Annotated[str, WORD]  # the eviction's reason: memory, max_loaded_models, reshape, ...


EnergySource = Literal["rapl", "nvml", "rapl+nvml", "not_measured"]


class RequestEnergy(BaseModel):
    """The energy a completed request used, where the machine reports it (RAPL on CPUs, NVML on GPUs): the counters are
    the machine's, so `machine_joules` is everything the machine used from the request's arrival to its end, and
    `joules` the request's share of it, the machine's joules split evenly at each moment among the requests in flight
    then (blazar/serving/energy.py). `overlapped`: how many requests' spans overlapped this one's, itself included
    (1: it ran alone, and `joules` is `machine_joules`). `source` "not_measured": the machine reports neither counter,
    or a read failed (then every other field is None)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: EnergySource
    joules: float | None = None
    machine_joules: float | None = None
    tokens_per_joule: float | None = None  # completion tokens per joule of the request's share
    overlapped: int | None = None


@register
class RequestRouted(_RequestEvent):
    """Which instance serves the request, warm or cold, and what the supervisor did to get it.

    v2: `evicted` holds structured victims (v1 said "model (instance_id, reason)" in prose)."""

    TYPE = "request.routed"
    V = 2

    model: str
    instance_id: str
    port: int
    cold: bool  # True: this request waited for a load
    load_ms: int | None = None
    # What made room: the first 16 (each is an instance.evicted of its own, in full)
    evicted: Annotated[list[Evicted], First(16, Bound(bound_of(Evicted) or 0))] = Field(default_factory=list)
    ctx_tokens: int | None = None


_V1_VICTIM = re.compile(r"^(?P<model>.*?) \((?P<instance_id>[^,()]+), (?P<reason>[^()]*)\)$")


@upcaster(RequestRouted.TYPE, 1)
def _routed_v1(payload: dict[str, Any]) -> dict[str, Any]:
    """v1 → v2: each "model (instance_id, reason)" becomes {model, instance_id, reason}. An entry that does not
    parse keeps its text as the model, with an unknown instance and reason, so nothing is lost."""
    victims = []
    for entry in payload.get("evicted") or []:
        m = _V1_VICTIM.match(str(entry))
        victims.append(m.groupdict() if m else {"model": str(entry), "instance_id": "", "reason": "unknown"})
    return {**payload, "evicted": victims}


@register
class RequestBounded(_RequestEvent):
    """A decision: the prompt fits the slot's context but prompt + max_tokens does not, so the output is capped at
    what the context leaves (`max_tokens_over_context = bound`); the answer's header says so, and a generation that
    reaches the cap finishes with `length`."""

    TYPE = "request.bounded"

    model: str
    instance_id: str
    prompt_tokens: int  # the engine's exact count, template applied
    max_tokens: int  # what the client (or the model's settings) asked
    bounded_max_tokens: int  # what it runs with: ctx_tokens - prompt_tokens
    ctx_tokens: int  # the slot's context


@register
class RequestLoopStopped(_RequestEvent):
    """A decision: the streamed answer of a model served with its probed template (greedy: docs/4.MODELS.md) ended in
    one piece of text said over and over (blazar/serving/loop_guard.py), so the generation was stopped there and
    the answer finished as a stop. Sizes only, never the text."""

    TYPE = "request.loop_stopped"

    model: str
    instance_id: str
    period_chars: int  # the piece's length (whitespace runs counted as one)
    span_chars: int  # the stretch of it at the end of the answer: at least three rounds
    completion_tokens: int  # generated when it was stopped


@register
class RequestRerouted(_RequestEvent):
    """A decision: the request is routed again, once: the engine child it was routed to was gone before it took the
    request (`engine_gone`: its port refused or dropped the connection, and its process had exited or was exiting),
    or its prompt does not fit that child's context and nobody chose the context (`context_grown`: an instance with
    a context that holds it serves it), or it was served ahead of a swap whose hold ran out before it took a slot
    (`swap_recalled`: it waits behind the swap, blazar/events/swaps.py). The attempt's slot and hold were given back
    first; `request.routed` follows for the second attempt."""

    TYPE = "request.rerouted"

    model: str
    instance_id: str  # the instance it was routed to first
    reason: Literal["engine_gone", "context_grown", "swap_recalled"] = "engine_gone"
    detail: Text = ""  # what the connection said


@register
class RequestFirstToken(_RequestEvent):
    """The first generated byte went to the client: the time to first token."""

    TYPE = "request.first_token"

    model: str
    ttft_ms: float  # from received to the first byte of generated output sent to the client


@register
class RequestCompleted(_RequestEvent):
    """The answer was delivered: status, timings and token counts (for best-of-N and cascades, the sums over every
    candidate or step)."""

    TYPE = "request.completed"

    model: str
    instance_id: str | None = None
    status: int = 200
    duration_ms: float
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    # The engine's own timings (llama-server's `timings`: prompt_ms, predicted_ms, predicted_per_second, ...).
    engine_timings: Annotated[dict[str, float], entries(16, name_chars(32), 24)] = Field(default_factory=dict)
    finish_reason: str | None = None
    chunks: int | None = None  # streamed chunks forwarded
    # Single-flight: "follower" got another request's generation (its tokens were not generated again).
    shared: SharedRole | None = None
    # A forced tool call (tool_choice required or named, Anthropic any or tool): "made", or "cut" by max_tokens
    # before its JSON was whole (the answer then holds no call and no text).
    forced_call: Literal["made", "cut"] | None = None
    # A chat request whose thinking had a budget or an effort (asked, or its model's): see ReasoningFacts.
    reasoning: ReasoningFacts | None = None
    # What the request's span cost the machine in energy (None: recorded before energy was measured per request).
    energy: RequestEnergy | None = None


@register
class RequestFailed(_RequestEvent):
    """The request had started (admitted, maybe streaming) and did not complete."""

    TYPE = "request.failed"

    model: str | None = None
    instance_id: str | None = None
    status: int
    reason: FailReason
    detail: Text = ""
    duration_ms: float = 0.0
    # Tokens a stream had sent the client before it ended (each event relayed counts as one): charged to its key.
    completion_tokens: int | None = None


@register
class RequestPlaced(_RequestEvent):
    """A session's turn placed on a slot, and the state of the KV cache there: `warm` (the slot still holds the
    session's prefix), `restored` (loaded from the bank before the prompt, `restored_tokens` of it) or `cold` (a full
    prefill), with the reason in words."""

    TYPE = "request.placed"

    model: str
    instance_id: str
    slot_id: int
    session: str
    kv: Literal["warm", "restored", "cold"]
    reason: str
    restored_tokens: int | None = None
    restore_ms: float | None = None


@register
class RequestShared(_RequestEvent):
    """Single-flight: an identical deterministic request already in flight. `leader` runs the generation; a
    `follower` gets its answer replayed from the start; `promoted` is a follower that took over the generation when
    the leader's client went away."""

    TYPE = "request.shared"

    model: str
    role: SharedRole
    leader_trace_id: str  # the trace whose generation is shared
    flight: str  # a short hash of what made the requests identical
    joined_at_chunk: int = 0  # how much of the answer had been produced when a follower joined


CacheSource = Literal["exact", "semantic"]


@register
class RequestCacheHit(_RequestEvent):
    """The response cache answered the request: a stored answer of the same tenant replayed in the caller's dialect,
    no engine asked. `entry` is the stored answer's key (a hash, never the prompt), `age_s` how long ago it was
    stored; `similarity` is a semantic hit's (None for an exact one)."""

    TYPE = "request.cache_hit"

    model: str
    source: CacheSource
    entry: Annotated[str, Bound(66)]  # 64 hex digits, as JSON
    age_s: float
    similarity: float | None = None


@register
class RequestCacheMissed(_RequestEvent):
    """The semantic cache was asked and had no answer: the nearest stored prompt of the same tenant and context was
    `best_similarity` (None: none to compare) below `threshold`, or the prompt could not be embedded (`unavailable`:
    why, in short; `embed_trace_id` the internal embeddings request's trace, when one was made). The request ran."""

    TYPE = "request.cache_missed"

    model: str
    source: CacheSource
    threshold: float
    best_similarity: float | None = None
    unavailable: Annotated[str | None, Bound(130)] = None
    embed_trace_id: Annotated[str | None, Bound(130)] = None


@register
class RequestCandidateScored(_RequestEvent):
    """Best-of-N: one candidate's answer judged. Validity first (schema or forced tool arguments, and a stop
    rather than a cut-off), then the mean log-probability of its tokens."""

    TYPE = "request.candidate_scored"

    model: str
    index: int
    seed: int
    slot_id: int | None = None
    valid: bool
    invalid_reason: str | None = None
    finish_reason: str | None = None
    mean_logprob: float | None = None
    completion_tokens: int | None = None
    won: bool = False


@register
class RequestBestOfChosen(_RequestEvent):
    """Best-of-N: how many candidates were asked for and run (never more than the free slots), and which won."""

    TYPE = "request.best_of_chosen"

    model: str
    asked: int
    used: int
    winner: int
    reason: str


@register
class RequestCascadeJudged(_RequestEvent):
    """A cascade step: the answer of `model` accepted (valid and confident) or not, and why."""

    TYPE = "request.cascade_judged"

    model: str
    step: int
    accepted: bool
    reason: CascadeReason
    detail: Text = ""
    mean_logprob: float | None = None
    min_logprob: float | None = None  # the threshold (cascade_min_logprob)
    completion_tokens: int | None = None


# Where a chat prompt first differed from the one before it on the same session or slot (blazar/serving/prefix.py):
# a system message, the tool list (rendered before the messages), a message's role, or a message's content.
PrefixPart = Literal["system", "tools", "role", "message"]


@register
class RequestPrefixCompared(_RequestEvent):
    """A chat turn's prompt compared with the previous turn of its conversation (the same session, or without one the
    same engine slot and client program, of the same tenant): how much of it the engine's prefix cache reused, and,
    where that was little (`missed`), where the prompt first differed from the previous one and what prefilling it
    again cost. Hashes were compared, in memory; no prompt text and no hash is recorded, only indexes and counts."""

    TYPE = "request.prefix_compared"

    model: str
    instance_id: str
    slot_id: int | None = None
    session: str | None = None  # the session it was compared on (None: the slot)
    # The client's program, from its User-Agent's first product ("claude-cli", "OpenAI/Python"): whose prefix it is,
    # beside the key (the envelope's actor).
    agent: str | None = None
    previous_trace_id: str
    previous_prompt_tokens: int
    previous_messages: int
    messages: int
    prompt_tokens: int
    reused_tokens: int  # the engine's cached_tokens: the prompt's prefix it did not prefill again
    missed: bool  # reused less than half of the previous prompt, and enough tokens were prefilled again to matter
    # Where the prompt first differed from the previous one (None: it extended it unchanged). The message's index in
    # the engine's messages (after the dialect's translation: Anthropic's system is message 0); None for the tools.
    part: PrefixPart | None = None
    message_index: int | None = None
    reprocessed_tokens: int = 0  # prompt_tokens - reused_tokens
    prefill_ms: float | None = None  # the engine's prompt_ms (its timings) for this prompt

    @property
    def broke(self) -> bool:
        """The client changed its prompt before the end of the previous one, and the engine paid for it."""
        return self.missed and self.part is not None
