"""Relaying a streamed answer from the engine to the client, and recording how it ended: `passthrough` sends the
engine's SSE bytes as they come (OpenAI clients), `translated` feeds each event through a dialect's translator
(Anthropic, Ollama). The first non-empty block marks the first token; usage is read from the last events. While the
engine is silent before its first block (reading a long prompt: minutes on a CPU for an agent's first turn), the
client gets a heartbeat every `stream_heartbeat_s` (15 s), in its dialect: clients drop a stream that stays silent
(Claude Code after 300 s, then asks again without streaming).

Every way out records exactly one outcome: completed, failed (the engine's error, a broken stream, a bug of ours)
or the client's hang-up; closing the upstream cancels the generation. A guarded answer (a probed template's, served
greedy: blazar/serving/loop_guard.py) that ends in a loop is ended there, as the model's own stop would be, and
`request.loop_stopped` says so.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import orjson

from blazar.adapters.engines.answers import error_message, merge_usage, stream_error, usage_from_json, usage_from_sse
from blazar.adapters.engines.client import Upstream
from blazar.dialects.stream import SseEvents, Translator
from blazar.errors import EngineStreamBroken
from blazar.events.requests import RequestLoopStopped
from blazar.serving.call import Completed, Failed
from blazar.serving.loop_guard import Loop, LoopGuard

if TYPE_CHECKING:
    from blazar.serving.call import Call

log = logging.getLogger("blazar.gateway")

KEEP_BYTES = 8192  # of the stream's first and last events: where the usage is
BROKEN = (EngineStreamBroken,)
THINKING = b'"reasoning_content":"'  # a delta of thinking (llama-server sends one per token)
PING = b": ping\n\n"  # an SSE comment: every SSE client skips it, and its bytes keep an idle watchdog from firing


class Rename:
    """The `model` member of each event rewritten from what the engine calls it to what the client asked for; only
    whole events are rewritten, so a block cut inside one waits for the rest of it."""

    def __init__(self, served_as: str, asked: str) -> None:
        self.old = b'"model":' + orjson.dumps(served_as)
        self.new = b'"model":' + orjson.dumps(asked)
        self.carry = b""

    def __call__(self, block: bytes) -> bytes:
        data = self.carry + block if self.carry else block
        cut = data.rfind(b"\n\n") + 2
        self.carry = data[cut:]
        return data[:cut].replace(self.old, self.new)

    def whole(self, body: bytes) -> bytes:
        """A whole (non-streamed) answer."""
        return body.replace(self.old, self.new)

    def rest(self) -> bytes:
        rest, self.carry = self.carry.replace(self.old, self.new), b""
        return rest


def renamer(call: Call) -> Rename | None:
    """What rewrites the engine's name for the model into the client's, when they differ."""
    inst = call.instance
    if inst is None or not inst.served_as or inst.served_as == call.model:
        return None
    return Rename(inst.served_as, call.model)


async def passthrough(call: Call, upstream: Upstream, watcher: asyncio.Task[None] | None,
                      heartbeat_s: float) -> AsyncIterator[bytes]:
    """The engine's SSE bytes untouched (but for the model's name); the outcome from the first and last events."""
    head = tail = b""  # Anthropic-shaped usage can sit at the very start; llama-server's timings at the end
    chunks = thinking = 0
    rename = renamer(call)
    try:
        async for block in upstream.aiter_raw(heartbeat_s):
            if not block:  # the engine still reading the prompt
                yield PING
                continue
            if call.first_token_at is None:
                call.first_token()
                head = block[:KEEP_BYTES] if b'"usage"' in block else b""
            chunks += block.count(b"data: ")
            thinking += block.count(THINKING)
            if tail or b'"timings"' in block or b'"usage"' in block or b'"error"' in block:
                tail = (tail + block)[-KEEP_BYTES:]
            if b"data: [DONE]" in block:
                # NOTE: the answer is whole once [DONE] goes out: record it before the client, which may hang up at
                # once, can turn the end of the relay into a disconnect.
                _end(call, head, tail, status=upstream.status_code, chunks=chunks, thinking=thinking)
            out = rename(block) if rename is not None else block
            if out:
                yield out
        if rename is not None and rename.carry:
            yield rename.rest()
    except BaseException as e:
        if _failed(call, e, relayed=chunks):
            # Ended without [DONE], the answer would pass for a whole one: say in the stream that it broke (the
            # OpenAI and Anthropic SDKs raise on an error event).
            yield broken_event(call, f"the engine's stream broke: {e}")
            return
        raise
    finally:
        await _close(upstream, watcher)
    _end(call, head, tail, status=upstream.status_code, chunks=chunks, thinking=thinking)


def broken_event(call: Call, message: str) -> bytes:
    """The in-stream error for a passed-through stream, in the shape of the route the engine answered."""
    if call.request.engine_path.endswith("/messages"):
        body = orjson.dumps({"type": "error", "error": {"type": "api_error", "message": message}})
        return b"event: error\ndata: " + body + b"\n\n"
    body = orjson.dumps({"error": {"message": message, "type": "server_error", "code": "engine_crashed"}})
    return b"\n\ndata: " + body + b"\n\n"  # blank lines first: the engine may have stopped mid-event


def _end(call: Call, head: bytes, tail: bytes, *, status: int, chunks: int, thinking: int) -> None:
    """Failed when the engine sent an error event (the client got it as it was), else completed with the usage found
    in the first and last events (and the thinking tokens counted). Once only: an ended request is left as it is."""
    if call.ended:
        return
    broke = stream_error(tail) if b'"error"' in tail else None
    if broke is not None:
        call.finish(Failed(502, "engine_error", broke))
        return
    usage = usage_from_sse(head + b"\n" + tail if head else tail)
    _thought(call, usage, thinking)
    call.finish(Completed(status, usage, chunks=chunks))


def _thought(call: Call, usage: dict[str, Any], thinking: int) -> None:
    """The thinking tokens a stream carried, for a request whose thinking had a budget (request.completed's
    `reasoning`)."""
    if call.ask.reasoning is not None:
        usage["reasoning_tokens"] = thinking


async def translated(call: Call, upstream: Upstream, watcher: asyncio.Task[None] | None,
                     translator: Translator, heartbeat_s: float, guard: LoopGuard | None = None
                     ) -> AsyncIterator[bytes]:
    """Each engine event through `translator`; an engine error mid-stream ends the stream with the dialect's own
    error event; with a `guard`, a loop ends it as a stop (closing the upstream cancels the generation)."""
    chunks = thinking = 0
    usage: dict[str, Any] = {}
    events = SseEvents()
    try:
        async for block in upstream.aiter_raw(heartbeat_s):
            if not block:  # the engine still reading the prompt
                if beat := translator.heartbeat():
                    yield beat
                continue
            call.first_token()
            chunks += block.count(b"data: ")
            thinking += block.count(THINKING)
            parsed = events.feed(block)
            loop = _guarded(parsed, guard) if guard is not None else None
            out, broke = _translate(parsed, translator, usage)
            if broke is not None:
                call.finish(Failed(502, "engine_error", broke))
                yield out + translator.error(broke)
                return
            if loop is not None and guard is not None:
                out += _translate([guard.finish_chunk()], translator, usage)[0]
                _record_loop(call, loop)
                yield out
                break
            if out:
                yield out
    except BaseException as e:
        if _failed(call, e, relayed=chunks):
            yield translator.error(f"the engine's stream broke: {e}")
            return
        raise
    finally:
        await _close(upstream, watcher)
    _thought(call, usage, thinking)
    call.finish(Completed(upstream.status_code, usage, chunks=chunks))
    yield translator.end()


def _failed(call: Call, exc: BaseException, *, relayed: int) -> bool:
    """Record how a relay that raised ended; True when the engine's stream broke (the relay ends it), False when the
    exception goes on: a bug on our side (recorded as such, never as the client's hang-up), or GeneratorExit /
    CancelledError (the client went away; closing the upstream cancels the generation). `relayed`: the events the
    client got, each charged as a token."""
    if isinstance(exc, BROKEN):
        call.finish(Failed(502, "engine_crashed", f"the engine's stream broke: {exc}", relayed_tokens=relayed))
        return True
    if isinstance(exc, Exception):
        log.exception("relaying %s failed", call.trace_id)
        call.finish(Failed(500, "internal_error", f"{type(exc).__name__}: {exc}", relayed_tokens=relayed))
    else:
        call.finish(Failed(499, "client_disconnected", "the client closed the connection", relayed_tokens=relayed))
    return False


def _guarded(events: list[dict[str, Any]], guard: LoopGuard) -> Loop | None:
    """The loop these events end in, if they do; the events after the one that closed it are dropped (the answer
    ends there)."""
    for i, event in enumerate(events):
        if (loop := guard.feed(event)) is not None:
            del events[i + 1:]
            return loop
    return None


def _record_loop(call: Call, loop: Loop) -> None:
    inst = call.instance
    call.emit(RequestLoopStopped(trace_id=call.trace_id, model=inst.model if inst is not None else call.model,
                                 instance_id=inst.instance_id if inst is not None else "",
                                 period_chars=loop.period_chars, span_chars=loop.span_chars,
                                 completion_tokens=loop.completion_tokens))


def _translate(events: list[dict[str, Any]], translator: Translator, usage: dict[str, Any]) -> tuple[bytes, str | None]:
    """The translated bytes of these events, and the engine's error if one of them is where it gave up."""
    out: list[bytes] = []
    for event in events:
        if "error" in event and not event.get("choices"):
            return b"".join(out), error_message(event["error"])
        if "timings" in event or "usage" in event:
            merge_usage(usage, usage_from_json(event))
        out.append(translator.event(event))
    return b"".join(out), None


async def _close(upstream: Upstream, watcher: asyncio.Task[None] | None) -> None:
    if watcher is not None:
        watcher.cancel()  # the response is over: a later hang-up must not cancel what comes next
    await upstream.aclose()
