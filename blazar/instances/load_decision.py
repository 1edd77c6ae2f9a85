"""Where a new instance goes, decided without touching anything. `decide_load` takes what a load asks for and
what the supervisor observed (the devices, the instances running, the idle RPC workers once probed) and answers one
of: start it with this plan (`Start`: as planned, spread over workers, or at a fallback shape), evict these first
and decide again (`Evict`), refuse with the plan's levers and what workers would have to offer (`Refuse`), or probe
the workers and decide again (`ProbeWorkers`: probing costs a connection per worker, so only when the answer turns
on them). `decide_give_way` says whether a running instance of the same model gives way to a new shape, and
`carried_shape` what the new one takes over from those that gave way (so that a client alternating two shapes, chat
at a large context and embeddings, say, reloads the model once, not at every turn).

The RoomMaker (instances/room.py) observes, carries each answer out and records it. No I/O, no clock: the same
situation always gets the same answer, so the tests are tables (tests/unit/instances/test_load_decision.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from blazar.errors import BlazarError, DoesNotFit, ModelPinned
from blazar.events.models import ModelMetadata
from blazar.events.projectors import ProjectorMetadata
from blazar.events.tuning import Posture
from blazar.fit import Device, FitPlan, FitRequest, budget_bytes
from blazar.fit.devices import host_of
from blazar.fit.fixed import fixed_plan
from blazar.fit.planner import MIN_AUTO_CTX
from blazar.fit.posture import with_posture
from blazar.fit.refusal import Lever
from blazar.instances.budget import (
    Resident,
    budget_devices,
    shortfall_bytes,
    try_plan,
    worker_bytes_needed,
    worker_devices,
)
from blazar.instances.decide import Candidate, Victims, decide_victims
from blazar.projections.calibration import CalibrationState, correction_for

MiB = 1 << 20


@dataclass(frozen=True)
class Running:
    """A live instance as the load decider sees it: its state (starting | ready | exiting | stopping) and, as
    the eviction decider sees it, what evicting it frees and costs."""

    state: str
    candidate: Candidate


@dataclass(frozen=True)
class Situation:
    """Everything decide_load reads: the load asked for, the settings that shape it, what was observed."""

    model: str
    meta: ModelMetadata
    ctx: int | None  # the caller's context per slot; None: the default shape (settings.ctx, else the planner's)
    swa_full: bool  # a sliding-window model's full window cache (a session's instance)
    default_ctx: int  # settings.ctx: 0 lets the planner choose
    default_slots: int  # settings.slots: 0 lets the planner choose
    max_loaded_models: int  # 0: no limit
    memory_limit_bytes: int  # 0: no limit
    devices: tuple[Device, ...]  # as probed: the budget takes what the running instances are charged off the host
    running: tuple[Running, ...]
    calibration: CalibrationState  # the calibration projection: the measured correction for each plan's shape
    rpc_capable: bool  # the engine can put layers on RPC workers (built with the RPC backend)
    workers: tuple[tuple[str, int], ...] | None = None  # idle workers (address, bytes offered); None: not probed
    room_made: bool = False  # an Evict's victims are gone: plan again, spill if need be, never evict again
    projector: ProjectorMetadata | None = None  # the model's --mmproj, priced with it
    lora_bytes: int = 0  # its LoRA adapters' tensors (--lora), priced with its layers
    # A model that is no GGUF (a whisper or piper model): what its kind's memory model charges, on the host alone
    # (no context, slots, offload or workers to choose). None: the GGUF planner.
    fixed_bytes: int | None = None
    kind: str = "llama-server"
    posture: Posture | None = None  # the adopted profile's (instances/posture_choice.py): what it pins, the fit keeps
    # False: a load that may not evict (a preload, instances/preload.py): where room needs victims, it is refused
    may_evict: bool = True
    # The caller waits for busy victims (a request's load, in the swap order: serving/swaps.py): where evicting
    # instances that are busy now would make room, the answer is `Busy` rather than a refusal.
    may_wait: bool = False


@dataclass(frozen=True)
class Start:
    """Start the instance with `fit`: `via` says how it was found (as planned here, layers spilled to workers, or the
    largest context that fits beside what could not be evicted)."""

    fit: FitPlan
    host_free_bytes: int  # the host's free memory the plan was made against (instance.starting's observation)
    via: Literal["here", "workers", "fallback"]
    posture: Posture | None = None  # the posture the plan keeps (None: the defaults, or the posture did not fit)


@dataclass(frozen=True)
class Evict:
    """Evict `victims` for `reason`, then observe again and decide with `room_made`."""

    victims: Victims
    reason: Literal["memory", "max_loaded_models"]
    observations: dict[str, Any]  # what instance.evicted records: the needs, the scores and the why


@dataclass(frozen=True)
class Refuse:
    """Refuse the load (instance.load_refused with `reason`, `detail` and `observations`), raising `error`."""

    reason: Literal["does_not_fit", "no_room"]
    detail: str
    observations: dict[str, Any]
    error: type[BlazarError] = DoesNotFit
    fit: FitPlan | None = None  # the plan that does not fit: its refusal holds the levers that would make it fit
    worker_bytes: int | None = None  # what idle RPC workers would have to offer in all; None: they cannot help

    @property
    def levers(self) -> list[Lever]:
        return [] if self.fit is None or self.fit.refusal is None else list(self.fit.refusal.levers)


@dataclass(frozen=True)
class ProbeWorkers:
    """The answer turns on the idle RPC workers: probe them, then decide again with `workers` set."""


@dataclass(frozen=True)
class Busy:
    """Room is to be had only by evicting instances that are busy now (`victims`, by instance id, with their
    `models`): the caller waits for them to drain and decides again (only asked for with `Situation.may_wait`)."""

    victims: tuple[str, ...]
    models: tuple[str, ...]
    reason: Literal["memory", "max_loaded_models"]


LoadDecision = Start | Evict | Refuse | ProbeWorkers | Busy


def decide_load(s: Situation) -> LoadDecision:
    """Where the new instance goes, at the situation's posture. A posture that fits only at the fallback shape, or
    not at all, gives way to the defaults when they fit at the shape asked for (or at all): a tuned posture is a
    preference, never a reason to cramp or refuse a load. `Start.posture` says whether the plan keeps it."""
    decision = _decide(s)
    if s.posture is None or s.posture.is_default():
        return decision
    tuned = replace(decision, posture=s.posture) if isinstance(decision, Start) else decision
    cramped = isinstance(decision, Start) and decision.via == "fallback"
    if not (cramped or (isinstance(decision, Refuse) and decision.fit is not None)):
        return tuned
    plain = _decide(replace(s, posture=None))
    if isinstance(plain, Start) and plain.via != "fallback":
        return plain
    return plain if isinstance(decision, Refuse) and not isinstance(plain, Refuse) else tuned


def _decide(s: Situation) -> LoadDecision:
    """Where the new instance goes.

    First the plan at the budget the running instances leave (with the calibration correction for its shape). At
    the default context, a plan that fits only with a context below MIN_AUTO_CTX (or the model's training context)
    takes idle workers' room for a larger one. When it does not fit, or max_loaded_models is reached, the cheapest
    victims to lose go (decide_victims: never a busy or pinned one), then it is planned again (`room_made`): as it
    is, else spread over workers, else refused. When no allowed set of victims is enough: workers, else (at the
    default context only) the largest context that fits in what is free, else a refusal with the levers.
    """
    explicit_ctx = s.ctx is not None
    request = with_posture(FitRequest(ctx=s.ctx or s.default_ctx or None, slots=s.default_slots or None,
                                      swa_full=s.swa_full, projector=s.projector, lora_bytes=s.lora_bytes), s.posture)
    budget = budget_devices(list(s.devices), [Resident(r.candidate.instance_id, r.candidate.bytes) for r in s.running],
                            memory_limit_bytes=s.memory_limit_bytes)
    free = host_free(budget)
    fit = _plan(s, budget, request)
    if s.room_made:
        return _after_eviction(s, budget, request, fit)
    via: Literal["here", "workers"] = "here"
    cramped = s.fixed_bytes is None and fit.ctx_per_slot < min(MIN_AUTO_CTX, s.meta.ctx_train or MIN_AUTO_CTX)
    if fit.fits and not explicit_ctx and cramped:
        # It fits here only with a cramped context: idle workers may give it the context it would get anywhere.
        spread = _on_workers(s, budget, request)
        if isinstance(spread, ProbeWorkers):
            return spread
        if spread is not None and spread.ctx_per_slot > fit.ctx_per_slot:
            fit, via = spread, "workers"
    counted = sum(1 for r in s.running if r.state not in ("stopping", "exiting"))
    need_count = max(0, counted - s.max_loaded_models + 1) if s.max_loaded_models else 0
    need_bytes = 0 if fit.fits else _shortfall(s, budget, request, fit)
    if not (need_count or need_bytes):
        return Start(fit, free, via)
    cands = [r.candidate for r in s.running if r.state == "ready"]  # a loading one is busy; a stopping one going
    victims = decide_victims(cands, need_bytes=need_bytes, free_bytes=0, need_count=need_count)
    if victims is not None and not s.may_evict:
        # NOTE: a preload never evicts: the models loaded before it (preloaded or asked for) keep their place.
        gone = [v.instance_id for v in victims.victims]
        named = ", ".join(f"{v.model} ({v.instance_id})" for v in victims.victims)
        why = f"{need_bytes / MiB:.0f} MiB short" if need_bytes else f"max_loaded_models {s.max_loaded_models}"
        return Refuse("does_not_fit" if need_bytes else "no_room",
                      f"it would evict {named} ({why}), and a preload never evicts", {
                          "need_bytes": need_bytes, "need_count": need_count, "host_free_bytes": free,
                          "loaded": len(s.running), "max_loaded_models": s.max_loaded_models, "would_evict": gone,
                          "may_evict": False})
    if victims is not None:
        return Evict(victims, "memory" if need_bytes else "max_loaded_models", {
            "need_bytes": need_bytes, "need_count": need_count, "host_free_bytes": free, "loaded": len(s.running),
            "max_loaded_models": s.max_loaded_models, "scores": victims.scores, "why": victims.why})
    if need_count == 0:
        spread = _on_workers(s, budget, request)
        if isinstance(spread, ProbeWorkers):
            return spread
        if spread is not None:
            return Start(spread, free, "workers")
        if not fit.fits and not explicit_ctx and s.fixed_bytes is None:
            # Nothing can go for the default shape: take the largest context that fits in what is free.
            fallback = _plan(s, budget, with_posture(
                FitRequest(ctx=None, slots=None, swa_full=s.swa_full, projector=s.projector, lora_bytes=s.lora_bytes),
                s.posture))
            if fallback.fits:
                return Start(fallback, free, "fallback")
    if s.may_wait and (busy := _once_drained(s.running, need_bytes, need_count)) is not None:
        return busy
    obs = {"need_bytes": need_bytes, "need_count": need_count, "loaded": len(s.running),
           "max_loaded_models": s.max_loaded_models, "host_free_bytes": free,
           "busy_or_pinned": [c.instance_id for c in cands if c.in_flight or c.pinned]}
    reason: Literal["does_not_fit", "no_room"] = "does_not_fit" if need_bytes else "no_room"
    if fit.fits:
        return Refuse(reason, f"{len(s.running)} instances loaded (max_loaded_models {s.max_loaded_models}) and "
                      "none can be evicted: every one is busy or pinned", obs)
    return _refuse_unfit(s, budget, request, fit, reason, obs)


def _once_drained(running: tuple[Running, ...], need_bytes: int, need_count: int) -> Busy | None:
    """The victims that would make room once the busy instances among them drained (a loading one is busy: its
    requests wait for it; a pinned one never goes)."""
    busy_ids = {r.candidate.instance_id for r in running if r.candidate.in_flight or r.state == "starting"}
    drained = [replace(r.candidate, in_flight=0) for r in running if r.state in ("ready", "starting")]
    victims = decide_victims(drained, need_bytes=need_bytes, free_bytes=0, need_count=need_count)
    if victims is None or not victims.victims:
        return None
    busy = [v for v in victims.victims if v.instance_id in busy_ids]
    if not busy:
        return None
    return Busy(tuple(v.instance_id for v in busy), tuple(sorted({v.model for v in busy})),
                "memory" if need_bytes else "max_loaded_models")


def _after_eviction(s: Situation, budget: list[Device], request: FitRequest, fit: FitPlan) -> LoadDecision:
    """The victims are gone: the plan as it is now, else spread over workers, else refused."""
    free = host_free(budget)
    if fit.fits:
        return Start(fit, free, "here")
    spread = _on_workers(s, budget, request)
    if isinstance(spread, ProbeWorkers):
        return spread
    if spread is not None:
        return Start(spread, free, "workers")
    return _refuse_unfit(s, budget, request, fit, "does_not_fit", {"host_free_bytes": free})


def _refuse_unfit(s: Situation, budget: list[Device], request: FitRequest, fit: FitPlan,
                  reason: Literal["does_not_fit", "no_room"], obs: dict[str, Any]) -> Refuse:
    """A refusal of a plan that does not fit: its summary (with the levers) and what workers would have to offer."""
    need = None if s.fixed_bytes is not None else worker_bytes_needed(s.meta, budget, request)
    return Refuse(reason, fit.summary + workers_lever(need, s.rpc_capable), obs, fit=fit, worker_bytes=need)


def _on_workers(s: Situation, budget: list[Device], request: FitRequest) -> FitPlan | ProbeWorkers | None:
    """A plan that puts the layers the host cannot hold on the idle RPC workers, the fewest layers away, when the
    engine can use workers and one fits (a model that is no GGUF runs on the host alone)."""
    if not s.rpc_capable or s.fixed_bytes is not None:
        return None
    if s.workers is None:
        return ProbeWorkers()
    if not s.workers:
        return None
    fit = _plan(s, [*budget, *worker_devices(s.workers)], request.model_copy(update={"offload": "fewest"}))
    return fit if fit.fits else None


def _shortfall(s: Situation, budget: list[Device], request: FitRequest, fit: FitPlan) -> int:
    """Bytes to free before the plan fits: the GGUF planner's answer, or what a fixed charge lacks on the host."""
    if s.fixed_bytes is not None:
        return max(0, s.fixed_bytes - budget_bytes(host_of(budget)))
    return shortfall_bytes(s.meta, budget, request.model_copy(update={"correction": fit.correction_bytes}))


def _plan(s: Situation, budget: list[Device], request: FitRequest) -> FitPlan:
    """The plan, again with the correction calibration measured for its shape when there is one; a model that is no
    GGUF gets its kind's fixed charge (fit/fixed.py)."""
    if s.fixed_bytes is not None:
        return fixed_plan(s.model, s.kind, s.fixed_bytes, budget)
    first = try_plan(s.meta, budget, request)
    correction = correction_for(s.calibration, s.model, first.ctx_per_slot, first.slots, first.cache_type_k,
                                first.cache_type_v)
    if correction == 0:
        return first
    return try_plan(s.meta, budget, request.model_copy(update={"correction": correction}))


def workers_lever(need_bytes: int | None, rpc_capable: bool) -> str:
    """The RPC-worker lever for a refusal: how much idle workers would have to offer, and how to get them."""
    if need_bytes is None:
        return ""
    how = ("`blazar worker --mem MiB` on hosts with room" if rpc_capable
           else "an engine built with `blazar engine build --target rpc-server`, then `blazar worker --mem MiB` "
                "on hosts with room")
    return f" Or spread it across RPC workers: idle workers offering {need_bytes / MiB:.0f} MiB in all ({how})."


def host_free(budget: list[Device]) -> int:
    return next((d.free_bytes for d in budget if d.kind == "host"), 0)


# -- a new shape of a running model ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Shape:
    """A ready instance of the model being loaded, as decide_give_way sees it."""

    instance_id: str
    ctx_tokens: int
    template: str
    pinned: bool
    in_flight: int
    embeddings: bool = False  # it serves embeddings too
    rerank: bool = False  # it is in rerank mode (serves rerank requests only)


@dataclass(frozen=True)
class GiveWay:
    """Evict it (reason `reshape`), recording `observations`."""

    observations: dict[str, Any]


def decide_give_way(model: str, shape: Shape, *, ctx: int | None, embeddings: bool,
                    template: str, rerank: bool = False) -> GiveWay | Refuse | None:
    """Whether a ready instance of `model` that does not serve the new load gives way to it. One in the other mode
    (rerank, or not) stays: it serves requests this load would not, and memory decides whether it goes. One started
    with the model's old template gives way once idle, pinned or not (the user changed the model); otherwise a pinned
    one refuses the load, an idle one gives way, and a busy one stays (None)."""
    if shape.rerank != rerank:
        return None
    if shape.template != template:
        if shape.in_flight == 0:
            return GiveWay({"template_wanted": template, "template_had": shape.template})
        return None
    if shape.pinned:
        had = shape.ctx_tokens
        want = (f"{ctx} were asked for" if ctx is not None and ctx > had
                else "this request needs the embeddings endpoint it was started without")
        return Refuse("no_room", f"{model} is pinned at {had} tokens per slot and {want}; unpin it "
                      f"(blazar load {model} --unpin) or stop it first",
                      {"ctx_wanted": ctx, "ctx_had": had, "embeddings_wanted": embeddings,
                       "pinned": shape.instance_id}, error=ModelPinned)
    if shape.in_flight == 0:
        return GiveWay({"ctx_wanted": ctx, "ctx_had": shape.ctx_tokens, "embeddings_wanted": embeddings})
    return None


def carried_shape(ctx: int | None, embeddings: bool, gone: list[Shape]) -> tuple[int | None, bool]:
    """The shape a new instance is started at: what its request needs, widened to serve whatever the instances
    that gave way to it served (their context, their embeddings endpoint). Without this, a client that alternates
    chat at a large context with embeddings at the default one would reload the model at every turn; with it the
    first reload serves both. A rerank instance carries nothing: it serves one kind of request."""
    for s in gone:
        if s.rerank:
            continue
        if s.ctx_tokens > (ctx or 0):
            ctx = s.ctx_tokens
        embeddings = embeddings or s.embeddings
    return ctx, embeddings
