"""Request bodies as they arrive, bounded at the ASGI edge (granian -> this -> falcon): a body must keep coming (a
chunk at least every `body_idle_timeout_s`) and be whole within `body_timeout_s`, else 408 and the connection is
closed; at most `max_incoming_bodies` requests receive a body at once, and more are refused at once with 503.

Why here: granian holds one of its `max_connections` permits per connection until the connection closes, and
falcon waits for a request's first body chunk before it routes, with no deadline. Slow bodies would hold every
permit for as long as their senders liked. For a request with a body this wrapper hands falcon an empty first
chunk at once, so every wait for the body happens when the route reads it, and a refusal raised there is rendered
by the app's error handlers in the route's own dialect.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import falcon

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# Falcon routes on this; the body itself is read when the route asks for it.
_FIRST: Message = {"type": "http.request", "body": b"", "more_body": True}
_CLOSE = {"Connection": "close"}  # the rest of a refused body is never read, so the connection cannot be reused


def body_timed_out(message: str) -> falcon.HTTPError:
    return falcon.HTTPError(falcon.HTTP_408, description=message, headers=_CLOSE)


def too_many_bodies(limit: int) -> falcon.HTTPError:
    return falcon.HTTPError(
        falcon.HTTP_503, headers={**_CLOSE, "Retry-After": "1"},
        description=f"{limit} request bodies are already arriving (max_incoming_bodies): try again")


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
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.app, self.idle_s, self.total_s, self.limit, self.clock = app, idle_s, total_s, limit, clock
        self.receiving = 0  # requests whose body has not fully arrived

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not has_body(scope):
            await self.app(scope, receive, send)
            return
        channel = _Channel(self, receive, send, refused=self.receiving >= self.limit)
        try:
            await self.app(scope, channel.receive, channel.send)
        finally:
            channel.close()


async def _gone(_message: Message) -> None:
    """`send` once the request is over: a no-op, as ASGI's send after a disconnect is."""


class _Channel:
    """One request's receive and send while its body arrives: each wait for the body bounded by the idle and
    whole-body limits, or the first read refused when too many bodies are arriving.

    NOTE: granian closes a connection whose body was not read whole only once nothing holds the request's receive or
    send (both reach the body's stream). A refusal is raised through the app, whose frames, held by the exception's
    traceback, may outlive the request in a reference cycle until the garbage collector runs; so the app is handed
    these wrappers, which let go of granian's channel as soon as the app returns."""

    def __init__(self, owner: IncomingBodies, receive: Receive, send: Send, *, refused: bool) -> None:
        self.owner, self.refused = owner, refused
        self._receive: Receive | None = receive
        self._send: Send | None = send
        self.deadline = owner.clock() + owner.total_s
        self.first, self.counted = True, not refused
        self.failed: str | None = None
        if self.counted:
            owner.receiving += 1

    def send(self, message: Message) -> Awaitable[None]:
        return (self._send or _gone)(message)  # granian's own awaitable: no coroutine of ours per chunk sent

    def finish(self) -> None:
        """The body is whole (or will never be): the request no longer counts as receiving one."""
        if self.counted:
            self.counted = False
            self.owner.receiving -= 1

    def close(self) -> None:
        self.finish()
        self._receive = self._send = None

    async def receive(self) -> Message:
        if self.first:
            self.first = False
            return dict(_FIRST)
        if self.refused:
            raise too_many_bodies(self.owner.limit)
        if self.failed is not None:
            raise body_timed_out(self.failed)
        if self._receive is None:  # the request is over
            return {"type": "http.disconnect"}
        if not self.counted:  # the body is in: later reads wait for a disconnect, with no deadline
            return await self._receive()
        owner = self.owner
        wait = min(owner.idle_s, self.deadline - owner.clock())
        event = await self._within(wait) if wait > 0 else None
        if event is None:
            self.finish()
            self.failed = (f"no byte of the request body arrived for {owner.idle_s:g} s (body_idle_timeout_s)"
                           if wait >= owner.idle_s else
                           f"the request body did not arrive whole within {owner.total_s:g} s (body_timeout_s)")
            raise body_timed_out(self.failed)
        if event.get("type") != "http.request" or not event.get("more_body"):
            self.finish()
        return event

    async def _within(self, wait: float) -> Message | None:
        """The next event, or None when none came within `wait` seconds."""
        assert self._receive is not None
        try:
            async with asyncio.timeout(wait):
                return await self._receive()
        except TimeoutError:
            return None
