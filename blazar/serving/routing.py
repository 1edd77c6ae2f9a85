"""Where a call runs, and its slot there: the model resolved (this node's store, a remote engine, or another node),
an instance got ready (loading on demand, or forwarding to a node where it is ready), the context checked, a slot
taken (or a place in the queue) and the request placed on it. Each decision is recorded as the call's event; a
refusal is raised (`Refused`) for `Gateway.serve` to end the call with.

An instance found gone by the time the request took its slot (or before it took the request) is routed again, once
(`reroute`): its slot and hold given back, what its placement told the engine forgotten.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

import orjson

from blazar.adapters.engines.client import EngineClient
from blazar.adapters.engines.kinds import engine_kind, route_of
from blazar.cluster.nodes import FORWARD_HEADER, Peer, ready_peer
from blazar.cluster.remotes import remote_instance, resolved_remote
from blazar.context import Blazar
from blazar.errors import (
    AdmissionRefused,
    BlazarError,
    DeadlineUnmeetable,
    EngineError,
    EngineGone,
    ModelNotFound,
    Refused,
)
from blazar.events.requests import (
    RequestAdmitted,
    RequestBounded,
    RequestForwarded,
    RequestPlaced,
    RequestQueued,
    RequestRerouted,
    RequestRouted,
)
from blazar.instances.kv_bank import KvBank
from blazar.instances.supervisor import Instance, LoadReport, ResolvedModel
from blazar.projections.keys import auth_on
from blazar.projections.remotes import remote, serving
from blazar.serving.admission import Admission, Ticket
from blazar.serving.call import Call
from blazar.serving.context_fit import bound_body, decide_max_tokens, grown_ctx
from blazar.serving.fanout import Candidate
from blazar.serving.limits import Limiter
from blazar.serving.model_defaults import add_template_defaults
from blazar.serving.ports import SupervisorPort
from blazar.serving.principal import scope_refusal
from blazar.serving.rerank import refuse_unless_reranker
from blazar.serving.spec_governor import N_MAX_FIELD, SpecGovernor
from blazar.serving.tenancy import TENANT_HEADER, split_session

log = logging.getLogger("blazar.gateway")

# The prompt's upper bound in tokens is its UTF-8 size (a token is at least one byte) plus the chat template's
# own tokens; under this margin of the context no exact count is needed.
TEMPLATE_TOKENS_PER_MESSAGE = 16
TEMPLATE_TOKENS_BASE = 64
TRACE_HEADER = "x-blazar-trace-id"
SESSION_HEADER = "x-blazar-session"
# What one more HTTP hop through another node's gateway adds before the first token (bench/nodes.py measures it).
FORWARD_HOP_MS = 5


class Router:
    def __init__(self, app: Blazar, supervisor: SupervisorPort, admission: Admission, client: EngineClient,
                 kv: KvBank, cluster_key: str | None, limiter: Limiter, spec: SpecGovernor | None = None) -> None:
        self.app = app
        self.limiter = limiter  # the keys' leases: a fan-out's extra candidate takes one
        self.spec = spec  # whether a request on a speculative instance may draft (the governor's verdict)
        self.supervisor = supervisor
        self.admission = admission
        self.client = client
        self.kv = kv
        self._cluster_key = cluster_key

    def isolating(self) -> bool:
        """Whether tenants are kept apart: while keys are on (with none, every caller is the machine's owner)."""
        return auth_on(self.app.runner.state("keys"))

    # -- which model -----------------------------------------------------------------------------------------------

    def resolve(self, call: Call) -> None:
        """The call's model: this node's store's, else a remote engine's, else one only another node stores; a 404
        when none has it."""
        try:
            call.resolved = self.supervisor.resolve(call.model)
        except ModelNotFound as e:
            served = serving(self.app.runner.state("remotes"), call.model)
            peer = self._peer_for(call) if served is None else None
            if served is None and peer is None:
                raise Refused(e.message, reason="model_not_found", http_status=404) from None
            if served is not None:
                call.remote, call.resolved = served.name, resolved_remote(call.model)
            else:
                call.peer, call.resolved = peer, resolved_remote(call.model)  # not stored here: only there

    def check_kind(self, call: Call) -> None:
        """The model of this store serves the route (a chat to a whisper model is refused), and a rerank request's
        model reranks; a remote engine's or another node's answers for itself. After the key's scope: a key learns
        nothing of a model it may not use."""
        assert call.resolved is not None
        if call.remote is not None or call.peer is not None:
            return
        refuse_unless_served(call.resolved, call.request.engine_path)
        if call.request.rerank:
            refuse_unless_reranker(call.resolved)

    # -- where, and which slot ---------------------------------------------------------------------------------------

    async def admit(self, call: Call) -> None:
        """`route_and_admit`, routed again once when the instance was gone by the time the request got its slot."""
        try:
            await self.route_and_admit(call)
        except EngineGone as gone:
            self.reroute(call, gone.message)
            await self.route_and_admit(call)

    async def route_and_admit(self, call: Call) -> None:
        """Get a ready instance (loading on demand; a remote engine's stand-in), check the context, take a slot and
        place the request on it."""
        assert call.resolved is not None
        report = LoadReport()
        if call.remote is not None:
            inst = self._route_remote(call, call.remote)
        elif call.peer is not None:  # not in this node's store, ready on another
            inst = self._route_peer(call, "not_stored_here")
        elif (self._may_forward(call) and not self.supervisor.instances(call.resolved.name)
              and (peer := self._peer_for(call)) is not None and self._forward_cheaper(call, peer)):
            call.peer = peer
            inst = self._route_peer(call, "ready_there")
        else:
            try:
                inst = await self.supervisor.ensure(call.resolved, ctx=call.ctx, keep_alive=call.request.keep_alive,
                                                    embeddings=call.request.embeddings, report=report,
                                                    session=call.request.session is not None,
                                                    rerank=call.request.rerank)
            except BlazarError as e:
                raise Refused(e.message, reason=e.code, http_status=e.http_status, public=e.public) from None
        call.instance = inst
        add_template_defaults(call, inst.stops, inst.sampling, loop_guard=inst.loop_guard)
        call.load_ms = report.load_ms if report.cold else None
        call.emit(RequestRouted(trace_id=call.trace_id, model=inst.model, instance_id=inst.instance_id,
                                port=inst.port, cold=report.cold, load_ms=report.load_ms, evicted=report.evicted,
                                ctx_tokens=None if inst.remote else inst.ctx_tokens))
        audio = call.request.audio is not None  # a whisper or piper child: no context, no slots to place on
        grown = None if inst.remote or audio else await check_context(self.app, self.client, call, inst)
        if grown is not None:
            ctx, prompt_tokens = grown
            self.reroute(call, f"its prompt of {prompt_tokens} tokens does not fit the context of {inst.ctx_tokens} "
                               f"tokens per request: served by an instance with a context of {ctx}", "context_grown")
            call.ctx = ctx
            await self.route_and_admit(call)
            return
        ticket = await self._admit(call, inst, report)
        if not inst.remote and not audio:
            await self._place(call, inst, ticket.slot_id)

    def reroute(self, call: Call, detail: str, reason: Literal["engine_gone", "context_grown"] = "engine_gone"
                ) -> None:
        """The first attempt's engine was gone before it took the request: its slot (no hold time learnt from it)
        and its hold given back, what its placement told that engine and any cap its context put on the output
        forgotten, the decision recorded. The key's
        lease stays: it is the request's, given back when the request ends."""
        inst = call.instance
        assert inst is not None
        call.give_back_slot(learn=False)
        call.drop_engine_fields("id_slot", "cache_prompt", N_MAX_FIELD)
        call.unbound()
        call.instance, call.queue_position, call.rerouted = None, 0, True
        call.emit(RequestRerouted(trace_id=call.trace_id, model=inst.model, instance_id=inst.instance_id,
                                  reason=reason, detail=detail[:500]))

    def _route_remote(self, call: Call, name: str) -> Instance:
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

    # -- another node --------------------------------------------------------------------------------------------------

    def _may_forward(self, call: Call) -> bool:
        """Whether this request may go to another node at all (a node, the cluster key, not a request already
        forwarded here: one hop at most; not embeddings or rerank, whose instance must be started for them). Cheap:
        asked before anything is looked up."""
        return (bool(self.app.node) and self._cluster_key is not None and call.request.forwarded_from is None
                and not call.request.embeddings and not call.request.rerank and call.request.audio is None)

    def _peer_for(self, call: Call) -> Peer | None:
        """Another node with the call's model ready, where this one may forward."""
        if not self._may_forward(call):
            return None
        return ready_peer(self.app, call.name or call.model, ctx=call.ctx)

    def _forward_cheaper(self, call: Call, peer: Peer) -> bool:
        """Forwarding costs one more HTTP hop (about a millisecond on a LAN: BENCHMARK.md); loading here costs what
        it took there. Both numbers go into the decision's event."""
        call.forward_observations = {"peer_load_ms": peer.load_ms, "hop_ms_estimate": FORWARD_HOP_MS}
        return peer.load_ms is None or peer.load_ms > FORWARD_HOP_MS

    def _route_peer(self, call: Call, reason: Literal["ready_there", "not_stored_here"]) -> Instance:
        """The stand-in instance for the node where the model is ready: its gateway's URL, the cluster key, and the
        headers that make it one trace (the hop's events share this trace id); the decision recorded."""
        peer = call.peer
        assert peer is not None and self._cluster_key is not None
        call.emit(RequestForwarded(trace_id=call.trace_id, model=call.model, node=peer.node, url=peer.url,
                                   instance_id=peer.instance_id, reason=reason,
                                   observations={**call.forward_observations, "peer_slots": peer.slots,
                                                 "peer_ctx_tokens": peer.ctx_tokens}))
        return Instance(instance_id=f"node:{peer.node}", model=call.model, port=0, slots=peer.slots,
                        ctx_tokens=peer.ctx_tokens, engine_tag=f"node:{peer.node}", api_key=self._cluster_key,
                        served_as=call.model, url=peer.url,
                        headers={FORWARD_HEADER: self.app.node, TRACE_HEADER: call.trace_id, **_hop_tenancy(call)})

    # -- the slot ------------------------------------------------------------------------------------------------------

    async def _admit(self, call: Call, inst: Instance, report: LoadReport) -> Ticket:
        """A slot of `inst` (or a place in its queue), recorded; the instance held against eviction."""
        request = call.request

        def on_queued(position: int, depth: int) -> None:
            call.queue_position = position
            snap = self.admission.snapshot().get(inst.model, {})
            call.emit(RequestQueued(trace_id=call.trace_id, model=inst.model, instance_id=inst.instance_id,
                                    position=position, depth=depth, slots=inst.slots, busy=int(snap.get("busy", 0))))

        deadline_s = call.deadline_left_s()
        try:
            if deadline_s is not None and deadline_s <= 0:
                raise DeadlineUnmeetable(f"{inst.model}: the deadline of {request.deadline_ms} ms passed before a slot "
                                         f"was asked for ({'the model loaded' if report.cold else 'routing'} took it)",
                                         observations={"deadline_ms": request.deadline_ms, "load_ms": report.load_ms})
            ticket = await self.admission.acquire(
                inst.lane, inst.slots, priority=request.priority, max_tokens=call.max_tokens, on_queued=on_queued,
                deadline_s=deadline_s,
                pick=None if inst.remote else self.kv.slots.picker(inst.instance_id, request.session, request.tenant,
                                                                   isolate=self.isolating()))
        except AdmissionRefused as e:
            raise Refused(e.message, reason=e.reason, http_status=e.http_status, retry_after_s=e.retry_after_s,
                          observations=e.observations) from None
        call.admitted(ticket)
        if not inst.remote:
            try:
                self.supervisor.hold(inst)
            except BlazarError as e:
                call.give_back_slot(learn=False)
                if not call.rerouted:  # the instance exited while the request waited for its slot
                    raise EngineGone(e.message) from None
                raise Refused(e.message, reason=e.code, http_status=e.http_status, public=e.public) from None
            call.holding(inst)
        spec = self.spec.request_spec(inst, request.spec) if self.spec is not None else None
        if spec is not None and spec != "on":
            call.set_engine_field(N_MAX_FIELD, 0)  # this request never drafts; the child runs on as it is
        call.emit(RequestAdmitted(trace_id=call.trace_id, model=inst.model, instance_id=inst.instance_id,
                                  waited_ms=round(ticket.waited_s * 1000, 3), slots=ticket.slots,
                                  busy=ticket.busy_after, queued_behind=max(0, ticket.position_when_queued - 1),
                                  slot_id=None if inst.remote else ticket.slot_id, spec=spec))
        return ticket

    async def _place(self, call: Call, inst: Instance, slot_id: int) -> None:
        """The slot the request runs on: named to the engine once sessions hold slots or tenants are kept apart
        (then another tenant's prefix there is not reused), and for a session its prefix made ready there (warm, or
        restored from the KV bank), recorded as `request.placed`."""
        session = call.request.session
        placed = await self.kv.place(inst, slot_id, session, tenant=call.request.tenant)
        isolate = self.isolating() and not (call.request.embeddings or call.request.rerank)
        for name, value in placed.engine_fields(slot_id, isolate=isolate).items():
            call.set_engine_field(name, value)
        if session is not None and placed.kv is not None:
            call.emit(RequestPlaced(trace_id=call.trace_id, model=inst.model, instance_id=inst.instance_id,
                                    slot_id=slot_id, session=session, kv=placed.kv, reason=placed.reason,
                                    restored_tokens=placed.restored_tokens, restore_ms=placed.restore_ms))

    # -- what a fan-out takes more of ----------------------------------------------------------------------------------

    async def extra_candidate(self, call: Call) -> Candidate | None:
        """One more slot of the call's instance, free now (never a wait), with the key's extra lease (each candidate
        counts against its max_concurrent) and, on a child, a hold and the slot's placement; None when any of them
        is not to be had."""
        inst = call.instance
        assert inst is not None
        p = call.request.principal
        limits = p.limits() if p is not None else None
        lease = self.limiter.extra(limits) if limits is not None else None
        if limits is not None and lease is None:
            return None
        isolate = self.isolating()
        ticket = self.admission.try_acquire(inst.lane, inst.slots, pick=None if inst.remote else self.kv.slots.picker(
            inst.instance_id, None, call.request.tenant, isolate=isolate))
        held = False

        def release() -> None:
            if ticket is not None:
                self.admission.release(ticket)
            if held:
                self.supervisor.unhold(inst)
            if lease is not None:
                self.limiter.release(lease)

        if ticket is None:
            release()
            return None
        if inst.remote:
            return Candidate(slot_id=ticket.slot_id, release=release)
        try:
            self.supervisor.hold(inst)
        except BlazarError:
            self.admission.give_back(ticket)
            ticket = None
            release()
            return None  # the instance is gone: the candidates so far are all there will be
        held = True
        try:
            placed = await self.kv.place(inst, ticket.slot_id, None, tenant=call.request.tenant)
        except BaseException:
            release()
            raise
        return Candidate(slot_id=ticket.slot_id, engine_fields=placed.engine_fields(ticket.slot_id, isolate=isolate),
                         release=release)

    def resolve_in_scope(self, call: Call, name: str) -> tuple[ResolvedModel, str | None]:
        """A cascade's model `name`: the store's, else a remote engine's (its name second), in the key's scope."""
        remote = None
        try:
            resolved = self.supervisor.resolve(name)
        except ModelNotFound as e:
            served = serving(self.app.runner.state("remotes"), name)
            if served is None:
                raise Refused(f"cascade: {e.message}", reason="model_not_found", http_status=404) from None
            resolved, remote = resolved_remote(name), served.name
        p = call.request.principal
        if p is not None and p.key is not None and not p.allows(name, resolved.name):
            raise Refused(scope_refusal(p, name, resolved.name), reason="model_not_allowed", http_status=403,
                          error_type="permission_error")
        return resolved, remote


def refuse_unless_served(model: ResolvedModel, engine_path: str) -> None:
    """Refused (400), before any load, when the model's kind does not serve the route asked for (a chat to a whisper
    model): the message names the model, its kind and the routes it does serve."""
    route = route_of(engine_path)
    kind = engine_kind(model.kind)
    if route is None or kind.serves(route):
        return
    raise Refused(kind.refusal(model.name), reason="model_kind_mismatch", http_status=400,
                  error_type="invalid_request_error",
                  observations={"kind": kind.name, "route": route, "serves": sorted(kind.routes)})


def _hop_tenancy(call: Call) -> dict[str, str]:
    """What the peer needs to keep the request's tenant apart there too: the tenant this node found, and the session
    by the name its client gave (the peer puts it in the same namespace)."""
    request = call.request
    headers = {TENANT_HEADER: request.tenant} if request.tenant is not None else {}
    if request.session is not None:
        headers[SESSION_HEADER] = split_session(request.session)[1]
    return headers


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
    need_out = call.max_tokens or 0
    if _prompt_upper_bound(call.engine_body()) + need_out <= inst.ctx_tokens:
        return None
    try:
        n = await client.count_tokens(inst.base_url, call.request.engine_path, call.engine_body(),
                                          api_key=inst.api_key)
    except EngineError as e:
        log.warning("token count failed for %s: %s", inst.model, e)
        return None  # the engine refuses an oversized prompt itself
    if n is None:
        return None
    if call.ctx is None and call.resolved is not None and "ctx" not in app.settings().model_fields_set:
        grown = grown_ctx(n, inst.ctx_tokens, call.resolved.metadata.ctx_train)
        if grown is not None:
            return grown, n
    bounded = decide_max_tokens(n, call.max_tokens, inst.ctx_tokens, inst.model,
                                app.settings().inputs.max_tokens_over_context)
    if bounded is None:
        return None
    call.bound_output(bounded, bound_body(call.engine_body(), call.request.engine_path, bounded))
    call.emit(RequestBounded(trace_id=call.trace_id, model=inst.model, instance_id=inst.instance_id,
                             prompt_tokens=n, max_tokens=need_out, bounded_max_tokens=bounded,
                             ctx_tokens=inst.ctx_tokens))
    return None
