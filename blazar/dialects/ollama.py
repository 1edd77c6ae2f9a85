"""The Ollama dialect's inference routes (/api/chat, /api/generate, /api/embed, /api/embeddings): each request turned
into the engine's OpenAI body, and each OpenAI answer (whole or streamed) turned back into Ollama's shape, NDJSON
lines included. Pure functions and small stateful translators; the API layer does the HTTP."""

from __future__ import annotations

import base64
import binascii
import math
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import orjson

from blazar.dialects.body import checked
from blazar.dialects.errors import DialectError
from blazar.dialects.ollama_body import (
    BLAZAR_OPTIONS,
    FLOAT_OPTIONS,
    IGNORED_OPTIONS,
    INT_OPTIONS,
    MAX_NUM_CTX,
    MAX_TOP_LOGPROBS,
    ChatRequest,
    EmbeddingsRequest,
    EmbedRequest,
    GenerateRequest,
)
from blazar.dialects.stream import ndjson
from blazar.durations import keep_alive_seconds
from blazar.sentinels import UNSET

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"


class CallTimes(Protocol):
    """What the replies read from the gateway's Call: when it arrived and what a cold load cost."""

    @property
    def received(self) -> float: ...  # time.perf_counter() at receipt

    @property
    def load_ms(self) -> float | None: ...


@dataclass(frozen=True, slots=True)
class ChatTranslation:
    model: str
    engine_path: str
    engine_body: dict[str, Any]
    stream: bool
    ctx: int | None
    keep_alive: Any  # seconds (float), None for forever, or UNSET
    empty: bool  # only loads/unloads the model: nothing to generate
    max_tokens: int | None
    think: bool | None
    top_logprobs: int = 0  # alternatives per token asked for (the engine sends its own number: cut to this)


# ---------------------------------------------------------------------------------------------- request fields

def parse_keep_alive(value: Any) -> Any:
    """Ollama's keep_alive → seconds (0.0: unload now), None (a negative value: forever), or UNSET when absent."""
    if value is None:
        return UNSET
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise DialectError(f"keep_alive: expected a duration like \"5m\" or a number of seconds, got {value!r}")
    try:
        return keep_alive_seconds(value)
    except ValueError as e:
        raise DialectError(f"keep_alive: {e}") from None


def _number(name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise DialectError(f"options.{name}: expected a number, got {v!r}")
    return v


INT64_MAX = 2**63 - 1


def _integer(name: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):  # strict: no true -> 1, no 3.0 -> 3
        raise DialectError(f"options.{name}: expected an integer, got {v!r}")
    if not -INT64_MAX <= v <= INT64_MAX:  # the engine reads 64-bit integers at most
        raise DialectError(f"options.{name}: {v!r} is out of range")
    return int(v)


def map_options(options: dict[str, Any] | None) -> tuple[dict[str, Any], int | None]:
    """Ollama `options` → (llama-server sampling fields, num_ctx). An unknown option is a 400, as in Ollama."""
    if options is None:
        return {}, None
    if not isinstance(options, dict):
        raise DialectError("options: expected an object")
    out: dict[str, Any] = {}
    ctx: int | None = None
    for name, v in options.items():
        if v is None or name in BLAZAR_OPTIONS:  # the SDK's Options model may send unset fields as null
            continue
        if name in FLOAT_OPTIONS:
            out[FLOAT_OPTIONS[name]] = _number(name, v)
        elif name in INT_OPTIONS:
            out[INT_OPTIONS[name]] = _integer(name, v)
        elif name == "num_predict":
            n = _integer(name, v)
            if n < -2:
                raise DialectError(f"options.num_predict: expected -1, -2 or a count >= 0, got {v!r}")
            if n >= 0:  # -1 (no limit) and -2 (fill the context) both mean: no max_tokens
                out["max_tokens"] = n
        elif name == "stop":
            stops = [v] if isinstance(v, str) else v
            if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
                raise DialectError("options.stop: expected a string or a list of strings")
            out["stop"] = stops
        elif name == "num_ctx":
            ctx = _integer(name, v)
            if not 1 <= ctx <= MAX_NUM_CTX:
                raise DialectError(f"options.num_ctx: expected an integer from 1 to {MAX_NUM_CTX}, got {v!r}")
        elif name not in IGNORED_OPTIONS:
            raise DialectError(f"invalid option provided: {name}")
    return out, ctx


def format_to_response_format(fmt: Any) -> dict[str, Any] | None:
    """Ollama `format` → OpenAI `response_format` ("json" → any JSON object, a dict → that JSON schema)."""
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return {"type": "json_object"}
    if isinstance(fmt, dict):
        return {"type": "json_schema", "json_schema": {"name": "ollama_format", "schema": fmt, "strict": True}}
    raise DialectError(f"format: expected \"json\" or a JSON schema object, got {fmt!r}")


def _think(body: dict[str, Any]) -> tuple[bool | None, dict[str, Any] | None]:
    """`think` → (the plan's flag, chat_template_kwargs). A level ("low"/"medium"/"high", gpt-oss) means on."""
    think = body.get("think")
    if think is None:
        return None, None
    if isinstance(think, bool):
        return think, {"enable_thinking": think}
    if think in ("low", "medium", "high", "max"):
        return True, {"enable_thinking": True, "reasoning_effort": think}
    raise DialectError(f"think: expected true, false, \"low\", \"medium\", \"high\" or \"max\", got {think!r}")


def _logprobs(body: dict[str, Any]) -> dict[str, Any]:
    """`logprobs` / `top_logprobs` → the engine's chat fields (either one asks for the tokens' log probabilities)."""
    want, top = body.get("logprobs"), body.get("top_logprobs")
    if want is not None and not isinstance(want, bool):
        raise DialectError("logprobs: expected true or false")
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS):
        raise DialectError(f"top_logprobs: expected an integer from 0 to {MAX_TOP_LOGPROBS}, got {top!r}")
    if not want and not top:
        return {}
    return {"logprobs": True, **({"top_logprobs": top} if top else {})}


def _model(body: Any) -> str:
    if not isinstance(body, dict):
        raise DialectError("body: expected a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise DialectError("model: a non-empty string is required")
    return model


def _stream(body: dict[str, Any]) -> bool:
    stream = body.get("stream")
    if stream is None:
        return True  # Ollama streams unless told not to
    if not isinstance(stream, bool):
        raise DialectError("stream: expected true or false")
    return stream


_MAGIC = ((b"\x89PNG\r\n\x1a\n", "image/png"), (b"\xff\xd8\xff", "image/jpeg"), (b"GIF8", "image/gif"),
          (b"BM", "image/bmp"))


def _image_part(where: str, data: Any) -> dict[str, Any]:
    """A base64 image (what Ollama sends) → an OpenAI image_url part with a data URI of the sniffed type."""
    if not isinstance(data, str) or not data:
        raise DialectError(f"{where}: expected a base64 string")
    clean = "".join(data.split())  # base64 wrapped over lines is still base64
    if clean.startswith("data:"):
        return {"type": "image_url", "image_url": {"url": clean}}
    try:
        head = base64.b64decode(clean[:64], validate=True)
    except (binascii.Error, ValueError):
        raise DialectError(f"{where}: not valid base64") from None
    mime = next((m for magic, m in _MAGIC if head.startswith(magic)), None)
    if mime is None and head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        mime = "image/webp"
    if mime is None:
        raise DialectError(f"{where}: not a PNG, JPEG, GIF, WebP or BMP image")
    return {"type": "image_url", "image_url": {"url": f"data:{mime};base64,{clean}"}}


def _content(where: str, text: str, images: Any) -> str | list[dict[str, Any]]:
    """Text, or (with images) OpenAI content parts: the images first, as Ollama puts them before the text."""
    if images is None or images == []:
        return text
    if not isinstance(images, list):
        raise DialectError(f"{where}: expected a list of base64 strings")
    parts = [_image_part(f"{where}.{i}", img) for i, img in enumerate(images)]
    if text:
        parts.append({"type": "text", "text": text})
    return parts


def _arguments_text(where: str, args: Any) -> str:
    if args is None:
        return "{}"
    if isinstance(args, dict):
        return orjson.dumps(args).decode()
    if isinstance(args, str):  # not Ollama's shape, but unambiguous
        return args
    raise DialectError(f"{where}.function.arguments: expected an object")


def _messages(raw: Any) -> list[dict[str, Any]]:
    if not isinstance(raw, list):
        raise DialectError("messages: expected a list")
    out: list[dict[str, Any]] = []
    pending: list[tuple[str, str]] = []  # (id, name) of assistant tool calls not yet answered, oldest first
    for turn, m in enumerate(raw):
        where = f"messages.{turn}"
        if not isinstance(m, dict):
            raise DialectError(f"{where}: expected an object")
        role = m.get("role")
        if role not in ("system", "user", "assistant", "tool"):
            raise DialectError(f"{where}.role: expected system, user, assistant or tool, got {role!r}")
        text = m.get("content")
        if text is None:
            text = ""
        elif not isinstance(text, str):
            raise DialectError(f"{where}.content: expected a string")
        if role == "tool":
            out.append(_tool_message(where, m, text, pending))
            continue
        msg: dict[str, Any] = {"role": role, "content": _content(f"{where}.images", text, m.get("images"))}
        calls = m.get("tool_calls")
        if role == "assistant" and calls:  # `thinking` on an assistant turn is dropped: the engine re-derives none
            if not isinstance(calls, list):
                raise DialectError(f"{where}.tool_calls: expected a list")
            msg["tool_calls"] = []
            for i, c in enumerate(calls):
                cw = f"{where}.tool_calls.{i}"
                fn = c.get("function") if isinstance(c, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
                    raise DialectError(f"{cw}.function.name: a non-empty string is required")
                cid = c.get("id") if isinstance(c.get("id"), str) and c.get("id") else f"call_{turn}_{i}"
                msg["tool_calls"].append({"id": cid, "type": "function", "function": {
                    "name": fn["name"], "arguments": _arguments_text(cw, fn.get("arguments"))}})
                pending.append((cid, fn["name"]))
        out.append(msg)
    return out


def _tool_message(where: str, m: dict[str, Any], text: str, pending: list[tuple[str, str]]) -> dict[str, Any]:
    """A tool result answers an earlier call: the one it names by id, else the latest unanswered call of that tool,
    else the latest unanswered call."""
    name, cid = m.get("tool_name"), m.get("tool_call_id")
    if name is not None and not isinstance(name, str):
        raise DialectError(f"{where}.tool_name: expected a string")
    if cid is not None and not isinstance(cid, str):
        raise DialectError(f"{where}.tool_call_id: expected a string")
    hit = next((k for k in range(len(pending) - 1, -1, -1) if pending[k][0] == cid), None) if cid else None
    if hit is None and name:
        hit = next((k for k in range(len(pending) - 1, -1, -1) if pending[k][1] == name), None)
    if hit is None and pending and not cid:
        hit = len(pending) - 1
    msg: dict[str, Any] = {"role": "tool", "content": text}
    if hit is not None:
        msg["tool_call_id"] = pending.pop(hit)[0]
    elif cid:
        msg["tool_call_id"] = cid
    if name:
        msg["name"] = name  # some templates show the tool's name with its result
    return msg


def _tools(raw: Any) -> list[dict[str, Any]]:
    if not isinstance(raw, list):
        raise DialectError("tools: expected a list")
    out = []
    for i, t in enumerate(raw):
        if not isinstance(t, dict):
            raise DialectError(f"tools.{i}: expected an object")
        if t.get("type", "function") != "function":
            raise DialectError(f"tools.{i}.type: only \"function\" is supported")
        fn = t.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise DialectError(f"tools.{i}.function.name: a non-empty string is required")
        if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
            raise DialectError(f"tools.{i}.function.parameters: expected a JSON schema object")
        out.append({**t, "type": "function"})
    return out


def _engine_body(model: str, stream: bool, sampling: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "stream": stream, **sampling}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def chat_request(body: dict[str, Any]) -> ChatTranslation:
    """/api/chat → the engine's /v1/chat/completions body."""
    checked(ChatRequest, body)
    model = _model(body)
    stream = _stream(body)
    sampling, ctx = map_options(body.get("options"))
    keep = parse_keep_alive(body.get("keep_alive"))
    raw = body.get("messages")
    messages = [] if raw is None else _messages(raw)
    engine = _engine_body(model, stream, sampling)
    engine["messages"] = messages
    if (rf := format_to_response_format(body.get("format"))) is not None:
        engine["response_format"] = rf
    if body.get("tools"):
        engine["tools"] = _tools(body["tools"])
    think, kwargs = _think(body)
    if kwargs is not None:
        engine["chat_template_kwargs"] = kwargs
    engine.update(_logprobs(body))
    return ChatTranslation(model=model, engine_path=CHAT_PATH, engine_body=engine, stream=stream, ctx=ctx,
                           keep_alive=keep, empty=not messages, max_tokens=sampling.get("max_tokens"), think=think,
                           top_logprobs=engine.get("top_logprobs", 0))


def generate_request(body: dict[str, Any]) -> ChatTranslation:
    """/api/generate → a chat turn (system + prompt) on /v1/chat/completions, or `raw` text on /v1/completions."""
    checked(GenerateRequest, body)
    model = _model(body)
    stream = _stream(body)
    sampling, ctx = map_options(body.get("options"))
    keep = parse_keep_alive(body.get("keep_alive"))
    prompt, system = body.get("prompt"), body.get("system")
    for name, v in (("prompt", prompt), ("system", system), ("template", body.get("template")),
                    ("suffix", body.get("suffix"))):
        if v is not None and not isinstance(v, str):
            raise DialectError(f"{name}: expected a string")
    if body.get("template"):
        raise DialectError("template: not supported; Blazar applies the model's own chat template (use raw: true "
                           "with a prompt you have already templated)")
    if body.get("suffix"):
        raise DialectError("suffix: not supported (fill-in-the-middle is not available on /api/generate)")
    context = body.get("context")
    if context is not None and (not isinstance(context, list) or context):
        raise DialectError("context: not supported (Blazar keeps no token context between calls; send the "
                           "conversation with /api/chat)")
    raw = body.get("raw") or False
    if not isinstance(raw, bool):
        raise DialectError("raw: expected true or false")
    images = body.get("images")
    empty = not prompt and not images
    rf = format_to_response_format(body.get("format"))
    think, kwargs = _think(body)
    engine = _engine_body(model, stream, sampling)
    logprobs = _logprobs(body)
    if raw:
        if images:
            raise DialectError("images: not supported with raw: true")
        if logprobs:
            raise DialectError("logprobs: not supported with raw: true")
        engine["prompt"] = prompt or ""
        if rf is not None:  # /v1/completions takes a schema directly (an empty one: any JSON value)
            engine["json_schema"] = rf["json_schema"]["schema"] if rf["type"] == "json_schema" else {"type": "object"}
        path = COMPLETIONS_PATH
    else:
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": _content("images", prompt or "", images)})
        engine["messages"] = messages
        if rf is not None:
            engine["response_format"] = rf
        if kwargs is not None:
            engine["chat_template_kwargs"] = kwargs
        engine.update(logprobs)
        path = CHAT_PATH
    return ChatTranslation(model=model, engine_path=path, engine_body=engine, stream=stream, ctx=ctx, keep_alive=keep,
                           empty=empty, max_tokens=sampling.get("max_tokens"), think=think,
                           top_logprobs=logprobs.get("top_logprobs", 0))


# ---------------------------------------------------------------------------------------------- answers

def _now() -> str:
    """RFC 3339 with microseconds, as Ollama writes created_at."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _done_reason(finish: Any) -> str:
    return "length" if finish == "length" else "stop"  # tool_calls ends a turn like stop does in Ollama


def _stats(usage: dict[str, Any] | None, timings: dict[str, Any] | None, call: CallTimes) -> dict[str, int]:
    """Ollama's counts and nanosecond durations from the engine's usage and timings, and the call's clock."""
    usage, timings = usage or {}, timings or {}
    out = {"total_duration": int((time.perf_counter() - call.received) * 1e9),
           "load_duration": int((call.load_ms or 0) * 1e6)}
    prompt = usage.get("prompt_tokens")
    if prompt is None and "prompt_n" in timings:
        prompt = (timings.get("prompt_n") or 0) + (timings.get("cache_n") or 0)
    if prompt is not None:
        out["prompt_eval_count"] = int(prompt)
    if timings.get("prompt_ms") is not None:
        out["prompt_eval_duration"] = int(timings["prompt_ms"] * 1e6)
    completion = usage.get("completion_tokens", timings.get("predicted_n"))
    if completion is not None:
        out["eval_count"] = int(completion)
    if timings.get("predicted_ms") is not None:
        out["eval_duration"] = int(timings["predicted_ms"] * 1e6)
    return out


def _arguments(text: str | None) -> dict[str, Any] | None:
    """OpenAI's argument string → Ollama's object; None when it is not one (a call cut short by num_predict)."""
    try:
        args = orjson.loads(text or "{}")
    except orjson.JSONDecodeError:
        return None
    return args if isinstance(args, dict) else None


def _ollama_calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Whole calls only, as Ollama sends them: one whose arguments are not an object (cut off by num_predict, which
    done_reason "length" says) is dropped rather than handed to a client that would run it."""
    out: list[dict[str, Any]] = []
    for c in calls:
        fn = c.get("function") or {}
        args = _arguments(fn.get("arguments"))
        if args is None:
            continue
        call: dict[str, Any] = {"function": {"index": len(out), "name": fn.get("name") or "", "arguments": args}}
        if c.get("id"):
            call["id"] = c["id"]
        out.append(call)
    return out


def _token(t: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"token": t.get("token") or "", "logprob": t.get("logprob", 0.0)}
    if t.get("bytes") is not None:
        out["bytes"] = t["bytes"]
    return out


def ollama_logprobs(logprobs: Any, top: int = 0) -> list[dict[str, Any]] | None:
    """The engine's `choices[].logprobs.content` (OpenAI's shape) → Ollama's `logprobs` list, with `top` alternatives
    per token as asked (llama-server sends its own number whatever was asked); None when absent."""
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not content:
        return None
    out = []
    for t in content:
        entry = _token(t)
        if top and t.get("top_logprobs"):
            entry["top_logprobs"] = [_token(alt) for alt in t["top_logprobs"][:top]]
        out.append(entry)
    return out


def _first_choice(answer: dict[str, Any]) -> dict[str, Any]:
    choices = answer.get("choices") or [{}]
    return choices[0] or {}


def chat_reply(answer: dict[str, Any], model: str, call: CallTimes, top_logprobs: int = 0) -> dict[str, Any]:
    """A whole /v1/chat/completions answer → Ollama's /api/chat reply."""
    choice = _first_choice(answer)
    m = choice.get("message") or {}
    message: dict[str, Any] = {"role": "assistant", "content": m.get("content") or ""}
    if m.get("reasoning_content"):
        message["thinking"] = m["reasoning_content"]
    if m.get("tool_calls"):
        message["tool_calls"] = _ollama_calls(m["tool_calls"])
    out = {"model": model, "created_at": _now(), "message": message, "done": True,
           "done_reason": _done_reason(choice.get("finish_reason")),
           **_stats(answer.get("usage"), answer.get("timings"), call)}
    if (lp := ollama_logprobs(choice.get("logprobs"), top_logprobs)) is not None:
        out["logprobs"] = lp
    return out


def generate_reply(answer: dict[str, Any], model: str, call: CallTimes, top_logprobs: int = 0) -> dict[str, Any]:
    """A whole /v1/chat/completions or /v1/completions answer → Ollama's /api/generate reply."""
    choice = _first_choice(answer)
    m = choice.get("message") or {}
    out: dict[str, Any] = {"model": model, "created_at": _now(),
                           "response": (m.get("content") if m else choice.get("text")) or ""}
    if m.get("reasoning_content"):
        out["thinking"] = m["reasoning_content"]
    out.update(done=True, done_reason=_done_reason(choice.get("finish_reason")),
               **_stats(answer.get("usage"), answer.get("timings"), call))
    if (lp := ollama_logprobs(choice.get("logprobs"), top_logprobs)) is not None:
        out["logprobs"] = lp
    return out


class _Stream(ABC):
    """The shared state of an NDJSON translation: usage, timings, the finish reason, tool-call fragments."""

    content_type = "application/x-ndjson"

    def __init__(self, model: str, call: CallTimes, top_logprobs: int = 0) -> None:
        self.model, self.call, self.top_logprobs = model, call, top_logprobs
        self.usage: dict[str, Any] | None = None
        self.timings: dict[str, Any] | None = None
        self.finish: Any = None
        self.calls: dict[int, dict[str, Any]] = {}  # index → {"id", "name", "arguments"} being assembled
        self._stamp_ms = -1
        self._stamp = ""

    def stamp(self) -> str:
        """created_at for a line, formatted once per millisecond: the per-chunk path stays cheap."""
        ms = time.time_ns() // 1_000_000
        if ms != self._stamp_ms:
            self._stamp_ms, self._stamp = ms, _now()
        return self._stamp

    def take(self, chunk: dict[str, Any]) -> dict[str, Any] | None:
        """Record usage/timings/finish/tool fragments; return the chunk's first choice (None when it has none)."""
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        if chunk.get("timings"):
            self.timings = chunk["timings"]
        choices = chunk.get("choices")
        if not choices:
            return None
        choice = choices[0] or {}
        for frag in (choice.get("delta") or {}).get("tool_calls") or ():
            slot = self.calls.setdefault(frag.get("index", len(self.calls)), {"id": "", "name": "", "arguments": ""})
            fn = frag.get("function") or {}
            slot["id"] = frag.get("id") or slot["id"]
            slot["name"] += fn.get("name") or ""
            slot["arguments"] += fn.get("arguments") or ""
        if choice.get("finish_reason"):
            self.finish = choice["finish_reason"]
        return choice

    def flush_calls(self) -> list[dict[str, Any]] | None:
        if not self.calls:
            return None
        calls = [{"id": c["id"], "function": {"name": c["name"], "arguments": c["arguments"]}}
                 for _, c in sorted(self.calls.items())]
        self.calls = {}
        return _ollama_calls(calls)

    def final(self) -> dict[str, Any]:
        return {"done": True, "done_reason": _done_reason(self.finish), **_stats(self.usage, self.timings, self.call)}

    def heartbeat(self) -> bytes:
        return b""  # NDJSON has no line a client would skip (Ollama sends nothing while it reads a prompt)

    def error(self, message: str) -> bytes:
        return ndjson({"error": message})

    @abstractmethod
    def line(self, text: str, thinking: str | None = None, logprobs: list[dict[str, Any]] | None = None) -> bytes:
        """One not-done line carrying generated text (or thinking), in the route's own shape, with the log
        probabilities of its tokens when asked for."""

    @abstractmethod
    def end(self) -> bytes:
        """The last line: done, with the statistics."""

    def calls_line(self) -> bytes:
        """The assembled tool calls as one line, once the finish arrives (/api/chat only)."""
        return b""

    def event(self, chunk: dict[str, Any]) -> bytes:
        choice = self.take(chunk)
        if choice is None:
            return b""
        delta = choice.get("delta") or {}
        out = b""
        if delta.get("reasoning_content"):
            out += self.line("", thinking=delta["reasoning_content"])
        text = delta.get("content") or choice.get("text")  # chat deltas, or /v1/completions (raw) text
        if text:
            out += self.line(text, logprobs=ollama_logprobs(choice.get("logprobs"), self.top_logprobs))
        if choice.get("finish_reason"):
            out += self.calls_line()
        return out


class ChatStream(_Stream):
    """The engine's chat chunks → /api/chat NDJSON lines; tool calls are sent whole, once, at the finish."""

    def line(self, text: str, thinking: str | None = None, logprobs: list[dict[str, Any]] | None = None) -> bytes:
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if thinking is not None:
            message["thinking"] = thinking
        return self._line(message, logprobs)

    def _line(self, message: dict[str, Any], logprobs: list[dict[str, Any]] | None = None) -> bytes:
        line: dict[str, Any] = {"model": self.model, "created_at": self.stamp(), "message": message, "done": False}
        if logprobs is not None:
            line["logprobs"] = logprobs
        return ndjson(line)

    def calls_line(self) -> bytes:
        calls = self.flush_calls()
        return self._line({"role": "assistant", "content": "", "tool_calls": calls}) if calls else b""

    def end(self) -> bytes:
        return self.calls_line() + ndjson({"model": self.model, "created_at": self.stamp(),
                                           "message": {"role": "assistant", "content": ""}, **self.final()})


class GenerateStream(_Stream):
    """The engine's chat or /v1/completions chunks → /api/generate NDJSON lines."""

    def line(self, text: str, thinking: str | None = None, logprobs: list[dict[str, Any]] | None = None) -> bytes:
        line: dict[str, Any] = {"model": self.model, "created_at": self.stamp(), "response": text}
        if thinking is not None:
            line["thinking"] = thinking
        line["done"] = False
        if logprobs is not None:
            line["logprobs"] = logprobs
        return ndjson(line)

    def end(self) -> bytes:
        return ndjson({"model": self.model, "created_at": self.stamp(), "response": "", **self.final()})


def done_without_engine(model: str, reason: str, *, chat: bool) -> dict[str, Any]:
    """The answer to a request that only loads (reason "load") or unloads ("unload") the model."""
    empty: Any = {"role": "assistant", "content": ""} if chat else ""
    return {"model": model, "created_at": _now(), "message" if chat else "response": empty, "done": True,
            "done_reason": reason}


# ---------------------------------------------------------------------------------------------- embeddings

def embed_request(body: dict[str, Any]) -> tuple[str, dict[str, Any], Any, bool]:
    """/api/embed → (model, the engine's /v1/embeddings body, keep_alive, truncate). `dimensions`, when given,
    travels in the body for `embed_reply` (llama-server ignores it)."""
    checked(EmbedRequest, body)
    model = _model(body)
    text = body.get("input")
    if text is None:
        text = []
    if not isinstance(text, str) and not (isinstance(text, list) and all(isinstance(s, str) for s in text)):
        raise DialectError("input: expected a string or a list of strings")
    truncate = body.get("truncate", True)
    if not isinstance(truncate, bool):
        raise DialectError("truncate: expected true or false")
    map_options(body.get("options"))  # validated like Ollama; sampling means nothing to an embedding
    keep = parse_keep_alive(body.get("keep_alive"))
    engine: dict[str, Any] = {"model": model, "input": text}
    dims = body.get("dimensions")
    if dims is not None:
        if isinstance(dims, bool) or not isinstance(dims, int) or dims < 1:
            raise DialectError("dimensions: expected an integer >= 1")
        engine["dimensions"] = dims
    return model, engine, keep, truncate


def _shorten(vec: list[float], dims: int | None) -> list[float]:
    """Ollama's `dimensions`: keep the first N values and scale back to unit length."""
    if dims is None or dims >= len(vec):
        return vec
    head = vec[:dims]
    norm = math.sqrt(sum(x * x for x in head))
    return [x / norm for x in head] if norm else head


def embed_reply(answer: dict[str, Any], model: str, call: CallTimes, dimensions: int | None = None
                ) -> dict[str, Any]:
    """A /v1/embeddings answer → Ollama's /api/embed reply (vectors in input order)."""
    rows = sorted(answer.get("data") or [], key=lambda d: d.get("index", 0))
    usage = answer.get("usage") or {}
    return {"model": model, "embeddings": [_shorten(d.get("embedding") or [], dimensions) for d in rows],
            "total_duration": int((time.perf_counter() - call.received) * 1e9),
            "load_duration": int((call.load_ms or 0) * 1e6),
            "prompt_eval_count": int(usage.get("prompt_tokens") or 0)}


def embeddings_request(body: dict[str, Any]) -> tuple[str, dict[str, Any], Any]:
    """The legacy /api/embeddings ({"model", "prompt"}) → (model, the engine's /v1/embeddings body, keep_alive)."""
    checked(EmbeddingsRequest, body)
    model = _model(body)
    prompt = body.get("prompt")
    if prompt is None:
        prompt = ""
    if not isinstance(prompt, str):
        raise DialectError("prompt: expected a string")
    map_options(body.get("options"))
    return model, {"model": model, "input": prompt}, parse_keep_alive(body.get("keep_alive"))


def embeddings_reply(answer: dict[str, Any]) -> dict[str, Any]:
    data = answer.get("data") or [{}]
    return {"embedding": data[0].get("embedding") or []}
