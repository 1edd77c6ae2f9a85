"""Single-flight: identical concurrent deterministic requests share one generation.

Identical means the same tenant (a key, or the cache group an admin put keys in: keys are tenants, so a follower
never learns that another key sent the same prompt), the same route, the same client body (model name included)
and a deterministic sampling (`temperature` 0, or an explicit non-negative `seed`), and no session, best-of-N or
cascade, nor a Responses request (each Response has its own id and stored conversation). The first such request
leads: it runs the pipeline as any request does. A second one arriving while it runs follows: it gets the leader's
answer, a stream replayed from its first byte, under its own trace (`request.shared`), and costs the engine nothing.

The leader's stream is relayed by the leader's own task while nobody follows (no extra hop per chunk). When the first
follower joins, the leader hands the engine stream to a task of its own at the next chunk (`converted`), and every
client, the leader's included, reads the buffer from then on. So a follower hanging up never touches the generation,
and the leader hanging up hands it on to the oldest follower (`promoted`: the generation's remaining events go to its
trace); with nobody left, the generation is cancelled. Followers start reading only once the stream is converted
(or whole): if the leader goes away before that, they have received nothing and simply run again.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from blazar.errors import Refused
from blazar.events.requests import RequestShared
from blazar.serving.call import Call, Completed, Failed
from blazar.serving.request import Answer

log = logging.getLogger("blazar.gateway")

SHARED_HEADER = "x-blazar-shared"
RESPONSES = "/v1/responses"

# The pipeline after the caller's checks (`Gateway.generate`): what a leader runs.
Generate = Callable[[Call, "asyncio.Task[None] | None"], Awaitable[Answer]]


def deterministic(body: dict[str, Any]) -> bool:
    """Sampling that gives the same answer every time: temperature 0, or an explicit seed."""
    t, seed = body.get("temperature"), body.get("seed")
    if isinstance(t, int | float) and not isinstance(t, bool) and t == 0:
        return True
    return isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0


def flight_key(call: Call) -> str | None:
    """What makes requests identical (a hash), or None when this one may not share."""
    r = call.request
    if r.audio is not None:
        return None  # an upload's bytes are not in its parsed fields; speech is made by its own exchange
    if r.embeddings or r.session is not None or (r.best_of or 1) > 1 or r.cascade \
            or not deterministic(call.ask.engine_body()):
        return None
    if r.path == RESPONSES:
        return None  # every Response is its own (its id, and with `store` its conversation): none is another's copy
    try:
        canon = orjson.dumps([r.tenant, r.path, call.name, r.parsed], option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return None
    return hashlib.sha256(canon).hexdigest()[:16]


@dataclass(eq=False)
class _Member:
    call: Call
    promoted: bool = False


@dataclass(eq=False)
class Flight:
    key: str
    owner: Call  # the generation's: the leader's, or the promoted follower's once the leader is gone
    leader_trace_id: str
    chunks: list[bytes] = field(default_factory=list)
    answer: Answer | None = None  # the leader's (a whole one: its body; a stream: status and headers)
    error: BaseException | None = None  # why the pipeline gave no answer
    restart: bool = False  # the leader went away before followers got anything: they run again
    ended: bool = False  # no more chunks will come
    members: list[_Member] = field(default_factory=list)  # followers still reading, oldest first
    leader_reading: bool = True
    want_pump: bool = False
    leader_marked: bool = False  # the leader's `request.shared` is recorded (once, at the first follower)
    pump: asyncio.Task[None] | None = None
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def ready(self) -> bool:
        """Followers may read: the answer is whole, or the stream is converted, or it ended, or it failed."""
        return (self.error is not None or self.restart or self.ended
                or (self.answer is not None and (self.answer.stream is None or self.pump is not None)))

    def notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def changed(self) -> None:
        await self._changed.wait()

    async def wait_ready(self) -> None:
        while not self.ready:
            await self.changed()

    async def replay(self, start: int) -> AsyncIterator[bytes]:
        i = start
        while True:
            while i < len(self.chunks):
                chunk = self.chunks[i]
                i += 1
                yield chunk
            if self.ended:
                return
            await self.changed()


class Flights:
    def __init__(self, generate: Generate) -> None:
        self._generate = generate
        self._open: dict[str, Flight] = {}

    def __len__(self) -> int:
        return len(self._open)

    async def serve(self, key: str, call: Call, watcher: asyncio.Task[None] | None) -> Answer:
        """The answer for `call`: its own generation (it leads), or the one in flight (it follows). Raises what the
        generation raised; the caller ends the call from it."""
        while True:
            flight = self._open.get(key)
            if flight is None:
                return await self._lead(key, call, watcher)
            answer = await self._follow(flight, call, watcher)
            if answer is not None:
                return answer
            # The leader went away before anything was shared: run again (lead, or follow a newer flight).

    # -- the leader ---------------------------------------------------------------------------------------------

    async def _lead(self, key: str, call: Call, watcher: asyncio.Task[None] | None) -> Answer:
        flight = Flight(key=key, owner=call, leader_trace_id=call.trace_id)
        self._open[key] = flight
        try:
            answer = await self._generate(call, watcher)
        except asyncio.CancelledError:
            self._close(flight, restart=True)
            raise
        except BaseException as e:
            flight.error = e
            self._close(flight)
            raise
        answer.headers[SHARED_HEADER] = "leader"
        flight.answer = answer
        if answer.stream is None:
            self._close(flight)
            return answer
        answer.stream = self._lead_stream(flight, answer.stream)
        flight.notify()
        return answer

    async def _lead_stream(self, flight: Flight, inner: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """Relay `inner` in the leader's task while nobody follows; once someone does, hand it to a pump task and
        read the buffer like everyone else."""
        sent = 0
        try:
            while flight.pump is None:
                if flight.want_pump:
                    flight.owner.detach()  # the leader's task ending no longer ends the generation
                    flight.pump = asyncio.create_task(self._pump(flight, inner), name="blazar-flight")
                    flight.notify()
                    break
                try:
                    chunk = await inner.__anext__()
                except StopAsyncIteration:
                    self._close(flight)
                    return
                flight.chunks.append(chunk)
                sent += 1
                yield chunk
            async for chunk in flight.replay(sent):
                yield chunk
        finally:
            if flight.pump is None:
                if not flight.ended:  # the leader's client went away first: the generation is closed with it
                    close = getattr(inner, "aclose", None)
                    if close is not None:
                        await close()
                    self._close(flight, restart=not flight.ended)
            else:
                flight.leader_reading = False
                if not flight.ended:
                    self._hand_on(flight)

    async def _pump(self, flight: Flight, inner: AsyncIterator[bytes]) -> None:
        try:
            async for chunk in inner:
                flight.chunks.append(chunk)
                flight.notify()
        except asyncio.CancelledError:
            pass  # nobody is left to read it: the relay recorded the end and closed the engine's stream
        except Exception:
            log.exception("single-flight pump for %s", flight.owner.trace_id)
        finally:
            self._close(flight)

    def _hand_on(self, flight: Flight) -> None:
        """The generation's owner went away mid-stream: the oldest follower takes it on, or, with nobody left, the
        generation is cancelled (the relay records that)."""
        if not flight.members:
            if flight.pump is not None and not flight.pump.done():
                flight.pump.cancel()
            return
        heir = flight.members.pop(0)
        # NOTE: the heir's call takes the generation on: every end the relay records from here on (the completion,
        # its usage) is the heir's, whose trace then ends with exactly one terminal event.
        flight.owner.hand_over(heir.call, f"the client went away; its generation goes on for {heir.call.trace_id} "
                                          "(single-flight)")
        flight.owner = heir.call
        heir.promoted = True
        heir.call.emit(RequestShared(trace_id=heir.call.trace_id, model=heir.call.name or heir.call.model,
                                     role="promoted", leader_trace_id=flight.leader_trace_id, flight=flight.key,
                                     joined_at_chunk=len(flight.chunks)))
        flight.members.insert(0, heir)  # it goes on reading; at the end it records nothing more of its own

    def _close(self, flight: Flight, *, restart: bool = False) -> None:
        # NOTE: a restart is only ever decided before followers read anything (they wait for `ready`).
        flight.restart = flight.restart or restart
        flight.ended = True
        if self._open.get(flight.key) is flight:
            del self._open[flight.key]
        flight.notify()

    # -- followers ----------------------------------------------------------------------------------------------

    async def _follow(self, flight: Flight, call: Call, watcher: asyncio.Task[None] | None) -> Answer | None:
        """The leader's answer for `call`; None when it must run again (the leader went away before sharing)."""
        if not flight.leader_marked:  # the first follower: the leader's generation is shared from now on
            flight.leader_marked = True
            gen = flight.owner
            gen.shared_as("leader")
            gen.emit(RequestShared(trace_id=gen.trace_id, model=gen.name or gen.model, role="leader",
                                   leader_trace_id=flight.leader_trace_id, flight=flight.key))
        member = _Member(call)
        flight.members.append(member)
        flight.want_pump = True
        call.emit(RequestShared(trace_id=call.trace_id, model=call.name or call.model, role="follower",
                                leader_trace_id=flight.leader_trace_id, flight=flight.key,
                                joined_at_chunk=len(flight.chunks)))
        try:
            await flight.wait_ready()
        except asyncio.CancelledError:
            self._leave(flight, member)
            call.finish(Failed(499, "client_disconnected",
                               "the client closed the connection while the shared generation was prepared"))
            raise
        if flight.restart:
            flight.members.remove(member)
            return None
        if flight.answer is None:
            flight.members.remove(member)
            raise _mirror(flight.error)
        call.take_route(call.route.to(flight.owner.instance))  # its own model, on the generation's instance
        answer = flight.answer
        headers = {**answer.headers, SHARED_HEADER: "follower"}
        if answer.stream is None:
            flight.members.remove(member)
            if watcher is not None:
                watcher.cancel()
            _record_end(flight, call)
            return Answer(status=answer.status, content_type=answer.content_type, data=answer.data,
                          media=answer.media, refused=answer.refused, refusal=answer.refusal, headers=headers)
        return Answer(status=answer.status, content_type=answer.content_type, headers=headers,
                      stream=self._follow_stream(flight, member, watcher))

    async def _follow_stream(self, flight: Flight, member: _Member,
                             watcher: asyncio.Task[None] | None) -> AsyncIterator[bytes]:
        finished = False
        try:
            async for chunk in flight.replay(0):
                yield chunk
            finished = True
        finally:
            if watcher is not None:
                watcher.cancel()
            self._leave(flight, member)
            if finished and not member.promoted:
                _record_end(flight, member.call)
            elif not finished and not member.promoted:
                member.call.finish(Failed(499, "client_disconnected",
                                          "the client closed the connection (the shared generation goes on)"))

    def _leave(self, flight: Flight, member: _Member) -> None:
        if member in flight.members:
            flight.members.remove(member)
        if member.promoted and not flight.ended:
            self._hand_on(flight)  # the generation's owner again: the next follower takes it on


def _record_end(flight: Flight, call: Call) -> None:
    """A follower's outcome: the generation's, with its usage (counted as shared, not generated again)."""
    end = flight.owner.final()
    if isinstance(end, Completed) and end.status < 400:
        call.finish(Completed(end.status, end.usage, chunks=len(flight.chunks) or None, shared="follower"))
    else:
        call.finish(Failed(end.status if end is not None else 502, "engine_error",
                           "the shared generation did not complete"))


def _mirror(error: BaseException | None) -> BaseException:
    """The leader's refusal, raised for a follower too (it would have met the same; the follower's call ends from it
    as the leader's did)."""
    if isinstance(error, Refused):
        return Refused(error.message, reason=error.reason, http_status=error.http_status,
                       retry_after_s=error.retry_after_s, observations=error.observations, public=error.public)
    return Refused(f"the shared generation broke: {error!r}", reason="internal_error", http_status=500)
