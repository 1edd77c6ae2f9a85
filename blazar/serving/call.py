"""One request's way through the pipeline: a `Call` owns everything the request holds (the key's concurrency lease,
an admission ticket, a hold on its instance) and ends it in one place, `finish(outcome)`: the request's one terminal
event (`request.completed`, `request.failed` or `request.rejected`) recorded and everything given back. `finish` is
idempotent, so any path may call it (the pipeline's `except`, a relay's end, a task's done-callback): the first
outcome is the request's.

    Request (immutable, blazar/serving/request.py) --Gateway.serve--> Call --finish(outcome)--> one terminal event

What changes on the way is the Call's, in two values it holds: its `Route` (blazar/serving/route.py: the step's model
and where it runs, as resolving and routing decided), and what its engine is asked (`call.ask`,
blazar/serving/engine_ask.py), which `Patch`es change (blazar/serving/patch.py: a model's settings and LoRA adapters,
applied by `use_model`; a template's defaults, a slot's placement). A single-flight generation whose client went away
is handed over to a follower's Call (`hand_over`): from then on its holdings and its end are the follower's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from blazar.errors import BlazarError, Refused
from blazar.events.audio import RequestAudio
from blazar.events.base import Event
from blazar.events.requests import (
    FailReason,
    ReasoningFacts,
    RejectReason,
    RequestCompleted,
    RequestEnergy,
    RequestFailed,
    RequestFirstToken,
    RequestRejected,
    SharedRole,
    is_fail_reason,
    is_reject_reason,
)
from blazar.instances.live import Instance
from blazar.serving.admission import Ticket
from blazar.serving.energy import Span
from blazar.serving.engine_ask import EngineAsk
from blazar.serving.limits import Lease
from blazar.serving.lora import lora_patch
from blazar.serving.model_defaults import settings_patch
from blazar.serving.request import AudioAsked, Request
from blazar.serving.route import Route

if TYPE_CHECKING:
    from blazar.adapters.engines.client import Upstream


# -- outcomes ----------------------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Completed:
    status: int
    usage: dict[str, Any]
    chunks: int | None = None
    shared: SharedRole | None = None


@dataclass(frozen=True, slots=True)
class Failed:
    status: int
    reason: FailReason
    detail: str
    relayed_tokens: int | None = None  # what a stream had sent before it ended: charged as a completion's tokens
    relayed_audio_s: float | None = None  # ... and the speech it had made (a realtime response's): charged as audio


@dataclass(frozen=True, slots=True)
class Rejected:
    status: int
    reason: RejectReason
    detail: str
    retry_after_s: float | None = None
    observations: dict[str, Any] = field(default_factory=dict)


Outcome = Completed | Failed | Rejected


def outcome_of(exc: BaseException, call: Call) -> Outcome:
    """How a request that raised `exc` ended: a refusal by its reason (an error code that is no request reason, e.g. a
    load's `engine_exited`, is a `load_failed` refusal with the code kept), the client's hang-up, or a bug of ours."""
    if isinstance(exc, Refused):
        if is_reject_reason(exc.reason):
            return Rejected(exc.http_status, exc.reason, exc.message, exc.retry_after_s, exc.observations)
        if is_fail_reason(exc.reason):
            return Failed(exc.http_status, exc.reason, exc.message)
        return Rejected(exc.http_status, "load_failed", exc.message, exc.retry_after_s,
                        {**exc.observations, "code": exc.reason})
    if isinstance(exc, BlazarError) and 400 <= exc.http_status < 500:
        # The content, checked in the pipeline (an image that is no image, audio past max_audio_s): the caller's
        return Rejected(exc.http_status, "invalid_request", exc.message, None, {"code": exc.code})
    if isinstance(exc, asyncio.CancelledError):
        return Failed(499, "client_disconnected", call.hang_up_detail())
    return Failed(500, "internal_error", f"{type(exc).__name__}: {exc}")


# -- what a call gives back to -----------------------------------------------------------------------------------------

class Desk(Protocol):
    """What a Call records to and gives back to: the gateway's writer, admission, supervisor and key limits."""

    def emit(self, event: Event, trace_id: str, actor: str | None = None) -> None: ...
    def release_slot(self, ticket: Ticket, *, tokens: int | None = None, charged: int | None = None) -> None: ...
    def give_back_slot(self, ticket: Ticket) -> None: ...
    def unhold(self, instance: Instance) -> None: ...
    def release_lease(self, lease: Lease) -> None: ...
    def charge(self, key_name: str, tokens: int) -> None: ...
    def charge_audio(self, key_name: str, seconds: float) -> None: ...
    def turn_done(self, call: Call, done: Completed) -> None: ...


class Call:
    """A request on its way: see the module's docstring."""

    def __init__(self, request: Request, desk: Desk) -> None:
        self.request = request
        self._desk = desk
        self.ask = EngineAsk(request)  # what the engine is asked: a cascade's step starts it afresh (`retarget`)
        # -- its way (the gateway's decisions)
        self._route: Route | None = None  # once resolved
        self.queue_position = 0
        self.first_token_at: float | None = None
        self.rerouted = False  # routed again once already: its first instance was gone before it took the request
        self.shared_role: SharedRole | None = None
        # -- what it holds, given back by `finish` (or by the step's own end)
        self._lease: Lease | None = None
        self._ticket: Ticket | None = None
        self._held: Instance | None = None
        self._guard: tuple[asyncio.Task[Any], Callable[[asyncio.Task[Any]], None]] | None = None
        self.energy: Span | None = None  # its span in the energy ledger, from its arrival (ended by `finish`)
        # -- a speech request's audio (blazar/events/audio.py): its seconds once known, when its engine got it
        self.audio_seconds: float | None = request.audio.audio_seconds if request.audio is not None else None
        self.engine_at: float | None = None
        # -- how it ended
        self.outcome: Outcome | None = None
        self._heir: Call | None = None  # a single-flight generation handed over: its end is the heir's

    # -- what it is ----------------------------------------------------------------------------------------------------

    @property
    def trace_id(self) -> str:
        return self.request.trace_id

    @property
    def received(self) -> float:
        return self.request.received

    @property
    def route(self) -> Route:
        """Where the step runs: resolved before anything reads it (blazar/serving/checks.py)."""
        assert self._route is not None, "the call's model is resolved first"
        return self._route

    @property
    def model(self) -> str:
        """The client's name for the step's model (the first a cascade asks for, until it is resolved)."""
        if self._route is not None:
            return self._route.model
        return self.request.cascade[0] if self.request.cascade else self.request.model

    @property
    def name(self) -> str | None:
        """The store's name, once resolved."""
        return self._route.name if self._route is not None else None

    @property
    def load_ms(self) -> float | None:
        """The cold load the step waited for, if any (what Ollama's replies read: blazar/dialects/ollama.py)."""
        return self._route.load_ms if self._route is not None else None

    @property
    def instance(self) -> Instance | None:
        """The instance the step was routed to, if it was."""
        return self._route.instance if self._route is not None else None

    @property
    def ticket(self) -> Ticket | None:
        return self._ticket

    @property
    def ended(self) -> bool:
        return self._last().outcome is not None

    def emit(self, event: Event) -> None:
        self._desk.emit(event, self.trace_id, self.request.actor)

    def deadline_left_s(self) -> float | None:
        """Seconds left until the deadline (negative once passed); None without one."""
        if self.request.deadline_ms is None:
            return None
        return self.request.deadline_ms / 1000.0 - (time.perf_counter() - self.received)

    def hang_up_detail(self) -> str:
        """What the request was waiting for when its client went away."""
        if self.instance is None:
            return "the client closed the connection while the request waited for the model to load"
        if self._ticket is None:
            return "the client closed the connection while the request waited for a slot"
        return "the client closed the connection"

    def prepared(self, request: Request) -> None:
        """The request once its content was checked (its media's facts, a body rewritten to what the engine gets):
        before anything changed the body, so the call's is the new request's."""
        assert not self.ask.changed, "the content is checked before the body changes"
        self.request, self.ask = request, EngineAsk(request)
        if request.audio is not None:
            self.audio_seconds = request.audio.audio_seconds

    def use_model(self) -> None:
        """What the resolved model brings to the request: its settings (blazar/serving/model_defaults.py), then its
        LoRA adapters (blazar/serving/lora.py), which read the body the settings left."""
        resolved = self.route.resolved
        if resolved.settings is not None:
            self.ask.apply(settings_patch(self.request, self.ask.engine_body(), resolved.settings))
        self.ask.apply(lora_patch(self.request, self.ask.engine_body(), resolved))

    def take_route(self, route: Route) -> None:
        """Where the step runs now: resolved, routed to an instance, or (None as its instance) routed again."""
        self._route = route

    def retarget(self, route: Route) -> None:
        """A cascade's next step: the request as the client sent it, on `route` (its model's settings applied), its
        previous step's way there forgotten."""
        self.ask, self._route = EngineAsk(self.request), route
        self.use_model()

    def unroute(self, forget: tuple[str, ...]) -> None:
        """Routed again: its slot (no hold time learnt from it) and hold given back, the engine fields its placement
        set (`forget`) and any cap its context put on the output forgotten, its route without an instance."""
        self.give_back_slot(learn=False)
        self.ask.drop_fields(*forget)
        self.ask.unbound()
        self._route = self.route.to(None)
        self.queue_position, self.rerouted = 0, True

    def queued(self, position: int) -> None:
        self.queue_position = position

    def shared_as(self, role: SharedRole) -> None:
        """Its generation is shared (single-flight): as the leader, or taken on by a follower."""
        self.shared_role = role

    def engine_asked(self) -> None:
        """The engine got the request now: a speech request's processing time starts here."""
        self.engine_at = time.perf_counter()

    def audio_measured(self, seconds: float) -> None:
        """The audio's length as its engine measured it (the whisper child's, or the speech made)."""
        self.audio_seconds = seconds

    # -- what it holds -------------------------------------------------------------------------------------------------

    def take_lease(self, lease: Lease) -> None:
        self._lease = lease

    def admitted(self, ticket: Ticket) -> None:
        self._ticket = ticket

    def holding(self, instance: Instance) -> None:
        """The instance is held against eviction for this call (given back with its slot)."""
        self._held = instance

    def give_back_slot(self, *, learn: bool = True, tokens: int | None = None, charged: int | None = None) -> None:
        """The slot and the hold on the instance go back; the request goes on (a cascade's step is over, or a
        request is routed again: then `learn=False`, no hold time is learnt from a slot that served nothing).
        `tokens` generated, `charged` the prompt's and those (its tenant's share pays them)."""
        if self._ticket is not None:
            if learn:
                self._desk.release_slot(self._ticket, tokens=tokens, charged=charged)
            else:
                self._desk.give_back_slot(self._ticket)
            self._ticket = None
        if self._held is not None:
            self._desk.unhold(self._held)
            self._held = None

    def release_lease(self) -> None:
        if self._lease is not None:
            self._desk.release_lease(self._lease)
            self._lease = None

    # -- the task it runs in -------------------------------------------------------------------------------------------

    def guard(self, upstream: Upstream) -> None:
        """Whatever ends the current task (a hang-up before the first byte was sent, an error in the server), the
        call ends and the engine's request is closed: nothing relies on the relay having started."""
        task = asyncio.current_task()
        if task is None:
            return

        def settle(_: asyncio.Task[Any]) -> None:
            self.finish(Failed(499, "client_disconnected", "the request ended before its answer was sent"))
            if not upstream.is_closed:
                closing = asyncio.ensure_future(upstream.aclose())
                closing.add_done_callback(lambda f: f.cancelled() or f.exception())

        task.add_done_callback(settle)
        self._guard = (task, settle)

    def detach(self) -> None:
        """The generation now runs on its own (a single-flight pump): the task that started it ending ends nothing."""
        if self._guard is not None:
            task, settle = self._guard
            task.remove_done_callback(settle)
            self._guard = None

    # -- how it ends ---------------------------------------------------------------------------------------------------

    def _last(self) -> Call:
        call = self
        while call._heir is not None:
            call = call._heir
        return call

    def first_token(self) -> None:
        """The first token reached the client (once)."""
        call = self._last()
        if call.first_token_at is not None:
            return
        call.first_token_at = time.perf_counter()
        call.emit(RequestFirstToken(trace_id=call.trace_id, model=call.name or call.model,
                                    ttft_ms=round((call.first_token_at - call.received) * 1000, 3)))

    def finish(self, outcome: Outcome) -> None:
        """End the request: its one terminal event, everything it holds given back, the key charged for the tokens
        it got. A second call is a no-op; a generation handed over ends as its heir's."""
        call = self._last()
        if call.outcome is not None:
            return
        call.outcome = outcome
        tokens = None
        if isinstance(outcome, Completed):
            tokens = outcome.usage.get("completion_tokens")
            charged = int(outcome.usage.get("prompt_tokens") or 0) + int(tokens or 0)
        else:
            charged = (outcome.relayed_tokens or 0) if isinstance(outcome, Failed) else 0
        call.release_lease()
        if isinstance(outcome, Completed):
            call._desk.turn_done(call, outcome)  # while its slot is still the call's: the prefix cache compared
        call.give_back_slot(tokens=tokens, charged=charged)
        if call.request.key_name is not None and charged:
            call._desk.charge(call.request.key_name, charged)  # tpm and daily_tokens: a hang-up is no way around them
        if isinstance(outcome, Failed) and outcome.relayed_audio_s is not None:
            call.audio_measured(outcome.relayed_audio_s)
        if call.request.audio is not None and (isinstance(outcome, Completed) or (
                isinstance(outcome, Failed) and outcome.relayed_audio_s is not None)):
            audio = _audio_event(call, call.request.audio)
            if call.request.key_name is not None:
                call._desk.charge_audio(call.request.key_name, audio.audio_seconds)  # daily_audio_s
            call.emit(audio)
        energy = call.energy.end(tokens) if call.energy is not None else None
        call.emit(_terminal_event(call, outcome, energy))

    def hand_over(self, heir: Call, detail: str) -> None:
        """Single-flight: this call's client went away mid-stream and `heir` (a follower) takes the generation on:
        its slot, its hold and its instance become the heir's, this call ends (its lease given back), and whatever
        ends the generation from now on ends the heir's call."""
        owner = self._last()
        heir._ticket, heir._held, owner._ticket, owner._held = owner._ticket, owner._held, None, None
        heir._route = owner.route.to(owner.instance)  # the owner's model and instance; no load waited for
        heir.first_token_at, heir.shared_role = owner.first_token_at, "promoted"
        owner.finish(Failed(499, "client_disconnected", detail))
        owner._heir = heir

    def final(self) -> Outcome | None:
        """How the generation this call started ended, whoever's call it ended as."""
        return self._last().outcome


# -- the events a call ends with ------------------------------------------------------------------------------------

def _audio_event(call: Call, asked: AudioAsked) -> RequestAudio:
    """What the request's audio was and how fast it was made (before the terminal event: `why` reads both)."""
    started = call.engine_at if call.engine_at is not None else call.received
    processing_ms = round((time.perf_counter() - started) * 1000, 3)
    seconds = round(call.audio_seconds or 0.0, 3)
    resolved = call.route.resolved if call.name is not None else None
    kind = getattr(call.instance, "kind", None) or getattr(resolved, "kind", None) or "unknown"
    return RequestAudio(trace_id=call.trace_id, model=call.name or call.model, kind=str(kind),
                        route=asked.route, audio_seconds=seconds,
                        response_format=asked.response_format, processing_ms=processing_ms,
                        real_time_factor=round(processing_ms / 1000 / seconds, 4) if seconds > 0 else None,
                        input_bytes=asked.input_bytes, input_chars=asked.input_chars, language=asked.language,
                        voice=asked.voice, streamed=call.request.stream)

def _reasoning(call: Call, usage: dict[str, Any]) -> ReasoningFacts | None:
    """How the answer's thinking was bounded, with the thinking tokens a stream carried (the relay counts them)."""
    facts = call.ask.reasoning
    counted = usage.get("reasoning_tokens")
    if facts is None or not isinstance(counted, int):
        return facts
    return facts.model_copy(update={"reasoning_tokens": counted})


def _terminal_event(call: Call, outcome: Outcome, energy: RequestEnergy | None) -> Event:
    """The request's one terminal event, from what the call knows at its end."""
    model = call.name or call.model
    duration_ms = round((time.perf_counter() - call.received) * 1000, 3)
    instance_id = call.instance.instance_id if call.instance else None
    if isinstance(outcome, Completed):
        u = outcome.usage
        return RequestCompleted(
            trace_id=call.trace_id, model=model, instance_id=instance_id, status=outcome.status,
            duration_ms=duration_ms, prompt_tokens=u.get("prompt_tokens"),
            completion_tokens=u.get("completion_tokens"), cached_tokens=u.get("cached_tokens"),
            engine_timings=u.get("timings") or {}, finish_reason=u.get("finish_reason"), chunks=outcome.chunks,
            shared=outcome.shared or call.shared_role,
            forced_call=call.request.forced.outcome if call.request.forced is not None else None,
            reasoning=_reasoning(call, u), energy=energy)
    if isinstance(outcome, Failed):
        return RequestFailed(trace_id=call.trace_id, model=model, instance_id=instance_id,
                             status=outcome.status, reason=outcome.reason, detail=outcome.detail[:500],
                             duration_ms=duration_ms, completion_tokens=outcome.relayed_tokens or None)
    return RequestRejected(trace_id=call.trace_id, model=model, status=outcome.status, reason=outcome.reason,
                           detail=outcome.detail, retry_after_s=outcome.retry_after_s,
                           observations=outcome.observations, duration_ms=duration_ms)
