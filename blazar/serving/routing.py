"""Where a call's step runs: an instance got ready for its route (loading on demand; a remote engine's stand-in; or
forwarding to a node where the model is ready, blazar/serving/forwarding.py), the context checked, and then a slot
(blazar/serving/admit.py). The call's route gains its instance (`Route.to`); each decision is recorded as the call's
event; a refusal is raised (`Refused`) for `Gateway.serve` to end the call with.

An instance found gone by the time the request took its slot (or before it took the request) is routed again, once
(`reroute`): its slot and hold given back, what its placement told the engine forgotten. So is a prompt that does
not fit the context nobody chose (`context_grown`): on an instance with a context that holds it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any, Literal

import orjson

from blazar.adapters.engines.client import EngineClient
from blazar.cluster.remotes import remote_instance
from blazar.context import Blazar
from blazar.errors import BlazarError, EngineError, EngineGone, Refused, SwapRecalled
from blazar.events.requests import RequestBounded, RequestRerouted, RequestRouted
from blazar.instances.live import Instance, LoadReport
from blazar.projections.remotes import remote
from blazar.serving.admit import Admitter
from blazar.serving.call import Call
from blazar.serving.context_fit import bound_body, decide_max_tokens, grown_ctx
from blazar.serving.forwarding import Forwarder
from blazar.serving.model_defaults import template_patch
from blazar.serving.patch import Patch
from blazar.serving.ports import SupervisorPort
from blazar.serving.reasoning import reasoning_patch
from blazar.serving.route import Route
from blazar.serving.spec_governor import N_MAX_FIELD
from blazar.serving.swaps import SwapOrder

log = logging.getLogger("blazar.gateway")

# The prompt's upper bound in tokens is its UTF-8 size (a token is at least one byte) plus the chat template's
# own tokens; under this margin of the context no exact count is needed.
TEMPLATE_TOKENS_PER_MESSAGE = 16
TEMPLATE_TOKENS_BASE = 64
# What a placement tells an engine, forgotten when the request is routed again: the next placement says its own.
PLACEMENT_FIELDS = ("id_slot", "cache_prompt", N_MAX_FIELD)


class Router:
    def __init__(self, app: Blazar, supervisor: SupervisorPort, client: EngineClient, forwarder: Forwarder,
                 admitter: Admitter, swaps: SwapOrder) -> None:
        self.app = app
        self.supervisor = supervisor
        self.client = client
        self.forwarder = forwarder
        self.admitter = admitter
        self.swaps = swaps  # the swap-aware order a load that needs busy models' room waits in

    async def route(self, call: Call) -> None:
        """`route_and_admit`, routed again once when the instance was gone by the time the request got its slot."""
        try:
            await self.route_and_admit(call)
        except EngineGone as gone:
            self.reroute(call, gone.message)
            await self.route_and_admit(call)

    async def route_and_admit(self, call: Call) -> None:
        """Get a ready instance (loading on demand; a remote engine's stand-in), check the context, take a slot and
        place the request on it."""
        report = LoadReport()
        route, recall = await self._routed(call, report)
        call.take_route(route)
        inst = call.instance
        assert inst is not None
        call.ask.apply(template_patch(call.request, call.ask.engine_body(), inst.stops, inst.sampling,
                                      loop_guard=inst.loop_guard))
        call.ask.apply(reasoning_patch(call.request, call.ask.engine_body(), call.route.resolved.settings,
                                       honoured=inst.per_request_budget, load_budget=inst.load_budget))
        call.emit(RequestRouted(trace_id=call.trace_id, model=inst.model, instance_id=inst.instance_id,
                                port=inst.port, cold=report.cold, load_ms=report.load_ms, evicted=report.evicted,
                                ctx_tokens=None if inst.remote else inst.ctx_tokens))
        audio = call.request.audio is not None  # a whisper or piper child: no context
        grown = None if inst.remote or audio else await check_context(self.app, self.client, call, inst)
        if grown is not None:
            ctx, prompt_tokens = grown
            self.reroute(call, f"its prompt of {prompt_tokens} tokens does not fit the context of {inst.ctx_tokens} "
                               f"tokens per request: served by an instance with a context of {ctx}", "context_grown")
            call.ask.apply(Patch(ctx=ctx))  # nobody chose the context (check_context asks): this one holds it
            await self.route_and_admit(call)
            return
        try:
            await self.admitter.seat(call, inst, report, recall)
        except SwapRecalled as recalled:  # served ahead of a swap whose hold ran out first: behind it now
            self.reroute(call, recalled.message, "swap_recalled")
            await self.route_and_admit(call)

    async def _routed(self, call: Call, report: LoadReport) -> tuple[Route, asyncio.Event | None]:
        """The call's route on its instance: a remote engine's stand-in, another node's (where the model is all
        there is, or ready while this node would have to load it), or a child of ours, loading on demand (`report`
        says what that took) in the swap-aware order (with the recall of a request served ahead of a swap)."""
        route = call.route
        if route.remote is not None:
            return route.to(self._remote(call, route.remote)), None
        if route.peer is not None:  # not in this node's store, ready on another
            return route.to(self.forwarder.instance(call, route.peer, "not_stored_here", {})), None
        if self.forwarder.may_forward(call) and not self.supervisor.instances(route.name) \
                and (peer := self.forwarder.peer_for(call, route.name, call.ask.ctx)) is not None \
                and (seen := self.forwarder.cheaper(peer)) is not None:
            return route.forwarded(peer).to(self.forwarder.instance(call, peer, "ready_there", seen)), None

        def ensure() -> Awaitable[Instance]:
            return self.supervisor.ensure(route.resolved, ctx=call.ask.ctx, keep_alive=call.request.keep_alive,
                                          embeddings=call.request.embeddings, report=report,
                                          session=call.request.session is not None, rerank=call.request.rerank,
                                          may_wait=True)

        try:
            inst, recall = await self.swaps.instance(call, route.name, ensure)
        except Refused:
            raise
        except BlazarError as e:
            raise Refused(e.message, reason=e.code, http_status=e.http_status, public=e.public) from None
        return route.to(inst, report.load_ms if report.cold else None), recall

    def reroute(self, call: Call, detail: str,
                reason: Literal["engine_gone", "context_grown", "swap_recalled"] = "engine_gone") -> None:
        """The first attempt's engine was gone before it took the request: its slot (no hold time learnt from it)
        and its hold given back, what its placement told that engine and any cap its context put on the output
        forgotten, the decision recorded. The key's lease stays: it is the request's, given back when the request
        ends."""
        inst = call.instance
        assert inst is not None
        call.unroute(PLACEMENT_FIELDS)
        call.emit(RequestRerouted(trace_id=call.trace_id, model=inst.model, instance_id=inst.instance_id,
                                  reason=reason, detail=detail[:500]))

    def _remote(self, call: Call, name: str) -> Instance:
        """The remote engine serving the call's model, unless its circuit is open or its key is missing."""
        r = remote(self.app.runner.state("remotes"), name)
        if r is None:
            raise Refused(f"the remote {name} is gone", reason="model_not_found", http_status=404)
        now = self.app.clock.now()
        if r.open_at(now):
            assert r.circuit_open_until is not None
            raise Refused(f"the remote engine {name} is unavailable ({r.circuit_reason}); it is tried again in "
                          f"{r.circuit_open_until - now:.0f} s", reason="remote_unavailable", http_status=503,
                          retry_after_s=float(max(1, round(r.circuit_open_until - now))),
                          observations={"remote": name, "url": r.url})
        key = self.app.env.get(r.api_key_env) if r.api_key_env else None
        if r.api_key_env and not key:
            raise Refused(f"the remote engine {name} needs its key in the environment variable {r.api_key_env}, "
                          "which the daemon does not have (set it, then restart `blazar serve`)",
                          reason="remote_unavailable", http_status=503, observations={"remote": name})
        return remote_instance(r, call.model, key)


def _prompt_upper_bound(body: dict[str, Any]) -> int:
    """Tokens the prompt can at most take: every text byte a token, plus the template's share."""
    total = TEMPLATE_TOKENS_BASE
    for key in ("messages", "input"):
        items = body.get(key)
        if isinstance(items, list):
            total += TEMPLATE_TOKENS_PER_MESSAGE * len(items) + len(orjson.dumps(items))
        elif isinstance(items, str):
            total += len(items.encode())
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        total += len(prompt.encode())
    elif isinstance(prompt, list):
        total += len(orjson.dumps(prompt))
    for key in ("tools", "system", "instructions"):
        if body.get(key):
            total += len(orjson.dumps(body[key]))
    return total


async def check_context(app: Blazar, client: EngineClient, call: Call, inst: Instance) -> tuple[int, int] | None:
    """Prompt plus max_tokens must fit the slot's context (blazar/serving/context_fit.py decides): as asked, the
    output bounded to what the context leaves (recorded as `request.bounded`), or a clear 400; never silent
    truncation of the prompt. The exact count (the engine's tokenizer, template applied) is asked only when a
    cheap upper bound does not settle it. (ctx, prompt tokens) when the prompt does not fit and nobody chose the
    context: the request is to be served by an instance with that context instead."""
    if call.request.embeddings or call.request.rerank:
        return None  # nothing generated; the engine refuses an input over its context itself
    ask = call.ask
    need_out = ask.max_tokens or 0
    if _prompt_upper_bound(ask.engine_body()) + need_out <= inst.ctx_tokens:
        return None
    try:
        n = await client.count_tokens(inst.base_url, call.request.engine_path, ask.engine_body(), api_key=inst.api_key)
    except EngineError as e:
        log.warning("token count failed for %s: %s", inst.model, e)
        return None  # the engine refuses an oversized prompt itself
    if n is None:
        return None
    if ask.ctx is None and not app.settings().fit.ctx_chosen:
        grown = grown_ctx(n, inst.ctx_tokens, call.route.resolved.metadata.ctx_train)
        if grown is not None:
            return grown, n
    bounded = decide_max_tokens(n, ask.max_tokens, inst.ctx_tokens, inst.model,
                                app.settings().inputs.max_tokens_over_context)
    if bounded is None:
        return None
    ask.bound_output(bounded, bound_body(ask.engine_body(), call.request.engine_path, bounded))
    call.emit(RequestBounded(trace_id=call.trace_id, model=inst.model, instance_id=inst.instance_id,
                             prompt_tokens=n, max_tokens=need_out, bounded_max_tokens=bounded,
                             ctx_tokens=inst.ctx_tokens))
    return None
