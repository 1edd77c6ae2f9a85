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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from blazar.adapters.engines.answers import usage_from_json
from blazar.dialects.judge import Judgement, judge, schema_of, winner
from blazar.errors import Refused
from blazar.events.requests import CascadeReason, RequestBestOfChosen, RequestCandidateScored, RequestCascadeJudged
from blazar.serving.call import Call, Completed
from blazar.serving.request import Answer
from blazar.serving.route import Route

SEED_SPAN = 1 << 30


@dataclass
class Candidate:
    """One more slot of the call's instance for a best-of candidate: what the engine is told to use it (the slot's
    placement), and how it is given back (its slot, its hold, the key's extra lease)."""

    slot_id: int | None
    engine_fields: dict[str, Any] = field(default_factory=dict)
    release: Callable[[], None] = lambda: None


class Scope(Protocol):
    """A cascade's model resolved in the key's scope (blazar/serving/resolve.py's Resolver)."""

    def in_scope(self, call: Call, name: str) -> Route: ...


class Steps(Protocol):
    """A step routed and admitted (blazar/serving/routing.py's Router)."""

    async def route(self, call: Call) -> None: ...


class Extras(Protocol):
    """More slots of a step's instance, never waited for (blazar/serving/admit.py's Admitter)."""

    async def extra_candidate(self, call: Call) -> Candidate | None: ...


class Pipeline(Protocol):
    """What a fan-out needs of the gateway: one whole answer from the engine, and the answer in the client's shape."""

    async def ask(self, call: Call, body: dict[str, Any]) -> tuple[int, Any, bytes]: ...
    def whole_answer(self, call: Call, answer: Any, *, status: int, headers: dict[str, str]) -> Answer: ...
    def engine_refusal(self, call: Call, status: int, data: bytes) -> Answer: ...
    def cascade_min_logprob(self) -> float: ...


def _asking_logprobs(body: dict[str, Any]) -> dict[str, Any]:
    out = dict(body)
    out["logprobs"] = True
    out.setdefault("top_logprobs", 1)
    return out


def _for_client(call: Call, answer: dict[str, Any]) -> dict[str, Any]:
    """The answer as the client asked for it: without the logprobs Blazar asked for on its own."""
    if not call.request.parsed.get("logprobs"):
        for choice in answer.get("choices") or []:
            if isinstance(choice, dict):
                choice.pop("logprobs", None)
    return answer


async def serve(pipe: Pipeline, call: Call, watcher: asyncio.Task[None] | None, *, scope: Scope, steps: Steps,
                extras: Extras) -> Answer:
    """A best-of or a cascade request's answer. What raises ends the call in the gateway (`Gateway.serve`)."""
    try:
        if call.request.cascade:
            for name in call.request.cascade[1:]:  # every model exists and is in the key's scope before any runs
                scope.in_scope(call, name)
            return await _cascade(pipe, call, scope, steps)
        return await _best_of(pipe, call, steps, extras)
    finally:
        if watcher is not None:
            watcher.cancel()


# -- best of N --------------------------------------------------------------------------------------------------------

async def _best_of(pipe: Pipeline, call: Call, steps: Steps, extras: Extras) -> Answer:
    asked = call.request.best_of or 1
    await steps.route(call)
    inst, ticket = call.instance, call.ticket
    assert inst is not None and ticket is not None
    bodies = [_asking_logprobs(call.ask.engine_body())]
    extra: list[Candidate] = []
    try:
        # NOTE: every extra slot and lease is given back in `finally`, whatever ends the fan-out (a hang-up while a
        # candidate's slot is placed, an instance gone meanwhile): a slot kept here would shrink its lane for good.
        for _ in range(asked - 1):
            candidate = await extras.extra_candidate(call)
            if candidate is None:
                break  # no free slot, the key at its max_concurrent, the instance gone: fewer candidates, never a wait
            extra.append(candidate)
            bodies.append({**bodies[0], **candidate.engine_fields})
        seed = bodies[0].get("seed")
        first = seed if isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0 \
            else secrets.randbelow(SEED_SPAN)
        seeds = [first + i for i in range(len(bodies))]
        for body, s in zip(bodies, seeds, strict=True):
            body["seed"] = s
        results = await asyncio.gather(*(pipe.ask(call, b) for b in bodies))
    finally:
        for candidate in extra:
            candidate.release()
    schema = schema_of(bodies[0])
    usage: dict[str, Any] = {}
    scored: list[tuple[int, Judgement, dict[str, Any]]] = []
    for i, (status, answer, _) in enumerate(results):
        if status == 200 and isinstance(answer, dict):
            _add_usage(usage, usage_from_json(answer))
            scored.append((i, judge(answer, schema), answer))
    if not scored:
        status, _, raw = results[0]
        return pipe.engine_refusal(call, status, raw)
    best, why = winner([j for _, j, _ in scored])
    slots: list[int | None] = ([None] * len(bodies) if inst.remote  # a remote's lane names no engine slot
                               else [ticket.slot_id, *(c.slot_id for c in extra)])
    for k, (i, j, _) in enumerate(scored):
        call.emit(RequestCandidateScored(trace_id=call.trace_id, model=inst.model, index=i, seed=seeds[i],
                                         slot_id=slots[i], valid=j.valid, invalid_reason=j.reason,
                                         finish_reason=j.finish_reason, mean_logprob=j.mean_logprob,
                                         completion_tokens=j.completion_tokens, won=k == best))
    index = scored[best][0]
    call.emit(RequestBestOfChosen(trace_id=call.trace_id, model=inst.model, asked=asked, used=len(bodies),
                                  winner=index, reason=why))
    answer = _for_client(call, scored[best][2])
    answer["usage"] = {**(answer.get("usage") or {}), **_usage_body(usage)}
    call.first_token()
    call.finish(Completed(200, usage))
    return pipe.whole_answer(call, answer, status=200,
                             headers={"x-blazar-best-of": f"asked={asked} used={len(bodies)}"})


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

async def _cascade(pipe: Pipeline, call: Call, scope: Scope, steps: Steps) -> Answer:
    threshold = pipe.cascade_min_logprob()
    usage: dict[str, Any] = {}
    tried: list[str] = []
    escalated = "accepted"
    cascade = call.request.cascade
    last_step = len(cascade) - 1
    for step, name in enumerate(cascade):
        if step > 0:
            call.retarget(scope.in_scope(call, name))
        tried.append(name)
        try:
            await steps.route(call)
        except Refused as e:
            if step == last_step:
                raise  # the request's refusal
            call.give_back_slot()  # a refusal of this step is the step's end, not the request's
            _judged(call, step, accepted=False, reason="refused", detail=e.message)
            escalated = "refused"
            continue
        status, answer, raw = await pipe.ask(call, _asking_logprobs(call.ask.engine_body()))
        j = judge(answer, schema_of(call.ask.engine_body())) if status == 200 else None
        call.give_back_slot(tokens=j.completion_tokens if j else None)
        if j is None:
            if step == last_step:
                return pipe.engine_refusal(call, status, raw)
            _judged(call, step, accepted=False, reason="refused", detail=f"the engine answered {status}")
            escalated = "engine_error"
            continue
        assert isinstance(answer, dict)
        _add_usage(usage, usage_from_json(answer))
        confident = j.mean_logprob is None or j.mean_logprob >= threshold
        if j.valid and confident:
            _judged(call, step, accepted=True, reason="accepted", j=j, threshold=threshold)
            break
        why: CascadeReason = "invalid" if not j.valid else "low_confidence"
        detail = j.reason or (f"mean logprob {j.mean_logprob:.3f} is under {threshold:g}"
                              if j.mean_logprob is not None else "")
        if step == last_step:
            _judged(call, step, accepted=True, reason="last", detail=f"served as the last model: {why}: {detail}",
                    j=j, threshold=threshold)
            break
        _judged(call, step, accepted=False, reason=why, detail=detail, j=j, threshold=threshold)
        escalated = why
    assert isinstance(answer, dict)
    answer = _for_client(call, answer)
    call.first_token()
    call.finish(Completed(200, usage))
    header = f"tried={','.join(tried)} served={call.model} reason={escalated}"
    return pipe.whole_answer(call, answer, status=200, headers={"x-blazar-cascade": header})


def _judged(call: Call, step: int, *, accepted: bool, reason: CascadeReason, detail: str = "",
            j: Judgement | None = None, threshold: float | None = None) -> None:
    call.emit(RequestCascadeJudged(trace_id=call.trace_id, model=call.name or call.model, step=step,
                                   accepted=accepted, reason=reason, detail=detail[:500],
                                   mean_logprob=j.mean_logprob if j else None, min_logprob=threshold,
                                   completion_tokens=j.completion_tokens if j else None))
