#!/usr/bin/env python3
"""A stand-in llama-server that answers faster than any engine: the upstream for measuring what the gateway itself
costs (bench/overhead.py) and for fast, deterministic end-to-end tests (tests/integration/test_run_cli.py).

It speaks llama-server's HTTP/1.1 (keep-alive; chunked transfer for streams) and its exact OpenAI chunk shapes, with
canned text: `--version` and `--help` print the llama-server fixtures, so `blazar engine install --path` accepts
it (`write_executable` makes the installable copy). Standard library only: asyncio streams and json.

    python bench/fake_engine.py --port 8081 [--host 127.0.0.1] [--fake-chunks 16] [--fake-delay-ms 0]

Knobs: FAKE_ENGINE_CHUNKS / --fake-chunks (tokens when a request sets no max_tokens), FAKE_ENGINE_DELAY_MS /
--fake-delay-ms (sleep between chunks). A request may override both with the bench-only body fields
`fake_delay_ms`, and ask for `fake_stamp: true`: every content chunk then carries `"fake_sent_ns"`, the
CLOCK_MONOTONIC time it was written, so a client on the same host can measure each chunk's one-way latency. A
streamed request with `fake_hold_until: PATH` sends its first content chunk, then holds (its slot busy) until PATH
exists: a test makes a request occupy its slot for exactly as long as it needs, whatever the machine's speed (a chat
that is not streamed, a batch line's, holds before its answer). A
streamed chat whose last message ends with `fake_hold_first=PATH` (a field no dialect would carry through) sends its
headers, then sends llama-server's keep-alive comment (`:`) and holds before any event until PATH exists: an engine
still reading a long prompt. `timings_per_token: true` puts the timings so far on every content chunk, as
llama-server does. The canned answer is one sentence over and over, each full stop numbered, so that no answer
repeats itself exactly; a chat whose last message ends with `fake_loop` gets the sentence without the numbers, a
loop (what the gateway's loop guard stops: blazar/serving/loop_guard.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Where --version and --help come from. write_executable replaces this line with an absolute path in the copy it
# writes: an installed engine is copied into the engine store, away from this repository.
FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "llama_server"

# The canned answer, one word per token; a reply of N tokens is the first N words, cycling.
WORDS = ("The", " quick", " brown", " fox", " jumps", " over", " the", " lazy", " dog", ".")
DEFAULT_CHUNKS = 16
FINGERPRINT = "b0-fake"
MAX_HEADER_BYTES = 64 * 1024
MAX_BODY_BYTES = 64 * 1024 * 1024
IDLE_TIMEOUT_S = 300.0  # a keep-alive connection nobody uses for this long is closed
YIELD_EVERY = 64  # with no delay, give other connections the loop every this many chunks
BAKED_DELAY_MS = 0.0  # the pause between chunks when FAKE_ENGINE_DELAY_MS is not set (write_executable bakes it)
BAKED_PAUSE_FILE = ""  # while this file exists, every stream waits after each chunk (write_executable bakes it)
EMBEDDING_DIM = 16
HOLD_POLL_S = 0.01  # how often a held stream looks for its release file
TIMINGS = b"\x00timings\x00"  # where an end event takes the stream's timings, known only once it is written

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 413: "Payload Too Large",
            501: "Not Implemented"}


async def _file_appears(path: str, *, gone: bool = False) -> None:
    """Returns once `path` exists (or, with `gone`, once it does not): a release from another process (the test),
    which no asyncio.Event can carry."""
    while os.path.exists(path) is gone:  # noqa: ASYNC110, ASYNC240  # a stat every 10 ms, on a file a test names
        await asyncio.sleep(HOLD_POLL_S)


def word(i: int, *, loop: bool = False) -> str:
    """The answer's `i`-th token: WORDS over and over, each sentence's full stop numbered (unless it is to `loop`)."""
    k = i % len(WORDS)
    return f" {i // len(WORDS) + 1}." if k == len(WORDS) - 1 and not loop else WORDS[k]


def answer_text(n: int, *, loop: bool = False) -> str:
    """The whole reply of `n` tokens, as a client that joins the deltas sees it."""
    return "".join(word(i, loop=loop) for i in range(n))


class Settings:
    def __init__(self, *, model: str, chunks: int, delay_ms: float, ctx_per_slot: int = 0) -> None:
        self.model = model
        self.chunks = chunks
        self.delay_ms = delay_ms
        self.ctx_per_slot = ctx_per_slot  # from -c and -np; 0: no limit


class BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


# -- HTTP framing ----------------------------------------------------------------------------------------------------


def _head(status: int, headers: list[tuple[str, str]], *, keep_alive: bool) -> bytes:
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}", "Server: llama.cpp"]
    lines += [f"{k}: {v}" for k, v in headers]
    lines.append("Keep-Alive: timeout=5, max=100" if keep_alive else "Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _json_response(status: int, payload: Any, *, keep_alive: bool) -> bytes:
    body = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
    head = _head(status, [("Content-Type", "application/json; charset=utf-8"), ("Content-Length", str(len(body)))],
                 keep_alive=keep_alive)
    return head + body


def _error(status: int, message: str, kind: str) -> dict[str, Any]:
    return {"error": {"code": status, "message": message, "type": kind}}


def _chunk(event: bytes) -> bytes:
    """One SSE event as one HTTP chunk, the way llama-server writes them."""
    return b"%x\r\n%s\r\n" % (len(event), event)


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str, dict[str, str], bytes] | None:
    """(method, path, lower-cased headers, body) of the next request; None when the client closed the connection."""
    try:
        raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), IDLE_TIMEOUT_S)
    except (asyncio.IncompleteReadError, ConnectionError, TimeoutError):
        return None
    except asyncio.LimitOverrunError as e:
        raise BadRequest(400, "request head too large") from e
    lines = raw.decode("latin-1").split("\r\n")
    try:
        method, target, _version = lines[0].split(" ", 2)
    except ValueError as e:
        raise BadRequest(400, f"bad request line {lines[0]!r}") from e
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        parts = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")  # no trailers expected: the empty line that ends the body
                break
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)
        body = b"".join(parts)
    else:
        length = int(headers.get("content-length") or 0)
        if length > MAX_BODY_BYTES:
            raise BadRequest(413, "request body too large")
        body = await reader.readexactly(length) if length else b""
    return method, target.split("?", 1)[0], headers, body


# -- the engine ------------------------------------------------------------------------------------------------------


def _prompt_tokens(body: dict[str, Any]) -> int:
    """A deterministic stand-in for the tokenizer: one token per whitespace-separated word, plus a template share."""
    text = []
    for m in body.get("messages") or []:
        if isinstance(m, dict) and isinstance(m.get("content"), str):
            text.append(m["content"])
    for key in ("prompt", "input", "content"):
        if isinstance(body.get(key), str):
            text.append(body[key])
    return 8 + sum(len(t.split()) for t in text)


HOLD_FIRST = "fake_hold_first="
LOOP = "fake_loop"


def _last_text(body: dict[str, Any]) -> str | None:
    messages = body.get("messages") or []
    last = messages[-1].get("content") if messages and isinstance(messages[-1], dict) else None
    if isinstance(last, list):  # content parts: the last text part
        last = next((p.get("text") for p in reversed(last) if isinstance(p, dict) and p.get("type") == "text"), None)
    return last if isinstance(last, str) else None


def _hold_first(body: dict[str, Any]) -> str | None:
    """The PATH of a last message ending with `fake_hold_first=PATH` (see the module's docstring)."""
    last = _last_text(body)
    if last is None or HOLD_FIRST not in last:
        return None
    return last.rsplit(HOLD_FIRST, 1)[1].strip() or None


def _ends_with(body: dict[str, Any], marker: str) -> bool:
    last = _last_text(body)
    return last is not None and last.rstrip().endswith(marker)


def _timings(prompt_n: int, predicted_n: int, elapsed_s: float) -> dict[str, Any]:
    ms = max(elapsed_s * 1000, 1e-3)
    return {"cache_n": 0, "prompt_n": prompt_n, "prompt_ms": 0.0, "prompt_per_token_ms": 0.0,
            "prompt_per_second": 0.0, "predicted_n": predicted_n, "predicted_ms": ms,
            "predicted_per_token_ms": ms / max(predicted_n, 1), "predicted_per_second": predicted_n / ms * 1000}


class Engine:
    def __init__(self, settings: Settings) -> None:
        self.s = settings

    def tokens_for(self, body: dict[str, Any], *keys: str) -> tuple[int, bool]:
        """(tokens to generate, whether that is the request's own limit, i.e. finish_reason "length")."""
        for key in keys:
            value = body.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                # Like llama-server, a reply stops at the slot's context, whatever max_tokens asked for.
                return (min(value, self.s.ctx_per_slot) if self.s.ctx_per_slot else value), True
        return self.s.chunks, False

    async def handle(self, method: str, path: str, body: bytes, writer: asyncio.StreamWriter, *,
                     keep_alive: bool) -> None:
        if method == "GET" and path == "/health":
            writer.write(_json_response(200, {"status": "ok"}, keep_alive=keep_alive))
            return
        if method == "GET" and path in ("/v1/models", "/models"):
            payload = {"object": "list", "data": [{"id": self.s.model, "object": "model", "created": int(time.time()),
                                                   "owned_by": "llamacpp"}]}
            writer.write(_json_response(200, payload, keep_alive=keep_alive))
            return
        routes = {
            "/completion": self.completion, "/completions": self.completion,
            "/v1/chat/completions": self.chat, "/chat/completions": self.chat,
            "/v1/completions": self.completions, "/v1/responses": self.responses,
            "/v1/chat/completions/input_tokens": self.input_tokens, "/v1/responses/input_tokens": self.input_tokens,
            "/tokenize": self.tokenize, "/v1/embeddings": self.embeddings, "/embeddings": self.embeddings,
        }
        handler = routes.get(path)
        if handler is None:
            writer.write(_json_response(404, _error(404, "File Not Found", "not_found_error"), keep_alive=keep_alive))
            return
        if method != "POST":
            writer.write(_json_response(405, _error(405, "Method Not Allowed", "invalid_request_error"),
                                        keep_alive=keep_alive))
            return
        try:
            data = json.loads(body or b"{}")
            if not isinstance(data, dict):
                raise ValueError("a JSON object is expected")
        except ValueError as e:
            writer.write(_json_response(400, _error(400, f"parse error: {e}", "invalid_request_error"),
                                        keep_alive=keep_alive))
            return
        await handler(data, writer, keep_alive=keep_alive)

    # -- routes --

    async def chat(self, body: dict[str, Any], writer: asyncio.StreamWriter, *, keep_alive: bool) -> None:
        n, limited = self.tokens_for(body, "max_completion_tokens", "max_tokens", "n_predict")
        prompt_n = _prompt_tokens(body)
        rid = "chatcmpl-" + secrets.token_hex(16)
        created = int(time.time())
        tail = (f',"created":{created},"id":"{rid}","model":{json.dumps(self.s.model)},'
                f'"system_fingerprint":"{FINGERPRINT}","object":"chat.completion.chunk"').encode()
        finish = "length" if limited else "stop"
        if not body.get("stream"):
            t0 = time.perf_counter()
            if isinstance(hold := body.get("fake_hold_until"), str):
                await _file_appears(hold)
            payload = {
                "choices": [{"finish_reason": finish, "index": 0,
                             "message": {"role": "assistant",
                                         "content": answer_text(n, loop=_ends_with(body, LOOP))}}],
                "created": created, "model": self.s.model, "system_fingerprint": FINGERPRINT,
                "object": "chat.completion",
                "usage": {"completion_tokens": n, "prompt_tokens": prompt_n, "total_tokens": n + prompt_n,
                          "prompt_tokens_details": {"cached_tokens": 0}},
                "id": rid, "timings": _timings(prompt_n, n, time.perf_counter() - t0)}
            writer.write(_json_response(200, payload, keep_alive=keep_alive))
            return
        head = b'{"choices":[{"finish_reason":null,"index":0,"delta":{"content":'

        def frame(w: str) -> bytes:
            return b'%s%s}}]%s}' % (head, json.dumps(w).encode(), tail)

        first = b'{"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant","content":null}}]%s}' % tail
        # Without include_usage, llama-server puts its timings on the finish event; with it, on the usage event.
        end = [b'{"choices":[{"finish_reason":"%s","index":0,"delta":{}}]%s%s}' % (
            finish.encode(), tail, b"" if _include_usage(body) else b',"timings":' + TIMINGS)]
        await self._stream(writer, body, first, frame, end, n, prompt_n, usage_tail=tail if _include_usage(body)
                           else None, keep_alive=keep_alive)

    async def completions(self, body: dict[str, Any], writer: asyncio.StreamWriter, *, keep_alive: bool) -> None:
        n, limited = self.tokens_for(body, "max_tokens", "n_predict")
        prompt_n = _prompt_tokens(body)
        rid = "chatcmpl-" + secrets.token_hex(16)
        created = int(time.time())
        finish = "length" if limited else "stop"
        usage = {"completion_tokens": n, "prompt_tokens": prompt_n, "total_tokens": n + prompt_n,
                 "prompt_tokens_details": {"cached_tokens": 0}}
        if not body.get("stream"):
            payload = {"choices": [{"text": answer_text(n), "index": 0, "logprobs": None, "finish_reason": finish}],
                       "created": created, "model": self.s.model, "system_fingerprint": FINGERPRINT,
                       "object": "text_completion", "usage": usage, "id": rid, "timings": _timings(prompt_n, n, 0.0)}
            writer.write(_json_response(200, payload, keep_alive=keep_alive))
            return
        tail = (f',"created":{created},"model":{json.dumps(self.s.model)},"system_fingerprint":"{FINGERPRINT}",'
                '"object":"text_completion"').encode()

        def frame(w: str) -> bytes:
            return (b'{"choices":[{"text":%s,"index":0,"logprobs":null,"finish_reason":null}]%s,"id":"%s"}'
                    % (json.dumps(w).encode(), tail, rid.encode()))

        # llama-server always puts usage and timings on the last chunk of a text completion.
        end = [b'{"choices":[{"text":"","index":0,"logprobs":null,"finish_reason":"%s"}]%s,"usage":%s,"id":"%s",'
               b'"timings":%s}' % (finish.encode(), tail, json.dumps(usage, separators=(",", ":")).encode(),
                                  rid.encode(), TIMINGS)]
        await self._stream(writer, body, None, frame, end, n, prompt_n, usage_tail=None, keep_alive=keep_alive)

    async def completion(self, body: dict[str, Any], writer: asyncio.StreamWriter, *, keep_alive: bool) -> None:
        """llama-server's native route, as the smoke gate calls it (not streamed)."""
        n, limited = self.tokens_for(body, "n_predict", "max_tokens")
        prompt_n = _prompt_tokens(body)
        payload = {"index": 0, "content": answer_text(n), "tokens": [], "id_slot": 0, "stop": True,
                   "model": self.s.model, "tokens_predicted": n, "tokens_evaluated": prompt_n,
                   "generation_settings": {"n_predict": n, "ignore_eos": bool(body.get("ignore_eos")),
                                           "stream": False},
                   "prompt": str(body.get("prompt", "")), "has_new_line": False, "truncated": False,
                   "stop_type": "limit" if limited else "eos", "stopping_word": "", "tokens_cached": prompt_n + n,
                   "timings": _timings(prompt_n, n, 0.0)}
        writer.write(_json_response(200, payload, keep_alive=keep_alive))

    async def responses(self, body: dict[str, Any], writer: asyncio.StreamWriter, *, keep_alive: bool) -> None:
        """OpenAI's Responses API as llama-server answers it: one response object, or its named SSE events."""
        n, limited = self.tokens_for(body, "max_output_tokens")
        prompt_n = _prompt_tokens(body)
        rid, mid = "resp_" + secrets.token_hex(12), "msg_" + secrets.token_hex(12)
        usage = {"input_tokens": prompt_n, "output_tokens": n, "total_tokens": prompt_n + n}

        def response(text: str, status: str) -> dict[str, Any]:
            content = [{"type": "output_text", "text": text, "annotations": []}]
            return {"id": rid, "object": "response", "created_at": int(time.time()), "model": self.s.model,
                    "status": status, "incomplete_details": {"reason": "max_output_tokens"} if limited else None,
                    "output": [{"type": "message", "id": mid, "status": status, "role": "assistant",
                                "content": content}] if text else [],
                    "usage": usage if status != "in_progress" else None}

        if not body.get("stream"):
            writer.write(_json_response(200, response(answer_text(n), "completed"), keep_alive=keep_alive))
            return
        writer.write(_head(200, [("Content-Type", "text/event-stream"), ("Transfer-Encoding", "chunked")],
                           keep_alive=keep_alive))

        def event(name: str, payload: dict[str, Any]) -> bytes:
            return _chunk(b"event: %s\n" % name.encode() + _sse({"type": name, **payload}))

        writer.write(event("response.created", {"response": response("", "in_progress")}))
        for i in range(n):
            writer.write(event("response.output_text.delta", {"item_id": mid, "output_index": 0,
                                                              "content_index": 0, "delta": word(i)}))
            await writer.drain()
        writer.write(event("response.completed", {"response": response(answer_text(n), "completed")}))
        writer.write(b"0\r\n\r\n")  # the Responses stream ends with response.completed: no [DONE]
        await writer.drain()

    async def input_tokens(self, body: dict[str, Any], writer: asyncio.StreamWriter, *, keep_alive: bool) -> None:
        writer.write(_json_response(200, {"input_tokens": _prompt_tokens(body), "object": "response.input_tokens"},
                                    keep_alive=keep_alive))

    async def tokenize(self, body: dict[str, Any], writer: asyncio.StreamWriter, *, keep_alive: bool) -> None:
        content = body.get("content")
        words = content.split() if isinstance(content, str) else []
        tokens = ([2] if body.get("add_special") else []) + [1000 + (sum(w.encode()) % 30000) for w in words]
        writer.write(_json_response(200, {"tokens": tokens}, keep_alive=keep_alive))

    async def embeddings(self, body: dict[str, Any], writer: asyncio.StreamWriter, *, keep_alive: bool) -> None:
        inputs = body.get("input")
        items = inputs if isinstance(inputs, list) else [inputs]
        data = [{"embedding": [((i + k) % 7) / 7.0 for k in range(EMBEDDING_DIM)], "index": i, "object": "embedding"}
                for i in range(len(items))]
        n = sum(len(str(x).split()) for x in items)
        payload = {"model": self.s.model, "object": "list", "usage": {"prompt_tokens": n, "total_tokens": n},
                   "data": data}
        writer.write(_json_response(200, payload, keep_alive=keep_alive))

    # -- streaming --

    async def _stream(self, writer: asyncio.StreamWriter, body: dict[str, Any], first: bytes | None,
                      frame: Callable[[str], bytes], end: list[bytes], n: int, prompt_n: int, *,
                      usage_tail: bytes | None, keep_alive: bool) -> None:
        """Headers, then `first` (if any), n content events (`frame` of each `word`), the `end` events (TIMINGS in
        them replaced by the timings), the usage event when asked, and [DONE]; one write per event, flushed as the
        socket takes them."""
        delay_s = float(body.get("fake_delay_ms", self.s.delay_ms) or 0) / 1000
        stamp = bool(body.get("fake_stamp"))
        per_token = bool(body.get("timings_per_token"))
        hold = body.get("fake_hold_until")
        writer.write(_head(200, [("X-Accel-Buffering", "no"), ("Content-Type", "text/event-stream"),
                                 ("Transfer-Encoding", "chunked")], keep_alive=keep_alive))
        t0 = time.perf_counter()
        if (hold_first := _hold_first(body)) is not None:
            writer.write(_chunk(b":\n\n"))  # llama-server's keep-alive (--sse-ping-interval), before any event
            await writer.drain()
            await _file_appears(hold_first)
        if first is not None:
            writer.write(_chunk(b"data: " + first + b"\n\n"))
        loop = _ends_with(body, LOOP)
        frames = [frame(w) for w in WORDS]  # built once; a numbered full stop is built as it comes
        framed = [_chunk(b"data: " + f + b"\n\n") for f in frames]
        numbered = len(WORDS) - 1
        for i in range(n):
            if delay_s:
                await asyncio.sleep(delay_s)
            k = i % len(WORDS)
            f = frames[k] if k != numbered or loop else frame(word(i))
            if stamp:
                writer.write(_chunk(b'data: %s,"fake_sent_ns":%d}\n\n' % (f[:-1], time.monotonic_ns())))
            elif per_token:
                so_far = json.dumps(_timings(prompt_n, i + 1, time.perf_counter() - t0), separators=(",", ":"))
                writer.write(_chunk(b'data: %s,"timings":%s}\n\n' % (f[:-1], so_far.encode())))
            else:
                writer.write(framed[k] if f is frames[k] else _chunk(b"data: " + f + b"\n\n"))
            await writer.drain()  # returns at once unless the socket's buffer is full
            if i == 0 and isinstance(hold, str):
                await _file_appears(hold)
            if BAKED_PAUSE_FILE:
                await _file_appears(BAKED_PAUSE_FILE, gone=True)
            if not delay_s and i % YIELD_EVERY == YIELD_EVERY - 1:
                await asyncio.sleep(0)
        timings = json.dumps(_timings(prompt_n, n, time.perf_counter() - t0), separators=(",", ":")).encode()
        for e in end:
            writer.write(_chunk(b"data: " + e.replace(TIMINGS, timings) + b"\n\n"))
        if usage_tail is not None:
            usage = {"completion_tokens": n, "prompt_tokens": prompt_n, "total_tokens": n + prompt_n,
                     "prompt_tokens_details": {"cached_tokens": 0}}
            writer.write(_chunk(b'data: {"choices":[]%s,"usage":%s,"timings":%s}\n\n' % (
                usage_tail, json.dumps(usage, separators=(",", ":")).encode(), timings)))
        writer.write(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        await writer.drain()


def _include_usage(body: dict[str, Any]) -> bool:
    opts = body.get("stream_options")
    return isinstance(opts, dict) and bool(opts.get("include_usage"))


async def _connection(engine: Engine, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            try:
                req = await _read_request(reader)
            except BadRequest as e:
                writer.write(_json_response(e.status, _error(e.status, str(e), "invalid_request_error"),
                                            keep_alive=False))
                await writer.drain()
                return
            if req is None:
                return
            method, path, headers, body = req
            keep_alive = headers.get("connection", "").lower() != "close"
            await engine.handle(method, path, body, writer, keep_alive=keep_alive)
            await writer.drain()
            if not keep_alive:
                return
    except (ConnectionError, asyncio.IncompleteReadError):
        pass  # the client went away mid-answer: llama-server would cancel the generation; we just stop
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def serve(host: str, port: int, settings: Settings) -> None:
    engine = Engine(settings)
    server = await asyncio.start_server(lambda r, w: _connection(engine, r, w), host, port,
                                        limit=MAX_HEADER_BYTES, reuse_address=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"fake engine listening on http://{host}:{port} (model {settings.model})", flush=True)
    async with server:
        await stop.wait()
    print("fake engine stopped", flush=True)


def parse_argv(argv: list[str]) -> tuple[str, int, Settings]:
    """llama-server's argv: --host and --port matter, -m names the model; every other flag is accepted and ignored
    (the fake has no use for -c, -np, -t, ...), and so are their values."""
    host, port, model = "127.0.0.1", 8080, "fake-model.gguf"
    chunks = int(os.environ.get("FAKE_ENGINE_CHUNKS") or DEFAULT_CHUNKS)
    delay_ms = float(os.environ.get("FAKE_ENGINE_DELAY_MS") or BAKED_DELAY_MS)
    ctx, slots = 0, 1
    known = ("--host", "--port", "-m", "--model", "--fake-chunks", "--fake-delay-ms", "-c", "--ctx-size", "-np",
             "--parallel")
    i = 0
    while i < len(argv):
        name, value = argv[i], None
        i += 1
        if name.startswith("--") and "=" in name:
            name, value = name.split("=", 1)
        elif name in known and i < len(argv):
            value = argv[i]
            i += 1
        if value is None:
            continue
        if name == "--host":
            host = value
        elif name == "--port":
            port = int(value)
        elif name in ("-m", "--model"):
            model = Path(value).name
        elif name == "--fake-chunks":
            chunks = int(value)
        elif name == "--fake-delay-ms":
            delay_ms = float(value)
        elif name in ("-c", "--ctx-size"):
            ctx = int(value)
        elif name in ("-np", "--parallel"):
            slots = max(1, int(value))
    return host, port, Settings(model=model, chunks=chunks, delay_ms=delay_ms, ctx_per_slot=ctx // slots)


def write_executable(dest: Path, *, python: str = sys.executable, delay_ms: float = 0.0,
                     pause_file: Path | None = None) -> Path:
    """An installable copy of this script at `dest`: a shebang to `python`, the fixtures' absolute path baked in,
    the executable bit set. `blazar engine install --path DEST` then takes it like any llama-server. `delay_ms` is
    baked in as the pause between chunks (Blazar passes an engine child no FAKE_ENGINE_* variable); with
    `pause_file`, every stream stops after each chunk while that file exists (a test that must act while a reply is
    streaming, whoever sends the request)."""
    src = Path(__file__).read_text().splitlines(keepends=True)
    out = [f"#!{python}\n"]
    for line in src[1:]:
        if line.startswith("FIXTURES = "):
            line = f"FIXTURES = Path({str(FIXTURES)!r})\n"
        elif line.startswith("BAKED_DELAY_MS = "):
            line = f"BAKED_DELAY_MS = {float(delay_ms)!r}\n"
        elif line.startswith("BAKED_PAUSE_FILE = ") and pause_file is not None:
            line = f"BAKED_PAUSE_FILE = {str(pause_file)!r}\n"
        out.append(line)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text("".join(out))
    dest.chmod(0o755)
    return dest


def main(argv: list[str]) -> int:
    if any(a in ("--version",) for a in argv):
        sys.stdout.write((FIXTURES / "version.txt").read_text())
        return 0
    if any(a in ("-h", "--help", "--usage") for a in argv):
        sys.stdout.write((FIXTURES / "help.txt").read_text())
        return 0
    host, port, settings = parse_argv(argv)
    try:
        asyncio.run(serve(host, port, settings))
    except OSError as e:
        print(f"fake engine: cannot listen on {host}:{port}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
