"""Noticing that a client hung up. Under ASGI, `send` after a disconnect is a silent no-op, so a relay would keep the
engine generating for nobody; instead a watcher waits for `http.disconnect` and cancels the request's task. The
cancellation lands wherever the request is (queued, loading, streaming), and each place cleans up after itself."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

import falcon.asgi


def watch(req: falcon.asgi.Request) -> asyncio.Task[None]:
    """Start watching (after the body has been read); cancel the returned task when the response is done."""
    receive = req._receive  # the ASGI receive channel: falcon keeps it, and has read the body through it already
    owner = asyncio.current_task()

    async def wait() -> None:
        while True:
            event: Mapping[str, Any] = await receive()
            if event.get("type") == "http.disconnect":
                if owner is not None and not owner.done():
                    owner.cancel("client disconnected")
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
