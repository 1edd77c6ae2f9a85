"""Best-of-N and cascades: one request, several whole answers, the best one sent.

    best_of   N candidates of one model at once, each with its own seed, on slots that are free now (never more:
              a busy system runs fewer, and says so in `x-blazar-best-of: asked=N used=M`); the winner is the valid one
              (blazar/dialects/judge.py) with the highest mean token log-probability. Usage is summed; each candidate
              is a `request.candidate_scored` event, the choice `request.best_of_chosen`.
    cascade   the models in turn, each answer accepted when valid and confident (mean log-probability at least
              `cascade_min_logprob`), else the next model is tried; the last one's answer is served whatever it is.
              Each step is a `request.cascade_judged` event; `x-blazar-cascade: tried=a,b served=b reason=...`.

Both run on non-streamed chat only (the request options refuse anything else) and ask the engine for logprobs; the
client gets them only when it asked for them. A model may be a remote engine's (`blazar remote add`): its
candidates take slots of the remote's own lane (its --max-concurrent), and an answer without logprobs (a server
that gives none) is judged on validity alone. Every slot a fan-out takes is given back however it ends.
"""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from blazar.adapters.engines.answers import usage_from_json
from blazar.cluster.remotes import resolved_remote
from blazar.dialects.judge import Judgement, judge, schema_of, winner
from blazar.errors import BlazarError, ModelNotFound, Refused
from blazar.events.requests import RequestBestOfChosen, RequestCandidateScored, RequestCascadeJudged
from blazar.instances.supervisor import ResolvedModel
from blazar.projections.remotes import serving
from blazar.serving.admission import Ticket
from blazar.serving.limits import Lease
from blazar.serving.model_defaults import apply_settings
from blazar.serving.plan import Answer, Plan
from blazar.serving.principal import scope_refusal

if TYPE_CHECKING:
    from blazar.serving.gateway import Gateway

SEED_SPAN = 1 << 30


@dataclass
class _Base:
    """The request as the client sent it, before any model's settings: each cascade step starts from it."""

    body: dict[str, Any] | None
    max_tokens: int | None
    ctx: int | None


def base_of(plan: Plan) -> _Base:
    return _Base(dict(plan.body) if plan.body is not None else None, plan.max_tokens, plan.ctx)


def _asking_logprobs(body: dict[str, Any]) -> dict[str, Any]:
    out = dict(body)
    out["logprobs"] = True
    out.setdefault("top_logprobs", 1)
    return out


def _for_client(plan: Plan, answer: dict[str, Any]) -> dict[str, Any]:
    """The answer as the client asked for it: without the logprobs Blazar asked for on its own."""
    if not plan.parsed.get("logprobs"):
        for choice in answer.get("choices") or []:
            if isinstance(choice, dict):
                choice.pop("logprobs", None)
    return answer


async def serve(gw: Gateway, plan: Plan, watcher: asyncio.Task[None] | None, base: _Base) -> Answer:
    try:
        if plan.cascade:
            _check_cascade(gw, plan)
            return await _cascade(gw, plan, base)
        return await _best_of(gw, plan)
    except asyncio.CancelledError:
        gw.fail(plan, status=499, reason="client_disconnected", detail="the client closed the connection")
        raise
    except BaseException as e:
        gw.drop_lease(plan)
        gw.fail(plan, status=500, reason="internal_error", detail=f"{type(e).__name__}: {e}")
        raise
    finally:
        if watcher is not None:
            watcher.cancel()


# -- best of N --------------------------------------------------------------------------------------------------------

async def _best_of(gw: Gateway, plan: Plan) -> Answer:
    asked = plan.best_of or 1
    await gw.admit(plan)
    inst = plan.instance
    assert inst is not None and plan.ticket is not None
    extra: list[Ticket] = []
    held = 0
    bodies = [_asking_logprobs(plan.engine_body())]
    isolate = gw.isolating()
    limits = plan.principal.limits() if plan.principal is not None else None
    leases: list[Lease] = []
    try:
        # NOTE: every extra slot and lease is given back in `finally`, whatever ends the fan-out (a hang-up while a
        # candidate's slot is placed, an instance gone meanwhile): a slot kept here would shrink its lane for good.
        for _ in range(asked - 1):
            if limits is not None:  # each candidate runs at once: each counts against the key's max_concurrent
                lease = gw.limits.extra(limits)
                if lease is None:
                    break  # the key is at its max_concurrent: fewer candidates, as with fewer free slots
                leases.append(lease)
            ticket = gw.admission.try_acquire(inst.lane, inst.slots, pick=None if inst.remote else gw.kv.slots.picker(
                inst.instance_id, None, plan.tenant, isolate=isolate))
            if ticket is None:
                break  # no free slot: fewer candidates, never a wait
            extra.append(ticket)
            body = dict(bodies[0])
            if not inst.remote:  # a child's slot: held against eviction, named to the engine as tenancy needs
                try:
                    gw.supervisor.hold(inst)
                except BlazarError:
                    gw.admission.give_back(extra.pop())
                    break  # the instance is gone: the candidates so far are all there will be
                held += 1
                placed = await gw.kv.place(inst, ticket.slot_id, None, tenant=plan.tenant)
                body.update(placed.engine_fields(ticket.slot_id, isolate=isolate))
            bodies.append(body)
        seed = bodies[0].get("seed")
        first = seed if isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0 \
            else secrets.randbelow(SEED_SPAN)
        seeds = [first + i for i in range(len(bodies))]
        for body, s in zip(bodies, seeds, strict=True):
            body["seed"] = s
        results = await asyncio.gather(*(_ask(gw, plan, b) for b in bodies))
    finally:
        for ticket in extra:
            gw.admission.release(ticket)
        for _ in range(held):
            gw.supervisor.unhold(inst)
        for lease in leases:
            gw.limits.release(lease)
    schema = schema_of(bodies[0])
    usage: dict[str, Any] = {}
    scored: list[tuple[int, Judgement, dict[str, Any]]] = []
    for i, (status, answer, _) in enumerate(results):
        if status == 200 and isinstance(answer, dict):
            _add_usage(usage, usage_from_json(answer))
            scored.append((i, judge(answer, schema), answer))
    if not scored:
        status, _, raw = results[0]
        return gw.engine_refusal(plan, status, raw)
    best, why = winner([j for _, j, _ in scored])
    slots: list[int | None] = ([None] * len(bodies) if inst.remote  # a remote's lane names no engine slot
                               else [plan.ticket.slot_id, *(t.slot_id for t in extra)])
    for k, (i, j, _) in enumerate(scored):
        gw.emit(RequestCandidateScored(trace_id=plan.trace_id, model=inst.model, index=i, seed=seeds[i],
                                       slot_id=slots[i], valid=j.valid, invalid_reason=j.reason,
                                       finish_reason=j.finish_reason, mean_logprob=j.mean_logprob,
                                       completion_tokens=j.completion_tokens, won=k == best),
                plan.trace_id, plan.actor)
    index = scored[best][0]
    gw.emit(RequestBestOfChosen(trace_id=plan.trace_id, model=inst.model, asked=asked, used=len(bodies),
                                winner=index, reason=why), plan.trace_id, plan.actor)
    answer = _for_client(plan, scored[best][2])
    answer["usage"] = {**(answer.get("usage") or {}), **_usage_body(usage)}
    gw.first_token(plan)
    gw.complete(plan, usage, status=200)
    return gw.whole_answer(plan, answer, status=200, headers={"x-blazar-best-of": f"asked={asked} used={len(bodies)}"})


async def _ask(gw: Gateway, plan: Plan, body: dict[str, Any]) -> tuple[int, Any, bytes]:
    """One whole answer for a candidate or a step; a remote's answer feeds its circuit as a plain request's does."""
    status, answer, raw = await gw.ask_whole(plan, body)
    if plan.remote is not None:
        if status >= 500:
            await gw.remotes.failed(plan.remote, f"answered {status}", source="request")
        else:
            await gw.remotes.succeeded(plan.remote)
    return status, answer, raw


def _add_usage(total: dict[str, Any], got: dict[str, Any]) -> None:
    """Sum what each answer used: what the request cost the engine (its last finish reason kept)."""
    for name in ("prompt_tokens", "completion_tokens", "cached_tokens"):
        if isinstance(got.get(name), int):
            total[name] = int(total.get(name) or 0) + got[name]
    if got.get("finish_reason"):
        total["finish_reason"] = got["finish_reason"]


def _usage_body(usage: dict[str, Any]) -> dict[str, Any]:
    p, c = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


# -- cascades ---------------------------------------------------------------------------------------------------------

async def _cascade(gw: Gateway, plan: Plan, base: _Base) -> Answer:
    threshold = gw.app.settings().cascade_min_logprob
    usage: dict[str, Any] = {}
    tried: list[str] = []
    escalated = "accepted"
    last_step = len(plan.cascade) - 1
    for step, name in enumerate(plan.cascade):
        if step > 0:
            _next_model(gw, plan, name, base)
        tried.append(name)
        plan.provisional = step < last_step  # a refusal of this step is the step's, not the request's end
        try:
            await gw.admit(plan)
        except Refused as e:
            if step == last_step:
                raise
            _judged(gw, plan, step, accepted=False, reason="refused", detail=e.message)
            escalated = "refused"
            continue
        finally:
            plan.provisional = False
        status, answer, raw = await _ask(gw, plan, _asking_logprobs(plan.engine_body()))
        j = judge(answer, schema_of(plan.engine_body())) if status == 200 else None
        gw.release_step(plan, tokens=j.completion_tokens if j else None)
        if j is None:
            if step == last_step:
                return gw.engine_refusal(plan, status, raw)
            _judged(gw, plan, step, accepted=False, reason="refused", detail=f"the engine answered {status}")
            escalated = "engine_error"
            continue
        assert isinstance(answer, dict)
        _add_usage(usage, usage_from_json(answer))
        confident = j.mean_logprob is None or j.mean_logprob >= threshold
        if j.valid and confident:
            _judged(gw, plan, step, accepted=True, reason="accepted", j=j, threshold=threshold)
            break
        why = "invalid" if not j.valid else "low_confidence"
        detail = j.reason or (f"mean logprob {j.mean_logprob:.3f} is under {threshold:g}"
                              if j.mean_logprob is not None else "")
        if step == last_step:
            _judged(gw, plan, step, accepted=True, reason="last", detail=f"served as the last model: {why}: {detail}",
                    j=j, threshold=threshold)
            break
        _judged(gw, plan, step, accepted=False, reason=why, detail=detail, j=j, threshold=threshold)
        escalated = why
    assert isinstance(answer, dict)
    answer = _for_client(plan, answer)
    gw.first_token(plan)
    gw.complete(plan, usage, status=200)
    header = f"tried={','.join(tried)} served={plan.model} reason={escalated}"
    return gw.whole_answer(plan, answer, status=200, headers={"x-blazar-cascade": header})


def _check_cascade(gw: Gateway, plan: Plan) -> None:
    """Every model of the cascade exists and is in the key's scope, before any of them runs (the first was checked
    with the request)."""
    for name in plan.cascade[1:]:
        _resolve_in_scope(gw, plan, name)


def _resolve_in_scope(gw: Gateway, plan: Plan, name: str) -> tuple[ResolvedModel, str | None]:
    """The cascade model `name`: the store's, else a remote engine's (its name second), in the key's scope."""
    remote = None
    try:
        resolved = gw.supervisor.resolve(name)
    except ModelNotFound as e:
        served = serving(gw.app.runner.state("remotes"), name)
        if served is None:
            raise gw.reject(plan, status=404, reason="model_not_found", detail=f"cascade: {e.message}") from None
        resolved, remote = resolved_remote(name), served.name
    p = plan.principal
    if p is not None and p.key is not None and not p.allows(name, resolved.name):
        raise gw.reject(plan, status=403, reason="model_not_allowed", detail=scope_refusal(p, name, resolved.name),
                        error_type="permission_error")
    return resolved, remote


def _next_model(gw: Gateway, plan: Plan, name: str, base: _Base) -> None:
    """Point the request at the cascade's next model: resolved (the store's or a remote's), in the key's scope, with
    its own settings applied to the client's request as it came."""
    plan.model = name
    plan.body, plan.max_tokens, plan.ctx = (dict(base.body) if base.body is not None else None), base.max_tokens, \
        base.ctx
    plan.instance, plan.peer = None, None  # the previous step's way there is not this one's
    plan.resolved, plan.remote = _resolve_in_scope(gw, plan, name)
    if plan.resolved.settings is not None:
        apply_settings(plan, plan.resolved.settings)
    plan.dirty = True


def _judged(gw: Gateway, plan: Plan, step: int, *, accepted: bool, reason: str, detail: str = "",
            j: Judgement | None = None, threshold: float | None = None) -> None:
    gw.emit(RequestCascadeJudged(trace_id=plan.trace_id, model=plan.name or plan.model, step=step, accepted=accepted,
                                 reason=reason, detail=detail[:500],  # type: ignore[arg-type]
                                 mean_logprob=j.mean_logprob if j else None, min_logprob=threshold,
                                 completion_tokens=j.completion_tokens if j else None), plan.trace_id, plan.actor)
