"""Reading what an engine answered, once for every caller: the usage and timings of an OpenAI-shaped answer (whole,
or from the last events of a stream) and the engine's error (a refusal's body, or an error event mid-stream).
llama-server puts `timings` on the last event and `usage` where asked; other dialects' shapes are read too, since a
translated answer is read back the same way."""

from __future__ import annotations

from typing import Any

import orjson

# How much of a refusal's body is kept when it is not JSON.
ERROR_TEXT_CHARS = 300


def merge_usage(found: dict[str, Any], got: dict[str, Any]) -> None:
    """A later event's usage wins, but a finish reason seen earlier is not lost to an event without one."""
    reason = found.get("finish_reason")
    found.update(got)
    if reason and not got.get("finish_reason"):
        found["finish_reason"] = reason


def _usage_object(data: dict[str, Any]) -> Any:
    usage = data.get("usage")
    if usage is None and isinstance(data.get("message"), dict):  # Anthropic's message_start
        usage = data["message"].get("usage")
    if usage is None and isinstance(data.get("response"), dict):  # the Responses API's response.completed
        usage = data["response"].get("usage")
    return usage


def _from_usage(data: dict[str, Any], usage: dict[str, Any], out: dict[str, Any]) -> None:
    prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
    cache_read = usage.get("cache_read_input_tokens")
    if isinstance(prompt, int) and isinstance(cache_read, int):  # Anthropic counts cached input apart
        prompt += cache_read
        out["cached_tokens"] = cache_read
    out["prompt_tokens"] = prompt
    completion = usage.get("completion_tokens", usage.get("output_tokens"))
    if completion or data.get("type") != "message_start":  # message_start says 0 before any output
        out["completion_tokens"] = completion
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}
    if isinstance(details, dict) and details.get("cached_tokens") is not None:
        out["cached_tokens"] = details.get("cached_tokens")


def _from_timings(timings: dict[str, Any], out: dict[str, Any]) -> None:
    out["timings"] = {k: float(v) for k, v in timings.items() if isinstance(v, int | float)}
    out.setdefault("completion_tokens", timings.get("predicted_n"))
    if out.get("prompt_tokens") is None and "prompt_n" in timings:
        out["prompt_tokens"] = int(timings.get("prompt_n", 0)) + int(timings.get("cache_n", 0))
    if out.get("cached_tokens") is None and "cache_n" in timings:
        out["cached_tokens"] = timings.get("cache_n")


def _finish_reason(data: dict[str, Any]) -> Any:
    reason = None
    choices = data.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        reason = choices[0].get("finish_reason")
    delta = data.get("delta")  # Anthropic's is an object; the Responses API's output_text.delta is a string
    stop = data.get("stop_reason") or (delta.get("stop_reason") if isinstance(delta, dict) else None)
    return stop or reason


def usage_from_json(data: Any) -> dict[str, Any]:
    """prompt/completion/cached tokens, finish reason and the engine's timings from one answer or event."""
    if not isinstance(data, dict):
        return {}
    out: dict[str, Any] = {}
    usage = _usage_object(data)
    if isinstance(usage, dict):
        _from_usage(data, usage, out)
    timings = data.get("timings")
    if isinstance(timings, dict):
        _from_timings(timings, out)
    out["finish_reason"] = _finish_reason(data)
    return {k: v for k, v in out.items() if v is not None}


def usage_from_sse(tail: bytes) -> dict[str, Any]:
    """Usage from the last events of a stream: the one with `usage` wins, else the one with `timings`."""
    found: dict[str, Any] = {}
    for line in tail.split(b"\n"):
        if not line.startswith(b"data: {"):
            continue
        try:
            data = orjson.loads(line[6:])
        except orjson.JSONDecodeError:
            continue  # the first line of the kept tail may be cut
        got = usage_from_json(data)
        if got:
            merge_usage(found, got)
    return found


def error_message(err: Any) -> str:
    """The words of an engine's `error` member (an object with a message, or a bare value)."""
    if isinstance(err, dict):
        return str(err.get("message") or err)
    return str(err)


def stream_error(tail: bytes) -> str | None:
    """The engine's in-stream error event (`data: {"error": ...}`) among the last events, if it sent one."""
    for line in tail.split(b"\n"):
        if line.startswith(b'data: {"error"'):
            try:
                return error_message(orjson.loads(line[6:]).get("error"))
            except (orjson.JSONDecodeError, AttributeError):
                return line[6:ERROR_TEXT_CHARS].decode(errors="replace")
    return None


def refusal(data: bytes) -> tuple[str, str]:
    """An engine's error answer (a 4xx/5xx body): its message and its type (`engine_error` when it gives none)."""
    try:
        err = orjson.loads(data).get("error") or {}
    except (orjson.JSONDecodeError, AttributeError):
        return data[:ERROR_TEXT_CHARS].decode(errors="replace"), "engine_error"
    text = data[:ERROR_TEXT_CHARS].decode(errors="replace")
    if isinstance(err, dict):
        return str(err.get("message") or text), str(err.get("type") or "engine_error")
    return str(err), "engine_error"
