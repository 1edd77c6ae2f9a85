"""GET /api/blazar/events/follow: the event log live, as server-sent events, read through `EventLog.follow` (this
process's appends at once, other processes' within its poll). Bounded three ways: a stream lasts at most
`timeout_s` and then ends with an `end` event naming where to resume (`after=`, or Last-Event-ID); at most
MAX_FOLLOWERS streams run at once; a slow reader holds back only its own queue. A client that goes away stops its
stream at once (blazar/api/disconnect.py)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import falcon
import falcon.asgi
import orjson
from pydantic import BaseModel, ConfigDict, Field, StrictStr

from blazar.api import disconnect
from blazar.api.bounds import MAX_NAME_CHARS
from blazar.context import Blazar
from blazar.events.base import Recorded

SSE = "text/event-stream"
MAX_FOLLOWERS = 16
HEARTBEAT_S = 15.0  # a comment line this often keeps proxies and the browser from timing the stream out
QUEUE_EVENTS = 1000  # read ahead of a slow client at most this many events
MAX_SEQ = 2**62  # past any log, inside SQLite's integers
DATA_LIMIT = 16 * 1024  # an event's data over this (an engine's flag manifest) is sent as its size only


def event_json(rec: Recorded) -> dict[str, Any]:
    """A recorded event as the console shows it; a very large payload is replaced by its size (`blazar events
    --json` prints it whole)."""
    out = rec.to_json()
    size = len(orjson.dumps(out["data"]))
    if size > DATA_LIMIT:
        out["data"] = {"truncated": True, "bytes": size}
    return out


class FollowQuery(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    type: list[StrictStr] = Field(default_factory=list, max_length=32)
    stream: StrictStr | None = Field(None, min_length=1, max_length=MAX_NAME_CHARS)
    trace: StrictStr | None = Field(None, min_length=1, max_length=64)
    after: int | None = Field(None, ge=0, le=MAX_SEQ, description="resume after this seq (default: the log's last)")
    timeout_s: float = Field(300.0, gt=0, le=600, description="end the stream after this long; the client resumes")


def query_params(req: falcon.asgi.Request, lists: frozenset[str] = frozenset({"type"})) -> dict[str, Any]:
    """The query string as a dict for a pydantic model: `type` may repeat or be comma-separated; empty values are
    absent (what an empty filter field in the page sends)."""
    out: dict[str, Any] = {}
    for key, value in req.params.items():
        values = [v for v in (value if isinstance(value, list) else [value]) if v != ""]
        if key in lists:
            items = [part.strip() for v in values for part in v.split(",") if part.strip()]
            if items:
                out[key] = items
        elif values:
            out[key] = values[-1]
    return out


def _frame(rec: Recorded) -> bytes:
    return b"id: %d\nevent: event\ndata: %s\n\n" % (rec.seq, orjson.dumps(event_json(rec)))


class Follow:
    def __init__(self, app: Blazar) -> None:
        self.app = app
        self.followers = 0

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        q = FollowQuery.model_validate(query_params(req))
        if self.followers >= MAX_FOLLOWERS:
            raise falcon.HTTPServiceUnavailable(description=f"{MAX_FOLLOWERS} event streams are open already; "
                                                            "close one (another console tab)", retry_after=5)
        after = q.after
        resumed = req.get_header("Last-Event-ID")
        if after is None and resumed is not None and resumed.isdigit():
            after = int(resumed)
        if after is None:
            after = await self.app.log.last_seq()
        filters: dict[str, Any] = {"types": q.type or None, "stream": q.stream, "trace_id": q.trace}
        resp.content_type = SSE
        resp.cache_control = ["no-store"]
        resp.set_header("X-Accel-Buffering", "no")
        resp.stream = self._stream(req, after, filters, q.timeout_s)

    async def _stream(self, req: falcon.asgi.Request, after: int, filters: dict[str, Any],
                      timeout_s: float) -> AsyncIterator[bytes]:
        # NOTE: falcon iterates the stream in the request's own task: the watcher cancels it when the client goes.
        self.followers += 1
        watcher = disconnect.watch(req)
        queue: asyncio.Queue[Recorded] = asyncio.Queue(maxsize=QUEUE_EVENTS)

        async def pump() -> None:
            async for rec in self.app.log.follow(after=after, **filters):
                await queue.put(rec)

        reader = asyncio.create_task(pump(), name="blazar-console-follow")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        last = after
        try:
            yield b": following the event log\n\n"
            while (left := deadline - loop.time()) > 0:
                try:
                    rec = await asyncio.wait_for(queue.get(), timeout=min(HEARTBEAT_S, left))
                except TimeoutError:
                    if reader.done():  # the read failed: end the stream; the client resumes from `last`
                        break
                    yield b": keep-alive\n\n"
                    continue
                last = rec.seq
                yield _frame(rec)
            yield b"event: end\ndata: %s\n\n" % orjson.dumps({"after": last})
        finally:
            self.followers -= 1
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
            await disconnect.reap(watcher)
