"""The Ollama dialect's `POST /api/pull`: runs `blazar pull` (store/pull.py) and reports its progress as
Ollama's NDJSON status lines, or as one `{"status": "success"}` when `stream` is false.

The pull runs in its own task, not the request's: a client that hangs up stops getting lines, but the download
carries on to its recorded outcome (the log never shows a pull cut short by a closed socket). The answer's head
waits until the download starts (or the pull ends), so a bad name or an unknown model is a 4xx, not a 200 whose
last line is an error; past that point an error is a final `{"error": "..."}` line, as Ollama sends it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import falcon
import falcon.asgi
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr

from blazar.api.auth import Access
from blazar.api.bounds import MAX_NAME_CHARS
from blazar.api.ollama import _body
from blazar.api.routes import Op, Route
from blazar.api.schemas import JSON, NDJSON, ref
from blazar.context import Blazar
from blazar.dialects.stream import ndjson
from blazar.errors import BlazarError, DialectError, InvalidModelName
from blazar.store.models import check_name
from blazar.store.pull import PullResult, pull
from blazar.store.pull_target import parse_target

log = logging.getLogger("blazar.api")

LINE_INTERVAL_S = 0.1  # at most ~10 progress lines a second; the last one is always sent
HOLD_HEAD_S = 10.0  # how long the head waits for the download to start before streaming regardless

# Pulls whose clients may have gone: held here so the loop does not drop the task half-way.
_detached: set[asyncio.Task[PullResult]] = set()


class PullBody(BaseModel):
    model_config = ConfigDict(extra="ignore")  # `insecure` and the rest: nothing for Blazar to act on
    model: StrictStr | None = Field(None, max_length=MAX_NAME_CHARS)
    name: StrictStr | None = Field(None, max_length=MAX_NAME_CHARS)  # what older clients send
    stream: StrictBool | None = None  # absent or null: streamed, as Ollama does
    insecure: StrictBool = False


def _status(exc: BaseException) -> int:
    return exc.http_status if isinstance(exc, BlazarError) else 500


def _message(exc: BaseException) -> str:
    if isinstance(exc, BlazarError):
        return exc.message
    log.error("pull failed unexpectedly", exc_info=exc)
    return f"internal error: {type(exc).__name__}"


@dataclass(frozen=True)
class _Progress:
    done: int
    total: int


@dataclass(frozen=True)
class _End:
    result: PullResult | None
    error: BaseException | None


class _Run:
    """One pull in its own task; progress (from a worker thread or the loop) and the outcome arrive on a queue."""

    def __init__(self, app: Blazar, target: str, name: str) -> None:
        self.name = name  # the store name pull() gives it, and the one progress layer's name
        self.loop = asyncio.get_running_loop()
        self.events: asyncio.Queue[_Progress | _End] = asyncio.Queue()
        self._last = 0.0
        self.task = asyncio.ensure_future(pull(app, target, progress=self._progress))
        _detached.add(self.task)
        self.task.add_done_callback(self._ended)

    def _progress(self, done: int, total: int) -> None:
        now = time.monotonic()
        if done < total and now - self._last < LINE_INTERVAL_S:
            return
        self._last = now
        self.loop.call_soon_threadsafe(self.events.put_nowait, _Progress(done, total))

    def _ended(self, task: asyncio.Task[PullResult]) -> None:
        _detached.discard(task)
        if task.cancelled():  # the daemon stopping: pull() has recorded the cancellation
            self.events.put_nowait(_End(None, asyncio.CancelledError()))
        elif (exc := task.exception()) is not None:
            self.events.put_nowait(_End(None, exc))
        else:
            self.events.put_nowait(_End(task.result(), None))


class Pull:
    def __init__(self, app: Blazar) -> None:
        self.app = app

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        try:
            body = await _body(req, PullBody)
            target = body.model or body.name
            if not target:
                raise DialectError("model: field required")
            name = check_name(parse_target(target).default_name())  # a malformed name: 400 before anything starts
        except (DialectError, InvalidModelName) as e:
            resp.status, resp.media = e.http_status, {"error": e.message}
            return
        run = _Run(self.app, target, name)
        if body.stream is False:
            end = await self._outcome(run)
            if end.error is not None:
                resp.status, resp.media = _status(end.error), {"error": _message(end.error)}
            else:
                resp.media = {"status": "success"}
            return
        try:
            first = await asyncio.wait_for(run.events.get(), HOLD_HEAD_S)
        except TimeoutError:
            first = None
        if isinstance(first, _End) and first.error is not None:
            resp.status, resp.media = _status(first.error), {"error": _message(first.error)}
            return
        resp.content_type = NDJSON
        resp.stream = self._lines(run, first)

    @staticmethod
    async def _outcome(run: _Run) -> _End:
        # NOTE: only the queue is awaited, never the task, so a cancelled request cannot cancel the pull.
        while not isinstance(event := await run.events.get(), _End):
            pass
        return event

    @staticmethod
    async def _lines(run: _Run, first: _Progress | _End | None) -> AsyncIterator[bytes]:
        yield ndjson({"status": "pulling manifest"})
        event = first if first is not None else await run.events.get()
        layer: dict[str, Any] = {}
        while isinstance(event, _Progress):
            # pull() reports bytes across all of a model's files: one layer, named after the store name.
            layer = {"status": f"pulling {run.name}", "digest": run.name, "total": event.total,
                     "completed": min(event.done, event.total)}
            yield ndjson(layer)
            event = await run.events.get()
        if event.error is not None:
            yield ndjson({"error": _message(event.error)})
            return
        result = event.result
        assert result is not None
        if not layer or layer["completed"] < layer["total"]:  # already in the store, or no final report came
            size = result.bytes if not layer else layer["total"]
            yield ndjson({"status": f"pulling {run.name}", "digest": run.name, "total": size, "completed": size})
        for status in ("verifying sha256 digest", "writing manifest", "success"):
            yield ndjson({"status": status})


ROUTES = (
    # What another node may ask of this one besides inference (`blazar pull --node`): a download into its store.
    Route("/api/pull", Access.CLUSTER, lambda d: Pull(d.app), {"post": Op(
        "Pull a model from the hub (NDJSON progress unless stream is false)", ref("PullStatus"),
        statuses=(404, 409, 502, 507), body=PullBody, ok_types=(JSON, NDJSON), line=ref("PullLine"),
        examples=({"model": "ggml-org/gemma-3-270m-GGUF", "stream": False},))}),
)
