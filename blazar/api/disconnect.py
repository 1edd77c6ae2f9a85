"""Noticing that a client hung up. Under ASGI, `send` after a disconnect is a silent no-op, so a relay would keep the
engine generating for nobody; instead a watcher waits for `http.disconnect` and cancels the request's task. The
cancellation lands wherever the request is (queued, loading, streaming), and each place cleans up after itself.

`QuietHangUps`, the outermost ASGI wrapper, ends such a cancellation where it started: the request is already recorded
(`request.failed` 499), so a hang-up is one info line, not the traceback granian logs for an app that raised.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

import falcon.asgi

log = logging.getLogger("blazar.api")

HANG_UP = "client disconnected"  # the cancellation's message
# The request tasks a watcher cancelled: a cancellation re-raised without its message is still known as a hang-up.
_hung_up: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()


def watch(req: falcon.asgi.Request) -> asyncio.Task[None]:
    """Start watching (after the body has been read); cancel the returned task when the response is done."""
    receive = req._receive  # the ASGI receive channel: falcon keeps it, and has read the body through it already
    owner = asyncio.current_task()

    async def wait() -> None:
        while True:
            event: Mapping[str, Any] = await receive()
            if event.get("type") == "http.disconnect":
                if owner is not None and not owner.done():
                    _hung_up.add(owner)
                    owner.cancel(HANG_UP)
                return

    return asyncio.create_task(wait(), name="blazar-disconnect-watch")


def stop(watcher: asyncio.Task[None] | None) -> None:
    if watcher is not None and not watcher.done():
        watcher.cancel()


async def reap(watcher: asyncio.Task[None] | None) -> None:
    if watcher is not None:
        stop(watcher)
        with contextlib.suppress(asyncio.CancelledError):
            await watcher


Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]


class QuietHangUps:
    """The ASGI app with a client's hang-up ended quietly: see the module's docstring. Any other cancellation (the
    server stopping) goes on as it came."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        try:
            await self.app(scope, receive, send)
        except asyncio.CancelledError as e:
            task = asyncio.current_task()
            if task is None or not (task in _hung_up or e.args == (HANG_UP,)):
                raise
            _hung_up.discard(task)
            task.uncancel()  # the cancellation is over here: nothing above is left thinking it is cancelled
            log.info("%s %s: the client hung up (recorded as the request's 499)", scope.get("method"),
                     scope.get("path"))
