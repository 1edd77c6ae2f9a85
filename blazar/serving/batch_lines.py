"""A batch's input and output lines, as OpenAI's Batch API defines them. Pure: no I/O, no clock.

    input   {"custom_id": "...", "method": "POST", "url": "/v1/chat/completions", "body": {...}}   one per line
    output  {"id": "batch_req_...", "custom_id": "...", "response": {"status_code", "request_id", "body"},
             "error": null}                                                   (the output file: 2xx answers)
    error   the same for an answer that is not 2xx; a line that never ran (the batch expired) has `response` null and
            `error` {code, message}                                           (the error file)

`check` validates a whole input file up front (every line, before any runs): a batch with a bad line fails with the
problems listed, as OpenAI's does. Each line's body is checked by the route its endpoint names (`Ask`: the same
validation an interactive request meets).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import ValidationError

from blazar.errors import BlazarError
from blazar.events.batches import BatchError
from blazar.serving.request import Request

# What a batch may hold: OpenAI's own bounds.
MAX_LINES = 50_000
MAX_ERRORS = 100  # problems listed in `errors` (every line is still checked)
MAX_CUSTOM_ID = 512

# The route's validation and translation of one line's body (blazar/api/batches.py gives it): the Request skeleton,
# or a ValidationError / BlazarError / ValueError saying what is wrong.
Ask = Callable[[str, dict[str, Any]], Request]
# A checked line's Request as its owner's tenant asks it (a `/v1/responses` line reads that tenant's conversations).
Build = Callable[[str, dict[str, Any], str | None], Request]


@dataclass(frozen=True, slots=True)
class Line:
    custom_id: str
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Checked:
    lines: list[Line]
    errors: list[BatchError]
    models: list[str]


def split(data: bytes) -> list[tuple[int, bytes]]:
    """(1-based line number, text) of every line that is not blank."""
    return [(n, raw) for n, raw in enumerate(data.split(b"\n"), start=1) if raw.strip()]


def parse(data: bytes) -> list[Line]:
    """The lines of an input file that `check` accepted."""
    out = []
    for _, raw in split(data):
        obj = orjson.loads(raw)
        out.append(Line(custom_id=obj["custom_id"], body=obj["body"]))
    return out


def _problem(exc: BaseException) -> str:
    if isinstance(exc, ValidationError):
        first = exc.errors(include_url=False)[0]
        loc = ".".join(str(p) for p in first["loc"])
        return f"{loc}: {first['msg']}" if loc else str(first["msg"])
    if isinstance(exc, BlazarError):
        return exc.message
    return str(exc)


def check(data: bytes, endpoint: str, ask: Ask) -> Checked:
    """Every line of an input file checked against OpenAI's line shape and the endpoint's own validation."""
    errors: list[BatchError] = []
    lines: list[Line] = []
    models: set[str] = set()
    seen: set[str] = set()

    def bad(code: str, message: str, n: int | None, param: str | None = None) -> None:
        if len(errors) < MAX_ERRORS:
            errors.append(BatchError(code=code, message=message, line=n, param=param))

    numbered = split(data)
    if not numbered:
        bad("empty_file", "the input file holds no request lines", None)
    if len(numbered) > MAX_LINES:
        bad("too_many_requests", f"the input file holds {len(numbered)} requests; a batch may hold {MAX_LINES}", None)
        numbered = numbered[:MAX_LINES]
    for n, raw in numbered:
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            bad("invalid_json_line", f"line {n} is not valid JSON", n)
            continue
        if not isinstance(obj, dict):
            bad("invalid_json_line", f"line {n} is not a JSON object", n)
            continue
        custom_id, method, url, body = obj.get("custom_id"), obj.get("method"), obj.get("url"), obj.get("body")
        if not isinstance(custom_id, str) or not custom_id or len(custom_id) > MAX_CUSTOM_ID:
            bad("missing_required_parameter", f"line {n}: custom_id must be a non-empty string of at most "
                f"{MAX_CUSTOM_ID} characters", n, "custom_id")
            continue
        if custom_id in seen:
            bad("duplicate_custom_id", f"line {n}: the custom_id {custom_id[:64]!r} is used by an earlier line; each "
                "line's must be unique", n, "custom_id")
            continue
        seen.add(custom_id)
        if method != "POST":
            bad("invalid_method", f"line {n}: method must be POST", n, "method")
            continue
        if url != endpoint:
            bad("mismatched_endpoint", f"line {n}: url {str(url)[:80]!r} is not the batch's endpoint {endpoint}", n,
                "url")
            continue
        if not isinstance(body, dict):
            bad("missing_required_parameter", f"line {n}: body must be a JSON object", n, "body")
            continue
        if body.get("stream"):
            bad("invalid_request", f"line {n}: a batch line's answer is read whole: stream must be false", n,
                "body.stream")
            continue
        try:
            asked = ask(endpoint, body)
        except Exception as e:  # whatever a line's body makes its route raise, the line is bad
            bad("invalid_request", f"line {n}: {_problem(e)}", n, "body")
            continue
        models.add(asked.model)
        lines.append(Line(custom_id=custom_id, body=body))
    return Checked(lines=lines, errors=errors, models=sorted(models))


# -- output lines ------------------------------------------------------------------------------------------------------

def answered(custom_id: str, trace_id: str, status_code: int, body: Any) -> bytes:
    """A line the pipeline answered (any status), as its output or error file holds it."""
    return orjson.dumps({"id": f"batch_req_{secrets.token_hex(12)}", "custom_id": custom_id,
                         "response": {"status_code": status_code, "request_id": trace_id, "body": body},
                         "error": None}) + b"\n"


def expired(custom_id: str) -> bytes:
    """A line the completion window passed before it ran."""
    return orjson.dumps({"id": f"batch_req_{secrets.token_hex(12)}", "custom_id": custom_id, "response": None,
                         "error": {"code": "batch_expired", "message": "This request could not be executed before "
                                   "the completion window expired."}}) + b"\n"


def usage_of(body: Any) -> tuple[int, int]:
    """(prompt, completion) tokens of an answer: chat/completions' and embeddings' `usage`, or the Responses API's
    input/output tokens; (0, 0) without one."""
    usage = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(usage, dict):
        return 0, 0
    prompt = usage.get("prompt_tokens", usage.get("input_tokens", 0))
    completion = usage.get("completion_tokens", usage.get("output_tokens", 0))
    return (prompt if isinstance(prompt, int) else 0), (completion if isinstance(completion, int) else 0)


def window_seconds(window: str) -> float | None:
    """A completion window in seconds: OpenAI's "24h", or any other whole number of hours, minutes or seconds
    ("1h", "30m", "90s"); None for anything else."""
    text = window.strip()
    if len(text) < 2 or not text.isascii() or not text[:-1].isdigit() or text[-1] not in "hms":
        return None
    n = int(text[:-1])
    seconds = n * {"h": 3600, "m": 60, "s": 1}[text[-1]]
    return float(seconds) if 0 < seconds <= 7 * 86400 else None
