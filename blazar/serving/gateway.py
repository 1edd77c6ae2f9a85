"""The request pipeline every dialect shares. A route parses its dialect into a `Request` (blazar/serving/request.py)
and calls `serve(request)`, which opens the request's `Call` (blazar/serving/call.py) and returns the `Answer` to
send: a relayed stream (blazar/serving/relay.py) or one body.

    received -> resolved (resolve.py: the model, as the call's Route; the key's scope and limits; the model's settings)
             -> routed and admitted (blazar/serving/routing.py: an instance, loading on demand, or another node's;
                admit.py: a slot)
             -> streamed or read whole (the engine's answer; single-flight and fan-out share or multiply it)
             -> finished (`Call.finish`: the one terminal event, everything the request held given back)

Every step is recorded through the group-commit writer (never awaited on the token path). Whatever raises ends the
call here, in `serve`, by what it raised; an answer still streaming ends when its relay does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import orjson

from blazar.adapters.engines.answers import refusal, usage_from_json
from blazar.adapters.engines.client import EngineClient, Upstream
from blazar.cluster.nodes import cluster_key
from blazar.cluster.remotes import RemoteBreaker
from blazar.context import Blazar
from blazar.dialects.tools import ForcedStream, OpenAIStream
from blazar.errors import EngineError, EngineGone, EngineStreamBroken, ModelNotFound, Refused
from blazar.events.requests import RequestReceived
from blazar.instances.kv_bank import KvBank
from blazar.projections.metrics import audio_seconds_on, tokens_on
from blazar.serving import fanout, relay
from blazar.serving.admission import Admission
from blazar.serving.admit import Admitter
from blazar.serving.cache_step import ResponseCache
from blazar.serving.call import Call, Completed, Failed, outcome_of
from blazar.serving.checks import Checks, body_bytes, refuse_scope
from blazar.serving.context_fit import BOUNDED_HEADER
from blazar.serving.desk import GatewayDesk
from blazar.serving.energy import EnergyLedger
from blazar.serving.flights import Flights, flight_key
from blazar.serving.forwarding import Forwarder
from blazar.serving.limits import Limiter
from blazar.serving.loop_guard import LoopGuard
from blazar.serving.ports import SupervisorPort
from blazar.serving.prefix_watch import PrefixWatch
from blazar.serving.principal import Principal
from blazar.serving.request import Answer, Request
from blazar.serving.resolve import Resolver
from blazar.serving.routing import Router
from blazar.serving.slots_governor import SlotsGovernor
from blazar.serving.spec_governor import SpecGovernor
from blazar.serving.swaps import SwapOrder

log = logging.getLogger("blazar.gateway")

SSE = "text/event-stream"
AUDIO_SECONDS_HEADER = "x-audio-seconds"
AUDIO_LANGUAGE_HEADER = "x-audio-language"  # the language a whisper child heard (blazar/children/whisper.py)


class Gateway:
    def __init__(self, app: Blazar, supervisor: SupervisorPort, admission: Admission, client: EngineClient,
                 kv: KvBank | None = None, energy: EnergyLedger | None = None) -> None:
        self.app = app
        self.energy = energy if energy is not None else EnergyLedger()  # requests' energy: none measured by default
        self.supervisor = supervisor
        self.admission = admission
        self.client = client
        self.kv = kv if kv is not None else KvBank(app, client)  # sessions' slots, and the bank that saves them
        self.flights = Flights(self.generate)  # identical deterministic requests in flight
        self.prefixes = PrefixWatch()  # each conversation's last prompt: why a turn's prefix cache missed
        self.cache = ResponseCache(app)  # deterministic requests' answers, kept (opt-in)
        self.remotes = RemoteBreaker(app)  # remote engines' circuits
        self.limits = Limiter(app.clock, seed=self._tokens_today, audio_seed=self._audio_today)
        self.spec = SpecGovernor(app, supervisor, admission, client)  # its task: Services.start
        self.slots = SlotsGovernor(app, supervisor, admission)  # adaptive slots; its task: Services.start
        forwarder = Forwarder(app, cluster_key(app.env) if app.node else None)  # other nodes: with the cluster key
        self.resolver = Resolver(app, supervisor, forwarder)
        self.admitter = Admitter(app, supervisor, admission, self.kv, self.limits, spec=self.spec)
        # A load that needs busy models' room waits for them in order; their requests may be served ahead of it.
        self.swaps = SwapOrder(supervisor, admission, lambda: app.settings().queue, app.clock.monotonic)
        self.router = Router(app, supervisor, client, forwarder, self.admitter, self.swaps)
        self.checks = Checks(app, self.resolver, self.limits)
        self.desk = GatewayDesk(app, admission, supervisor, self.limits, self.swaps, self.prefixes)

    def _tokens_today(self, key_name: str, day: int) -> int:
        """What the log says a key used on UTC day `day` (a restarted daemon keeps counting the daily limit)."""
        return tokens_on(self.app.runner.state("metrics"), key_name, day)

    def _audio_today(self, key_name: str, day: int) -> float:
        """The seconds of audio the log says a key used on UTC day `day` (the daily_audio_s limit)."""
        return audio_seconds_on(self.app.runner.state("metrics"), key_name, day)

    # -- the pipeline --------------------------------------------------------------------------------------------------

    async def serve(self, request: Request, watcher: asyncio.Task[None] | None = None) -> Answer:
        """The Answer for `request`: a streamed one relays as it comes, any other is read whole. Raises Refused for
        a refusal (recorded). `watcher`, the task that notices the client hanging up, is stopped once the answer is
        over. A cached answer is played back (cache_step.py), an identical request in flight joined (flights.py)."""
        call = Call(request, self.desk)
        call.energy = self.energy.begin()
        self._received(call)
        try:
            self.checks.caller(call)  # the one order: blazar/serving/checks.py
            await self.checks.content(call)
            call.use_model()
            if request.cascade or (request.best_of or 1) > 1:
                return await fanout.serve(self, call, watcher, scope=self.resolver, steps=self.router,
                                          extras=self.admitter)
            return await self.cache.serve(call, watcher, self)
        except BaseException as e:
            # NOTE: every request.received ends with exactly one terminal event: whatever broke or refused the
            # request before its answer ends the call here (a call already ended keeps its outcome).
            call.finish(outcome_of(e, call))
            raise

    async def run(self, call: Call, watcher: asyncio.Task[None] | None) -> Answer:
        """The way past the cache: an identical request in flight joined, else its own generation."""
        key = flight_key(call)
        return await (self.flights.serve(key, call, watcher) if key is not None else self.generate(call, watcher))

    async def generate(self, call: Call, watcher: asyncio.Task[None] | None) -> Answer:
        """The pipeline after the caller's checks: route, admit, ask the engine, and the Answer. A request whose
        engine child turned out gone before it took the request is routed again, once (`EngineGone`)."""
        while True:  # twice at most: EngineGone is raised only while the request was not routed again
            try:
                await self.router.route(call)
                if call.request.hooks.produce is not None:  # the route's own exchange with the instance (speech)
                    if watcher is not None:
                        watcher.cancel()
                    call.engine_asked()
                    return await call.request.hooks.produce(call)
                upstream = await self._open_upstream(call)
                break
            except EngineGone as gone:
                self.router.reroute(call, gone.message)
        return await self.answer(call, upstream, watcher, {})

    async def answer(self, call: Call, upstream: Upstream, watcher: asyncio.Task[None] | None,
                     headers: dict[str, str]) -> Answer:
        """The engine's answer (or the cache's, played back) as the client gets it: relayed, or read whole."""
        call.guard(upstream)
        if call.queue_position:
            headers["x-blazar-queue-position"] = str(call.queue_position)
        headers.update(call.ask.headers())  # its output's bound, a thinking budget it could not have
        if call.request.audio is not None and call.audio_seconds is not None:  # the child's measure, passed on
            headers[AUDIO_SECONDS_HEADER] = f"{call.audio_seconds:.3f}"
        heard_in = upstream.headers.get(AUDIO_LANGUAGE_HEADER) if call.request.audio is not None else None
        if heard_in is not None and heard_in.isalpha() and len(heard_in) <= 8:  # the child's, checked: a header
            headers[AUDIO_LANGUAGE_HEADER] = heard_in
        if call.request.stream and upstream.status_code == 200:
            return self._streamed(call, upstream, watcher, headers)
        try:
            data = await self._read_whole(call, upstream)
        finally:
            if watcher is not None:
                watcher.cancel()
        if upstream.status_code >= 400:
            return Answer(status=upstream.status_code, refused=data, refusal=refusal(data), headers=headers)
        if call.request.hooks.reply is None and call.request.forced is None:
            rename = relay.renamer(call)
            return Answer(status=upstream.status_code, data=rename.whole(data) if rename else data,
                          content_type=upstream.headers.get("content-type", "application/json"), headers=headers)
        return self.whole_answer(call, orjson.loads(data), status=upstream.status_code, headers=headers)

    # -- before the engine ---------------------------------------------------------------------------------------------

    def _received(self, call: Call) -> None:
        r = call.request
        call.emit(RequestReceived(trace_id=r.trace_id, dialect=r.dialect, route=r.path, model=r.model,
                                  stream=r.stream, body_bytes=body_bytes(call), priority=r.priority,
                                  max_tokens=r.max_tokens, client=r.client, client_trace_id=r.client_trace_id,
                                  parent_trace_id=r.parent_trace_id, parent_span_id=r.parent_span_id,
                                  session=r.session, deadline_ms=r.deadline_ms, best_of=r.best_of,
                                  cascade=list(r.cascade), forwarded_from=r.forwarded_from, tenant=r.tenant))

    def check_scope(self, principal: Principal | None, model: str) -> None:
        """The scope check alone, for what a dialect answers without the pipeline (Ollama's load or unload)."""
        if principal is None or principal.key is None:
            return
        try:
            name = self.supervisor.resolve(model).name
        except ModelNotFound:
            name = model
        if not principal.allows(model, name):
            refuse_scope(principal, model, name)

    # -- the engine's answer -------------------------------------------------------------------------------------------

    async def _open_upstream(self, call: Call) -> Upstream:
        """Send the request to its instance and return the answer unread. When the connection failed before any
        answer and the instance is a child of ours that is gone (`Supervisor.gone`: exited, or exiting), raises
        EngineGone (nothing recorded: the request is routed again) unless it was routed again already; else the
        call fails with the 502."""
        inst = call.instance
        assert inst is not None
        try:
            sent = dict(inst.headers or {})  # a hop to another node
            if call.request.content_type is not None:  # a multipart upload (speech to text)
                sent["Content-Type"] = call.request.content_type
            extra = {"headers": sent} if sent else {}
            call.engine_asked()
            upstream = await self.client.open(inst.base_url, call.request.engine_path, call.ask.payload(),
                                              api_key=inst.api_key, **extra)
        except EngineError as e:
            if not call.rerouted and not inst.remote and await self.supervisor.gone(inst):
                raise EngineGone(e.message) from None
            call.finish(Failed(502, "engine_error", e.message))
            if call.route.remote is not None:
                await self.remotes.failed(call.route.remote, e.message, source="request")
            raise Refused(e.message, reason="engine_error", http_status=502, public=e.public) from None
        await self._feed_circuit(call, upstream.status_code)
        heard = upstream.headers.get(AUDIO_SECONDS_HEADER)
        if heard is not None:  # the whisper child's measure of the audio it decoded
            with contextlib.suppress(ValueError):
                call.audio_measured(float(heard))
        return self.cache.tap(call, upstream)

    async def _feed_circuit(self, call: Call, status: int) -> None:
        """A remote's answer counts for its circuit: a 5xx as a failure, anything else as a success."""
        name = call.route.remote
        if name is None:
            return
        if status >= 500:
            await self.remotes.failed(name, f"answered {status}", source="request")
        else:
            await self.remotes.succeeded(name)

    async def _read_whole(self, call: Call, upstream: Upstream) -> bytes:
        """Read a whole (non-stream or error) body and end the call with it."""
        try:
            data = await upstream.aread()
        except EngineStreamBroken as e:
            call.finish(Failed(502, "engine_crashed", f"the engine's answer broke: {e}"))
            raise Refused(f"the engine's answer broke: {e}", reason="engine_error", http_status=502) from None
        finally:
            await upstream.aclose()
        if upstream.status_code >= 400:
            call.finish(Failed(upstream.status_code, "engine_error", refusal(data)[0]))
            return data
        call.first_token()
        try:
            answer = orjson.loads(data)
        except orjson.JSONDecodeError:
            answer = None
        if call.request.forced is not None:
            call.request.forced.judge(answer)  # a call made or cut: `request.completed` says which
        call.finish(Completed(upstream.status_code, usage_from_json(answer)))
        return data

    def _streamed(self, call: Call, upstream: Upstream, watcher: asyncio.Task[None] | None,
                  headers: dict[str, str]) -> Answer:
        headers["cache-control"] = "no-cache"
        r = call.request
        inner = r.hooks.stream_as(call) if r.hooks.stream_as is not None else None
        translator = inner if r.forced is None else ForcedStream(r.forced, inner or OpenAIStream(call.model))
        heartbeat_s = self.app.settings().server.stream_heartbeat_s
        guard = LoopGuard() if call.ask.loop_guarded else None
        if translator is None and guard is None:
            return Answer(status=200, content_type=upstream.headers.get("content-type", SSE), headers=headers,
                          stream=relay.passthrough(call, upstream, watcher, heartbeat_s))
        translator = translator or OpenAIStream(call.model)  # the guard reads each event
        return Answer(status=200, content_type=translator.content_type, headers=headers,
                      stream=relay.translated(call, upstream, watcher, translator, heartbeat_s, guard))

    def whole_answer(self, call: Call, answer: Any, *, status: int, headers: dict[str, str]) -> Answer:
        """A whole answer (parsed) as the client gets it: its model named as the client did, a forced tool call made
        a call, the dialect's reply shape."""
        if isinstance(answer, dict) and "model" in answer:
            answer["model"] = call.model  # the client's name for it, not the engine's
        r = call.request
        if r.forced is not None:
            answer = r.forced.answer(answer)
        if call.ask.bounded_max_tokens is not None:  # a fan-out's answer too
            headers.setdefault(BOUNDED_HEADER, str(call.ask.bounded_max_tokens))
        return Answer(status=status, media=r.hooks.reply(answer, call) if r.hooks.reply else answer, headers=headers)

    # -- what a fan-out asks of the pipeline (blazar/serving/fanout.py's Pipeline) -------------------------------------

    def engine_refusal(self, call: Call, status: int, data: bytes) -> Answer:
        """The engine refused (or could not be reached): the call fails with its words, passed on."""
        call.finish(Failed(status, "engine_error", refusal(data)[0]))
        return Answer(status=status, refused=data, refusal=refusal(data))

    async def ask(self, call: Call, body: dict[str, Any]) -> tuple[int, Any, bytes]:
        """One whole answer from the call's instance for `body`, recording nothing: (status, parsed JSON or None,
        bytes). An engine that cannot be reached is a 502 with its words; a remote's answer feeds its circuit."""
        inst = call.instance
        assert inst is not None
        try:
            extra = {"headers": inst.headers} if inst.headers else {}  # a hop to another node
            upstream = await self.client.open(inst.base_url, call.request.engine_path, orjson.dumps(body),
                                              api_key=inst.api_key, **extra)
            try:
                data = await upstream.aread()
            finally:
                await upstream.aclose()
        except EngineError as e:
            status, data = 502, orjson.dumps({"error": {"message": e.message, "type": "engine_error"}})
        else:
            status = upstream.status_code
        await self._feed_circuit(call, status)
        try:
            parsed = orjson.loads(data)
        except orjson.JSONDecodeError:
            parsed = None
        return status, parsed, data

    def cascade_min_logprob(self) -> float:
        return self.app.settings().routing.cascade_min_logprob
