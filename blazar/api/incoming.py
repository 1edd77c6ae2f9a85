"""Request bodies as they arrive, bounded at the ASGI edge (granian -> this -> falcon): a body must keep coming (a
chunk at least every `body_idle_timeout_s`) and be whole within `body_timeout_s`, else 408 and the connection is
closed; at most `max_incoming_bodies` requests receive a body at once, and more are refused at once with 503.

Why here: granian holds one of its `max_connections` permits per connection until the connection closes, and
falcon waits for a request's first body chunk before it routes, with no deadline. Slow bodies would hold every
permit for as long as their senders liked. The wrapper reads the first chunk itself, under the deadlines; when it
does not come, or the request is refused, falcon is handed an empty first chunk and the route's read of the body
raises the refusal, which the app's error handlers render in the route's own dialect.

The deadlines cost no timer per read: one sweeper task looks at the bodies still arriving every `tick_s` and cancels
the wait of any that is too slow (a deadline is met to within a tick).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import falcon

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_CLOSE = {"Connection": "close"}  # the rest of a refused body is never read, so the connection cannot be reused


def body_timed_out(message: str) -> falcon.HTTPError:
    return falcon.HTTPError(falcon.HTTP_408, description=message, headers=_CLOSE)


def too_many_bodies(limit: int) -> falcon.HTTPError:
    return falcon.HTTPError(
        falcon.HTTP_503, headers={**_CLOSE, "Retry-After": "1"},
        description=f"{limit} request bodies are already arriving (server.max_incoming_bodies): try again")


def has_body(scope: Scope) -> bool:
    """A request whose headers announce a body: a Content-Length above 0, or any Transfer-Encoding (chunked)."""
    for name, value in scope.get("headers") or ():
        if name == b"content-length":
            return value.strip() not in (b"0", b"")
        if name == b"transfer-encoding":
            return True
    return False


class IncomingBodies:
    """The ASGI wrapper. `limit` is the most requests receiving a body at once (the daemon keeps it to at most half
    of `max_connections`, so fast requests always find a connection)."""

    def __init__(self, app: ASGIApp, *, idle_s: float, total_s: float, limit: int,
                 clock: Callable[[], float] = time.monotonic, tick_s: float | None = None) -> None:
        self.app, self.idle_s, self.total_s, self.limit, self.clock = app, idle_s, total_s, limit, clock
        self.tick_s = tick_s or max(0.05, min(1.0, idle_s / 4, total_s / 4))
        self.arriving: set[_Channel] = set()  # requests whose body has not fully arrived
        self._sweeper: asyncio.Task[None] | None = None

    @property
    def receiving(self) -> int:
        return len(self.arriving)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not has_body(scope):
            await self.app(scope, receive, send)
            return
        channel = _Channel(self, receive, send)
        try:
            if len(self.arriving) >= self.limit:
                channel.refuse(functools.partial(too_many_bodies, self.limit))  # before a byte of it is read
                channel.first = dict(_EMPTY)
            else:
                self.arriving.add(channel)
                self._sweep_soon()
                channel.first = await channel.next()
            await self.app(scope, channel.receive, channel.send)
        finally:
            channel.close()

    def _sweep_soon(self) -> None:
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep(), name="blazar-body-deadlines")

    async def _sweep(self) -> None:
        """Every tick, end the wait of each body that paused too long or is past its whole-body deadline; the task
        ends once a tick finds no body arriving (the next one starts it again)."""
        try:
            while self.arriving:
                await asyncio.sleep(self.tick_s)
                now = self.clock()
                for channel in list(self.arriving):
                    channel.expire(now)
        finally:
            self._sweeper = None


# Falcon's first event for a request whose first chunk never came, or was refused: the route's read raises.
_EMPTY: Message = {"type": "http.request", "body": b"", "more_body": True}


class _Channel:
    """One request's receive and send while its body arrives.

    NOTE: granian closes a connection whose body was not read whole only once nothing holds the request's receive or
    send (both reach the body's stream). A refusal is raised through the app, whose frames, held by the exception's
    traceback, may outlive the request in a reference cycle until the garbage collector runs; so the app is handed
    these wrappers, which let go of granian's channel as soon as the app returns."""

    __slots__ = ("_receive", "_send", "deadline", "first", "owner", "refusal", "since", "waiting")

    def __init__(self, owner: IncomingBodies, receive: Receive, send: Send) -> None:
        self.owner = owner
        self._receive: Receive | None = receive
        self._send: Send | None = send
        self.deadline = owner.clock() + owner.total_s
        self.first: Message | None = None  # the first event, read before the app was called
        self.since = 0.0  # when the current wait for the body began
        self.waiting: asyncio.Task[Any] | None = None  # the task parked in that wait, while it waits
        self.refusal: Callable[[], falcon.HTTPError] | None = None

    def send(self, message: Message) -> Awaitable[None]:
        return (self._send or _gone)(message)  # granian's own awaitable: no coroutine of ours per chunk sent

    def refuse(self, refusal: Callable[[], falcon.HTTPError]) -> None:
        self.refusal = refusal
        self.owner.arriving.discard(self)

    def close(self) -> None:
        self.owner.arriving.discard(self)
        self._receive = self._send = None

    def expire(self, now: float) -> None:
        """The sweeper's check: a wait past either limit is cancelled, and the read raises 408."""
        task, owner = self.waiting, self.owner
        if task is None or self.refusal is not None:  # not waiting, or already cancelled (not yet resumed)
            return
        if now - self.since >= owner.idle_s:
            message = f"no byte of the request body arrived for {owner.idle_s:g} s (server.body_idle_timeout_s)"
        elif now >= self.deadline:
            message = f"the request body did not arrive whole within {owner.total_s:g} s (server.body_timeout_s)"
        else:
            return
        self.refuse(functools.partial(body_timed_out, message))
        task.cancel()

    async def next(self) -> Message:
        """The next body event, waited for under the deadlines; an empty chunk when refused (the read after raises)."""
        assert self._receive is not None
        self.since, self.waiting = self.owner.clock(), asyncio.current_task()
        try:
            event = await self._receive()
        except asyncio.CancelledError:
            task = self.waiting
            if self.refusal is None or task is None:
                raise
            # The sweeper's cancellation, not anyone else's: taken back, unless the task is being cancelled too.
            if task.uncancel() > 0:
                raise
            return dict(_EMPTY)
        finally:
            self.waiting = None
        if event.get("type") != "http.request" or not event.get("more_body"):
            self.owner.arriving.discard(self)  # whole (or the client is gone)
        return event

    async def receive(self) -> Message:
        first = self.first
        if first is not None:
            self.first = None
            return first
        if self.refusal is not None:
            raise self.refusal()
        if self._receive is None:  # the request is over
            return {"type": "http.disconnect"}
        if self not in self.owner.arriving:  # the body is in: later reads wait for a disconnect, with no deadline
            return await self._receive()
        event = await self.next()
        if self.refusal is not None:
            raise self.refusal()
        return event


async def _gone(_message: Message) -> None:
    """`send` once the request is over: a no-op, as ASGI's send after a disconnect is."""
