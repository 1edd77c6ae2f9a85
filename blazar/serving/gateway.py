"""The request pipeline every dialect shares: resolve the model, get a ready instance (loading it on demand), refuse
what cannot fit its context, take a slot (or wait for one), relay the engine's answer, and record each step as a
request event through the group-commit writer (never awaited on the token path).

A route parses its dialect into a `Plan` (blazar/serving/plan.py) and calls `serve(plan)`, which returns the
`Answer` to send: a relayed stream (blazar/serving/relay.py) or one body. Every exit path releases the slot and
records how the request ended.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Literal

import orjson

from blazar.adapters.engines.answers import refusal, usage_from_json
from blazar.adapters.engines.client import EngineClient, EngineResponse
from blazar.cluster.nodes import FORWARD_HEADER, Peer, cluster_key, ready_peer
from blazar.cluster.remotes import RemoteBreaker, remote_instance, resolved_remote
from blazar.context import Blazar, stamp_node
from blazar.dialects.tools import ForcedStream, OpenAIStream
from blazar.errors import (
    AdmissionRefused,
    BlazarError,
    DeadlineUnmeetable,
    EngineError,
    EngineGone,
    EngineStreamBroken,
    ModelNotFound,
    Refused,
)
from blazar.events.base import Event
from blazar.events.requests import (
    RequestAdmitted,
    RequestCompleted,
    RequestFailed,
    RequestFirstToken,
    RequestForwarded,
    RequestPlaced,
    RequestQueued,
    RequestReceived,
    RequestRejected,
    RequestRerouted,
    RequestRouted,
)
from blazar.instances.kv_bank import KvBank
from blazar.instances.supervisor import Instance, Route
from blazar.projections.keys import auth_on
from blazar.projections.metrics import tokens_on
from blazar.projections.remotes import remote, serving
from blazar.serving import fanout, relay
from blazar.serving.admission import Admission, Ticket
from blazar.serving.flights import Flights, flight_key
from blazar.serving.limits import Limiter, LimitExceeded
from blazar.serving.model_defaults import apply_settings
from blazar.serving.plan import Answer, Plan
from blazar.serving.ports import SupervisorPort
from blazar.serving.principal import Principal, scope_refusal
from blazar.serving.tenancy import TENANT_HEADER, split_session

log = logging.getLogger("blazar.gateway")

# The prompt's upper bound in tokens is its UTF-8 size (a token is at least one byte) plus the chat template's
# own tokens; under this margin of the context no exact count is needed.
TEMPLATE_TOKENS_PER_MESSAGE = 16
TEMPLATE_TOKENS_BASE = 64


SSE = "text/event-stream"
TRACE_HEADER = "x-blazar-trace-id"
SESSION_HEADER = "x-blazar-session"
# What one more HTTP hop through another node's gateway adds before the first token (bench/nodes.py measures it).
FORWARD_HOP_MS = 5


class Gateway:
    def __init__(self, app: Blazar, supervisor: SupervisorPort, admission: Admission, client: EngineClient,
                 kv: KvBank | None = None) -> None:
        self.app = app
        self.supervisor = supervisor
        self.admission = admission
        self.client = client
        self.kv = kv if kv is not None else KvBank(app, client)  # sessions' slots, and the bank that saves them
        self.flights = Flights(self)  # identical deterministic requests in flight
        self.remotes = RemoteBreaker(app)  # remote engines' circuits
        self._writer = app.request_writer()
        self._actor = app.actor
        self.limits = Limiter(app.clock, seed=self._tokens_today)
        self._cluster_key = cluster_key(app.env) if app.node else None  # forwarding to other nodes needs it

    def _tokens_today(self, key_name: str, day: int) -> int:
        """What the log says a key used on UTC day `day` (a restarted daemon keeps counting the daily limit)."""
        return tokens_on(self.app.runner.state("metrics"), key_name, day)

    def emit(self, event: Event, trace_id: str, actor: str | None = None) -> None:
        """Hand a request event to the group-commit writer; its actor is the caller's key ("key:<name>") where keys
        are on, else the daemon's."""
        if self.app.node:  # a session's save or restore is the node's own (its files are here)
            event = stamp_node(event, self.app.node)
        self._writer.submit(event, actor=actor or self._actor, trace_id=trace_id)

    # -- before the engine --------------------------------------------------------------------------------------

    # -- the pipeline -------------------------------------------------------------------------------------------

    async def serve(self, plan: Plan, watcher: asyncio.Task[None] | None = None) -> Answer:
        """Resolve, route (loading on demand), check the context, admit, ask the engine: a streamed Answer relays
        as it comes, any other is read whole. Raises Refused (recorded) for a refusal. `watcher`, the task that
        notices the client hanging up, is stopped once the answer is over. An identical deterministic request
        already in flight is joined instead (blazar/serving/flights.py)."""
        payload = plan.payload()
        self.received(plan, body_bytes=len(payload))
        if plan.cascade:
            plan.model = plan.cascade[0]
        base = fanout.base_of(plan)
        try:
            self.caller(plan)
        except BaseException as e:
            self.drop_lease(plan)
            self.fail(plan, status=500, reason="internal_error", detail=f"{type(e).__name__}: {e}")
            raise
        if plan.dirty:
            payload = plan.payload()
        if plan.cascade or (plan.best_of or 1) > 1:
            return await fanout.serve(self, plan, watcher, base)
        key = flight_key(plan)
        if key is not None:
            return await self.flights.serve(key, plan, watcher, payload)
        return await self.generate(plan, watcher, payload)

    async def generate(self, plan: Plan, watcher: asyncio.Task[None] | None, payload: bytes) -> Answer:
        """The pipeline after the caller's checks: route, admit, ask the engine, and the Answer. A request whose
        engine child turned out gone before it took the request is routed again, once (`EngineGone`)."""
        try:
            while True:  # twice at most: EngineGone is raised only while the request was not routed again
                try:
                    await self.admit(plan)
                    if plan.dirty:
                        payload = plan.payload()  # the model's settings or the session's slot changed the body
                    upstream = await self.open_upstream(plan, payload)
                    break
                except EngineGone as gone:
                    self._reroute(plan, gone.message)
                except BaseException:
                    self.drop_lease(plan)  # whatever refused or broke it before the answer: the lease is not kept
                    raise
        except asyncio.CancelledError:
            self.fail(plan, status=499, reason="client_disconnected", detail="the client closed the connection while "
                      "the request waited" + (" for a slot" if plan.instance else " for the model to load"))
            raise
        except BaseException as e:
            # NOTE: every request.received ends with exactly one terminal event: a refusal recorded itself (Refused
            # marks the plan done); anything else that broke the pipeline is recorded here.
            self.fail(plan, status=500, reason="internal_error", detail=f"{type(e).__name__}: {e}")
            raise
        self.guard(plan, upstream)
        headers = {"x-blazar-queue-position": str(plan.queue_position)} if plan.queue_position else {}
        if plan.stream and upstream.status_code == 200:
            return self._streamed(plan, upstream, watcher, headers)
        try:
            data = await self.finish(plan, upstream)
        finally:
            if watcher is not None:
                watcher.cancel()
        if upstream.status_code >= 400:
            return Answer(status=upstream.status_code, refused=data, refusal=refusal(data), headers=headers)
        if plan.reply is None and plan.forced is None:
            rename = relay.renamer(plan)
            return Answer(status=upstream.status_code, data=rename.whole(data) if rename else data,
                          content_type=upstream.headers.get("content-type", "application/json"), headers=headers)
        return self.whole_answer(plan, orjson.loads(data), status=upstream.status_code, headers=headers)

    def whole_answer(self, plan: Plan, answer: Any, *, status: int, headers: dict[str, str]) -> Answer:
        """A whole answer (parsed) as the client gets it: its model named as the client did, a forced tool call made
        a call, the dialect's reply shape."""
        if isinstance(answer, dict) and "model" in answer:
            answer["model"] = plan.model  # the client's name for it, not the engine's
        if plan.forced is not None:
            answer = plan.forced.answer(answer)
        return Answer(status=status, media=plan.reply(answer, plan) if plan.reply else answer, headers=headers)

    def engine_refusal(self, plan: Plan, status: int, data: bytes) -> Answer:
        """The engine refused (or could not be reached): recorded as the request's failure, its words passed on."""
        self.fail(plan, status=status, reason="engine_error", detail=refusal(data)[0])
        return Answer(status=status, refused=data, refusal=refusal(data))

    async def ask_whole(self, plan: Plan, body: dict[str, Any]) -> tuple[int, Any, bytes]:
        """One whole answer from the plan's instance for `body`, recording nothing: (status, parsed JSON or None,
        bytes). An engine that cannot be reached is a 502 with its words."""
        inst = plan.instance
        assert inst is not None
        try:
            extra = {"headers": inst.headers} if inst.headers else {}  # a hop to another node
            upstream = await self.client.open(inst.base_url, plan.engine_path, orjson.dumps(body),
                                              api_key=inst.api_key, **extra)
            try:
                data = await upstream.aread()
            finally:
                await upstream.aclose()
        except EngineError as e:
            return 502, None, orjson.dumps({"error": {"message": e.message, "type": "engine_error"}})
        try:
            parsed = orjson.loads(data)
        except orjson.JSONDecodeError:
            parsed = None
        return upstream.status_code, parsed, data

    def release_step(self, plan: Plan, *, tokens: int | None = None) -> None:
        """A cascade step is over: its slot and its hold on the instance go back; the request goes on."""
        if plan.ticket is not None:
            self.admission.release(plan.ticket, tokens=tokens)
            plan.ticket = None
        if plan.held and plan.instance is not None:
            self.supervisor.unhold(plan.instance)
            plan.held = False

    def _streamed(self, plan: Plan, upstream: EngineResponse, watcher: asyncio.Task[None] | None,
                  headers: dict[str, str]) -> Answer:
        headers["cache-control"] = "no-cache"
        inner = plan.stream_as(plan) if plan.stream_as is not None else None
        translator = inner if plan.forced is None else ForcedStream(plan.forced, inner or OpenAIStream())
        if translator is None:
            return Answer(status=200, content_type=upstream.headers.get("content-type", SSE), headers=headers,
                          stream=relay.passthrough(self, plan, upstream, watcher))
        return Answer(status=200, content_type=translator.content_type, headers=headers,
                      stream=relay.translated(self, plan, upstream, watcher, translator))

    # -- before the engine --------------------------------------------------------------------------------------

    def received(self, plan: Plan, *, body_bytes: int) -> None:
        self.emit(RequestReceived(trace_id=plan.trace_id, dialect=plan.dialect, route=plan.route,  # type: ignore[arg-type]
                                  model=plan.model, stream=plan.stream, body_bytes=body_bytes, priority=plan.priority,
                                  max_tokens=plan.max_tokens, client=plan.client,
                                  client_trace_id=plan.client_trace_id, parent_trace_id=plan.parent_trace_id,
                                  parent_span_id=plan.parent_span_id, session=plan.session,
                                  deadline_ms=plan.deadline_ms, best_of=plan.best_of, cascade=list(plan.cascade),
                                  forwarded_from=plan.forwarded_from, tenant=plan.tenant),
                  plan.trace_id, plan.actor)

    def reject(self, plan: Plan, *, status: int, reason: str, detail: str, retry_after_s: float | None = None,
               observations: dict[str, Any] | None = None, error_type: str | None = None) -> Refused:
        """Record the refusal (the request's one terminal event) and return the error to raise (`error_type`: a
        dialect's own kind where the status alone does not say it). A provisional plan (a cascade step) records
        nothing: its caller records the step's outcome and goes on."""
        if plan.provisional:
            return Refused(detail, reason=reason, http_status=status, retry_after_s=retry_after_s,
                           observations=observations, error_type=error_type)
        plan.done = True
        self.emit(RequestRejected(trace_id=plan.trace_id, model=plan.name or plan.model, status=status,
                                  reason=reason, detail=detail, retry_after_s=retry_after_s,  # type: ignore[arg-type]
                                  observations=observations or {},
                                  duration_ms=round((time.perf_counter() - plan.received) * 1000, 3)),
                  plan.trace_id, plan.actor)
        return Refused(detail, reason=reason, http_status=status, retry_after_s=retry_after_s,
                       observations=observations, error_type=error_type)

    def caller(self, plan: Plan) -> None:
        """What is the caller's own: the model resolved, the key's scope and limits (its lease taken), the model's
        settings applied. Raises Refused, recorded."""
        try:
            plan.resolved = self.supervisor.resolve(plan.model)
        except ModelNotFound as e:
            served = serving(self.app.runner.state("remotes"), plan.model)
            peer = self._peer_for(plan) if served is None else None
            if served is None and peer is None:
                raise self.reject(plan, status=404, reason="model_not_found", detail=e.message) from None
            if served is not None:
                plan.remote, plan.resolved = served.name, resolved_remote(plan.model)
            else:
                plan.peer, plan.resolved = peer, resolved_remote(plan.model)  # not stored here: only there
        self._authorize(plan)
        if plan.resolved.settings is not None:
            apply_settings(plan, plan.resolved.settings)  # before routing: num_ctx and num_predict shape it
            plan.dirty = True

    def _authorize(self, plan: Plan) -> None:
        """The caller's key: is the model in its scope (by the client's name or the store's), and do its limits
        allow one more request now? Takes the key's concurrency lease."""
        p = plan.principal
        if p is None or p.key is None:
            return
        assert plan.name is not None
        if not p.allows(plan.model, plan.name):
            raise self.reject(plan, status=403, reason="model_not_allowed", detail=scope_refusal(p, plan.model,
                              plan.name), observations={"key": p.key_name, "models": list(p.models)},
                              error_type="permission_error")
        limits = p.limits()
        assert limits is not None
        try:
            plan.lease = self.limits.acquire(limits)
        except LimitExceeded as e:
            raise self.reject(plan, status=429, reason="rate_limit_exceeded", detail=e.message,
                              retry_after_s=e.retry_after_s,
                              observations={"key": p.key_name, "limit": e.limit, "value": e.value}) from None

    def check_scope(self, principal: Principal | None, model: str) -> None:
        """The scope check alone, for what a dialect answers without the pipeline (Ollama's load or unload)."""
        if principal is None or principal.key is None:
            return
        try:
            name = self.supervisor.resolve(model).name
        except ModelNotFound:
            name = model
        if not principal.allows(model, name):
            raise Refused(scope_refusal(principal, model, name), reason="model_not_allowed", http_status=403,
                          error_type="permission_error")

    def drop_lease(self, plan: Plan) -> None:
        if plan.lease is not None:
            self.limits.release(plan.lease)
            plan.lease = None

    async def route_and_admit(self, plan: Plan) -> None:
        """Get a ready instance (loading on demand; a remote engine's stand-in), check the context, take a slot and
        place the request on it."""
        assert plan.resolved is not None
        route = Route()
        if plan.remote is not None:
            inst = self._route_remote(plan, plan.remote)
        elif plan.peer is not None:  # not in this node's store, ready on another
            inst = self._route_peer(plan, "not_stored_here")
        elif (self._may_forward(plan) and not self.supervisor.instances(plan.resolved.name)
              and (peer := self._peer_for(plan)) is not None and self._forward_cheaper(plan, peer)):
            plan.peer = peer
            inst = self._route_peer(plan, "ready_there")
        else:
            try:
                inst = await self.supervisor.ensure(plan.resolved, ctx=plan.ctx, keep_alive=plan.keep_alive,
                                                    embeddings=plan.embeddings, route=route,
                                                    session=plan.session is not None)
            except BlazarError as e:
                raise self.reject(plan, status=e.http_status, reason=e.code, detail=e.message) from None
        plan.instance = inst
        plan.load_ms = route.load_ms if route.cold else None
        self.emit(RequestRouted(trace_id=plan.trace_id, model=inst.model, instance_id=inst.instance_id,
                                port=inst.port, cold=route.cold, load_ms=route.load_ms, evicted=route.evicted,
                                ctx_tokens=None if inst.remote else inst.ctx_tokens), plan.trace_id, plan.actor)
        if not inst.remote:
            await self._check_context(plan, inst)
        ticket = await self._admit(plan, inst, route)
        if not inst.remote:
            await self._place(plan, inst, ticket.slot_id)

    def _route_remote(self, plan: Plan, name: str) -> Instance:
        """The remote engine serving the plan's model, unless its circuit is open or its key is missing."""
        r = remote(self.app.runner.state("remotes"), name)
        if r is None:
            raise self.reject(plan, status=404, reason="model_not_found", detail=f"the remote {name} is gone")
        now = self.app.clock.now()
        if r.open_at(now):
            assert r.circuit_open_until is not None
            raise self.reject(plan, status=503, reason="remote_unavailable",
                              detail=f"the remote engine {name} is unavailable ({r.circuit_reason}); it is tried "
                                     f"again in {r.circuit_open_until - now:.0f} s",
                              retry_after_s=float(max(1, round(r.circuit_open_until - now))),
                              observations={"remote": name, "url": r.url})
        key = self.app.env.get(r.api_key_env) if r.api_key_env else None
        if r.api_key_env and not key:
            raise self.reject(plan, status=503, reason="remote_unavailable",
                              detail=f"the remote engine {name} needs its key in the environment variable "
                                     f"{r.api_key_env}, which the daemon does not have (set it, then restart "
                                     "`blazar serve`)", observations={"remote": name})
        return remote_instance(r, plan.model, key)

    def _may_forward(self, plan: Plan) -> bool:
        """Whether this request may go to another node at all (a node, the cluster key, not a request already
        forwarded here: one hop at most; not embeddings, whose instance must be started for them). Cheap: asked
        before anything is looked up."""
        return (bool(self.app.node) and self._cluster_key is not None and plan.forwarded_from is None
                and not plan.embeddings)

    def _peer_for(self, plan: Plan) -> Peer | None:
        """Another node with the plan's model ready, where this one may forward."""
        if not self._may_forward(plan):
            return None
        return ready_peer(self.app, plan.resolved.name if plan.resolved is not None else plan.model, ctx=plan.ctx)

    def _forward_cheaper(self, plan: Plan, peer: Peer) -> bool:
        """Forwarding costs one more HTTP hop (about a millisecond on a LAN: BENCHMARK.md); loading here costs what
        it took there. Both numbers go into the decision's event."""
        plan.forward_observations = {"peer_load_ms": peer.load_ms, "hop_ms_estimate": FORWARD_HOP_MS}
        return peer.load_ms is None or peer.load_ms > FORWARD_HOP_MS

    def _route_peer(self, plan: Plan, reason: Literal["ready_there", "not_stored_here"]) -> Instance:
        """The stand-in instance for the node where the model is ready: its gateway's URL, the cluster key, and the
        headers that make it one trace (the hop's events share this trace id); the decision recorded."""
        peer = plan.peer
        assert peer is not None and self._cluster_key is not None
        self.emit(RequestForwarded(trace_id=plan.trace_id, model=plan.model, node=peer.node, url=peer.url,
                                   instance_id=peer.instance_id, reason=reason,
                                   observations={**plan.forward_observations, "peer_slots": peer.slots,
                                                 "peer_ctx_tokens": peer.ctx_tokens}),
                  plan.trace_id, plan.actor)
        return Instance(instance_id=f"node:{peer.node}", model=plan.model, port=0, slots=peer.slots,
                        ctx_tokens=peer.ctx_tokens, engine_tag=f"node:{peer.node}", api_key=self._cluster_key,
                        served_as=plan.model, url=peer.url,
                        headers={FORWARD_HEADER: self.app.node, TRACE_HEADER: plan.trace_id,
                                 **self._hop_tenancy(plan)})

    @staticmethod
    def _hop_tenancy(plan: Plan) -> dict[str, str]:
        """What the peer needs to keep the request's tenant apart there too: the tenant this node found, and the
        session by the name its client gave (the peer puts it in the same namespace)."""
        headers = {TENANT_HEADER: plan.tenant} if plan.tenant is not None else {}
        if plan.session is not None:
            headers[SESSION_HEADER] = split_session(plan.session)[1]
        return headers

    async def _admit(self, plan: Plan, inst: Instance, route: Route) -> Ticket:
        """A slot of `inst` (or a place in its queue), recorded; the instance held against eviction."""

        def on_queued(position: int, depth: int) -> None:
            plan.queue_position = position
            snap = self.admission.snapshot().get(inst.model, {})
            self.emit(RequestQueued(trace_id=plan.trace_id, model=inst.model, instance_id=inst.instance_id,
                                    position=position, depth=depth, slots=inst.slots,
                                    busy=int(snap.get("busy", 0))), plan.trace_id, plan.actor)

        deadline_s = plan.deadline_left_s()
        lane = inst.lane  # a remote's concurrency is its own, for every model
        try:
            if deadline_s is not None and deadline_s <= 0:
                raise DeadlineUnmeetable(f"{inst.model}: the deadline of {plan.deadline_ms} ms passed before a slot "
                                         f"was asked for ({'the model loaded' if route.cold else 'routing'} took it)",
                                         observations={"deadline_ms": plan.deadline_ms, "load_ms": route.load_ms})
            ticket = await self.admission.acquire(
                lane, inst.slots, priority=plan.priority, max_tokens=plan.max_tokens, on_queued=on_queued,
                deadline_s=deadline_s,
                pick=None if inst.remote else self.kv.slots.picker(inst.instance_id, plan.session, plan.tenant,
                                                                   isolate=self.isolating()))
        except AdmissionRefused as e:
            raise self.reject(plan, status=e.http_status, reason=e.reason, detail=e.message,
                              retry_after_s=e.retry_after_s, observations=e.observations) from None
        plan.ticket = ticket
        if not inst.remote:
            try:
                self.supervisor.hold(inst)
            except BlazarError as e:
                self.admission.give_back(ticket)
                plan.ticket = None
                if not plan.rerouted:  # the instance exited while the request waited for its slot
                    raise EngineGone(e.message) from None
                raise self.reject(plan, status=e.http_status, reason=e.code, detail=e.message) from None
            plan.held = True
        self.emit(RequestAdmitted(trace_id=plan.trace_id, model=inst.model, instance_id=inst.instance_id,
                                  waited_ms=round(ticket.waited_s * 1000, 3), slots=ticket.slots,
                                  busy=ticket.busy_after, queued_behind=max(0, ticket.position_when_queued - 1),
                                  slot_id=None if inst.remote else ticket.slot_id), plan.trace_id, plan.actor)
        return ticket

    def isolating(self) -> bool:
        """Whether tenants are kept apart: while keys are on (with none, every caller is the machine's owner)."""
        return auth_on(self.app.runner.state("keys"))

    async def _place(self, plan: Plan, inst: Instance, slot_id: int) -> None:
        """The slot the request runs on: named to the engine once sessions hold slots or tenants are kept apart
        (then another tenant's prefix there is not reused), and for a session its prefix made ready there (warm, or
        restored from the KV bank), recorded as `request.placed`."""
        placed = await self.kv.place(inst, slot_id, plan.session, tenant=plan.tenant)
        for name, value in placed.engine_fields(slot_id, isolate=self.isolating() and not plan.embeddings).items():
            plan.set_engine_field(name, value)
        if plan.session is not None and placed.kv is not None:
            self.emit(RequestPlaced(trace_id=plan.trace_id, model=inst.model, instance_id=inst.instance_id,
                                    slot_id=slot_id, session=plan.session, kv=placed.kv, reason=placed.reason,
                                    restored_tokens=placed.restored_tokens, restore_ms=placed.restore_ms),
                      plan.trace_id, plan.actor)

    async def _check_context(self, plan: Plan, inst: Instance) -> None:
        """Prompt plus max_tokens must fit the slot's context: a clear 400, never silent truncation. The exact count
        (the engine's tokenizer, template applied) is asked only when a cheap upper bound does not settle it."""
        if plan.embeddings:
            return
        need_out = plan.max_tokens or 0
        if _prompt_upper_bound(plan.engine_body()) + need_out <= inst.ctx_tokens:
            return
        try:
            n = await self.client.count_tokens(inst.base_url, plan.engine_path, plan.engine_body(),
                                              api_key=inst.api_key)
        except EngineError as e:
            log.warning("token count failed for %s: %s", inst.model, e)
            return  # the engine refuses an oversized prompt itself
        if n is None:
            return
        if n + need_out > inst.ctx_tokens or n >= inst.ctx_tokens:
            detail = (f"this request needs {n} prompt tokens + {need_out} max_tokens = {n + need_out} tokens, but "
                      f"{inst.model}'s context is {inst.ctx_tokens} tokens per request; shorten the prompt or lower "
                      "max_tokens")
            raise self.reject(plan, status=400, reason="context_length_exceeded", detail=detail,
                              observations={"prompt_tokens": n, "max_tokens": need_out, "ctx_tokens": inst.ctx_tokens})

    # -- the engine's answer ------------------------------------------------------------------------------------

    async def open_upstream(self, plan: Plan, body: bytes) -> EngineResponse:
        """Send the request to its instance and return the answer unread. When the connection failed before any
        answer and the instance is a child of ours that is gone (`Supervisor.gone`: exited, or exiting), raises
        EngineGone (nothing recorded: the caller routes the request again) unless it was routed again already;
        else records the 502."""
        inst = plan.instance
        assert inst is not None
        try:
            extra = {"headers": inst.headers} if inst.headers else {}  # a hop to another node
            upstream = await self.client.open(inst.base_url, plan.engine_path, body, api_key=inst.api_key, **extra)
        except EngineError as e:
            if not plan.rerouted and not inst.remote and await self.supervisor.gone(inst):
                raise EngineGone(e.message) from None
            self.fail(plan, status=502, reason="engine_error", detail=e.message)
            if plan.remote is not None:
                await self.remotes.failed(plan.remote, e.message, source="request")
            raise Refused(e.message, reason="engine_error", http_status=502) from None
        if plan.remote is not None:
            if upstream.status_code >= 500:
                await self.remotes.failed(plan.remote, f"answered {upstream.status_code}", source="request")
            else:
                await self.remotes.succeeded(plan.remote)
        return upstream

    async def admit(self, plan: Plan) -> None:
        """`route_and_admit`, routed again once when the instance was gone by the time the request got its slot."""
        try:
            await self.route_and_admit(plan)
        except EngineGone as gone:
            self._reroute(plan, gone.message)
            await self.route_and_admit(plan)

    def _reroute(self, plan: Plan, detail: str) -> None:
        """The first attempt's engine was gone before it took the request: its slot (no hold time learnt from it)
        and its hold on the instance given back, what its placement told that engine forgotten, the decision recorded.
        The key's lease stays: it is the request's, given back once when the request ends."""
        inst = plan.instance
        assert inst is not None
        if plan.ticket is not None:
            self.admission.give_back(plan.ticket)
            plan.ticket = None
        if plan.held:
            self.supervisor.unhold(inst)
            plan.held = False
        if plan.body is not None:
            for name in ("id_slot", "cache_prompt"):  # what the placement told that engine; the next one's says its own
                if name not in plan.parsed:
                    plan.body.pop(name, None)
            plan.dirty = True
        plan.instance, plan.queue_position, plan.rerouted = None, 0, True
        self.emit(RequestRerouted(trace_id=plan.trace_id, model=inst.model, instance_id=inst.instance_id,
                                  detail=detail[:500]), plan.trace_id, plan.actor)

    def guard(self, plan: Plan, upstream: EngineResponse) -> None:
        """Whatever ends the request's task (a hang-up before the first byte was sent, an error in the server), the
        slot is released and the engine request closed: nothing relies on the relay having started."""
        task = asyncio.current_task()
        if task is None:
            return

        def settle(_: asyncio.Task[Any]) -> None:
            if plan.detached:
                return  # a shared generation outlives its leader's task: its pump ends it
            if not plan.done:
                self.fail(plan, status=499, reason="client_disconnected",
                          detail="the request ended before its answer was sent")
            if not upstream.is_closed:
                closing = asyncio.ensure_future(upstream.aclose())
                closing.add_done_callback(lambda f: f.cancelled() or f.exception())

        task.add_done_callback(settle)

    async def finish(self, plan: Plan, upstream: EngineResponse) -> bytes:
        """Read a whole (non-stream or error) body, record the outcome, release."""
        try:
            data = await upstream.aread()
        except EngineStreamBroken as e:
            self.fail(plan, status=502, reason="engine_crashed", detail=f"the engine's answer broke: {e}")
            raise Refused(f"the engine's answer broke: {e}", reason="engine_error", http_status=502) from None
        except BaseException:
            self.fail(plan, status=499, reason="client_disconnected", detail="the client closed the connection")
            raise
        finally:
            await upstream.aclose()
        if upstream.status_code >= 400:
            self.fail(plan, status=upstream.status_code, reason="engine_error", detail=refusal(data)[0])
            return data
        self.first_token(plan)
        try:
            usage = usage_from_json(orjson.loads(data))
        except orjson.JSONDecodeError:
            usage = {}
        self.complete(plan, usage, status=upstream.status_code)
        return data

    # -- outcomes -------------------------------------------------------------------------------------------------

    def first_token(self, plan: Plan) -> None:
        plan.first_token_at = time.perf_counter()
        self.emit(RequestFirstToken(trace_id=plan.trace_id, model=plan.name or plan.model,
                                    ttft_ms=round((plan.first_token_at - plan.received) * 1000, 3)),
                  plan.trace_id, plan.actor)

    def complete(self, plan: Plan, usage: dict[str, Any], *, status: int, chunks: int | None = None,
                 shared: str | None = None) -> None:
        if plan.done:
            return
        plan.usage, plan.end_status = usage, status
        self._release(plan, tokens=usage.get("completion_tokens"))
        key_name = plan.principal.key_name if plan.principal is not None else None
        if key_name is not None:  # the key's tpm and daily_tokens count a request's tokens when it completes
            self.limits.add_tokens(key_name, int(usage.get("prompt_tokens") or 0)
                                   + int(usage.get("completion_tokens") or 0))
        self.emit(RequestCompleted(
            trace_id=plan.trace_id, model=plan.name or plan.model,
            instance_id=plan.instance.instance_id if plan.instance else None, status=status,
            duration_ms=round((time.perf_counter() - plan.received) * 1000, 3),
            prompt_tokens=usage.get("prompt_tokens"), completion_tokens=usage.get("completion_tokens"),
            cached_tokens=usage.get("cached_tokens"), engine_timings=usage.get("timings") or {},
            finish_reason=usage.get("finish_reason"), chunks=chunks,
            shared=shared or plan.shared_role),  # type: ignore[arg-type]
            plan.trace_id, plan.actor)

    def fail(self, plan: Plan, *, status: int, reason: str, detail: str, relayed_tokens: int | None = None) -> None:
        """Record how the request failed (once). `relayed_tokens`: what a stream had already sent the client; they
        count against the key's tpm and daily limits as a completed answer's do (a hang-up is no way around them)."""
        if plan.done:
            return
        plan.failed, plan.end_status = True, status
        self._release(plan)
        key_name = plan.principal.key_name if plan.principal is not None else None
        if key_name is not None and relayed_tokens:
            self.limits.add_tokens(key_name, relayed_tokens)
        self.emit(RequestFailed(trace_id=plan.trace_id, model=plan.name or plan.model,
                                instance_id=plan.instance.instance_id if plan.instance else None, status=status,
                                reason=reason, detail=detail[:500],  # type: ignore[arg-type]
                                duration_ms=round((time.perf_counter() - plan.received) * 1000, 3),
                                completion_tokens=relayed_tokens or None),
                  plan.trace_id, plan.actor)

    def _release(self, plan: Plan, *, tokens: int | None = None) -> None:
        plan.done = True
        self.drop_lease(plan)
        if plan.ticket is not None:
            self.admission.release(plan.ticket, tokens=tokens)
            plan.ticket = None
        if plan.held and plan.instance is not None:
            self.supervisor.unhold(plan.instance)
            plan.held = False


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
