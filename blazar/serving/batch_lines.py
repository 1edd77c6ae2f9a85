"""A batch's input and output lines, as OpenAI's Batch API defines them. Pure: no I/O, no clock (the input's lines
come from blazar/serving/batch_input.py, read from disk one at a time).

    input   {"custom_id": "...", "method": "POST", "url": "/v1/chat/completions", "body": {...}}   one per line
    output  {"id": "batch_req_...", "custom_id": "...", "response": {"status_code", "request_id", "body"},
             "error": null}                                                   (the output file: 2xx answers)
    error   the same for an answer that is not 2xx; a line that never ran (the batch expired) has `response` null and
            `error` {code, message}                                           (the error file)

`check` validates a whole input file up front (every line, before any runs): a batch with a bad line fails with the
problems listed, as OpenAI's does. Each line's body is checked by the route its endpoint names (`Ask`: the same
validation an interactive request meets). It keeps no line: what it returns is each line's byte offset (8 bytes a
line), the problems (at most MAX_ERRORS, each message at most MAX_MESSAGE characters) and the models the lines name
(at most MAX_MODELS_LISTED of them, and how many there are): what `batch.validated` and `batch.failed` record is
bounded whatever the file holds.
"""

from __future__ import annotations

import bisect
import hashlib
import secrets
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import ValidationError

from blazar.errors import BlazarError
from blazar.events.batches import MAX_ERRORS_LISTED, MAX_MODELS_LISTED, BatchError
from blazar.serving.batch_input import Span
from blazar.serving.request import Request

# What a batch may hold: OpenAI's own bounds.
MAX_LINES = 50_000
MAX_ERRORS = MAX_ERRORS_LISTED  # problems listed in `errors` (every line is still checked)
MAX_CUSTOM_ID = 512
MAX_WINDOW_CHARS = 16  # "604800s" is 7; a completion_window is recorded in batch.created, so it is bounded
MAX_MESSAGE = 240  # characters of one problem's message: a body's own words (a model name, a value) are cut there

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
    offsets: array[int]  # the byte offset of each request line, in order (line i of the batch starts at offsets[i])
    errors: list[BatchError]
    models: list[str]  # the first MAX_MODELS_LISTED model names, sorted
    models_count: int  # how many distinct model names the lines hold

    @property
    def count(self) -> int:
        return len(self.offsets)


def parse(raw: bytes) -> Line:
    """A line that `check` accepted."""
    obj = orjson.loads(raw)
    return Line(custom_id=obj["custom_id"], body=obj["body"])


def _problem(exc: BaseException) -> str:
    if isinstance(exc, ValidationError):
        first = exc.errors(include_url=False)[0]
        loc = ".".join(str(p) for p in first["loc"])
        return f"{loc}: {first['msg']}" if loc else str(first["msg"])
    if isinstance(exc, BlazarError):
        return exc.message
    return str(exc)


def _digest(text: str) -> bytes:
    """What a custom_id or a model name is remembered as while the file is checked: 16 bytes, whatever its length."""
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


class _Models:
    """The distinct model names of the lines: counted (by digest), the first MAX_MODELS_LISTED in sort order kept."""

    def __init__(self) -> None:
        self.seen: set[bytes] = set()
        self.first: list[str] = []

    def add(self, name: str) -> None:
        digest = _digest(name)
        if digest in self.seen:
            return
        self.seen.add(digest)
        if len(self.first) < MAX_MODELS_LISTED or name < self.first[-1]:
            bisect.insort(self.first, name)
            del self.first[MAX_MODELS_LISTED:]


def _shape(obj: Any, n: int, endpoint: str) -> tuple[str, str, str | None] | None:
    """What is wrong with a parsed line's shape (code, message, param), custom_id's uniqueness aside; None: nothing."""
    if not isinstance(obj, dict):
        return "invalid_json_line", f"line {n} is not a JSON object", None
    custom_id, method, url, body = obj.get("custom_id"), obj.get("method"), obj.get("url"), obj.get("body")
    if not isinstance(custom_id, str) or not custom_id or len(custom_id) > MAX_CUSTOM_ID:
        return ("missing_required_parameter", f"line {n}: custom_id must be a non-empty string of at most "
                f"{MAX_CUSTOM_ID} characters", "custom_id")
    if method != "POST":
        return "invalid_method", f"line {n}: method must be POST", "method"
    if url != endpoint:
        return "mismatched_endpoint", f"line {n}: url {str(url)[:80]!r} is not the batch's endpoint {endpoint}", "url"
    if not isinstance(body, dict):
        return "missing_required_parameter", f"line {n}: body must be a JSON object", "body"
    if body.get("stream"):
        return "invalid_request", f"line {n}: a batch line's answer is read whole: stream must be false", "body.stream"
    return None


def check(lines: Iterable[Span], endpoint: str, ask: Ask, max_line_bytes: int) -> Checked:
    """Every line of an input file checked against OpenAI's line shape and the endpoint's own validation. `lines`
    are the file's request lines (batch_input.spans, their bytes kept up to `max_line_bytes`: a longer line is bad,
    as a request body over max_body_mib is)."""
    errors: list[BatchError] = []
    offsets = array("q")
    models = _Models()
    seen: set[bytes] = set()

    def bad(code: str, message: str, n: int | None, param: str | None = None) -> None:
        if len(errors) < MAX_ERRORS:
            text = message if len(message) <= MAX_MESSAGE else message[:MAX_MESSAGE - 1] + "\u2026"
            errors.append(BatchError(code=code, message=text, line=n, param=param))

    requests = 0
    for span in lines:
        requests += 1
        if requests > MAX_LINES:  # named first, whatever else is wrong (as the file's first problem)
            errors.insert(0, BatchError(code="too_many_requests", message=f"the input file holds more than "
                                        f"{MAX_LINES} requests; a batch may hold {MAX_LINES}"))
            del errors[MAX_ERRORS:]
            break
        n = span.number
        if span.data is None:
            bad("line_too_large", f"line {n} is {span.length} bytes; a request line may be at most {max_line_bytes} "
                "(server.max_body_mib)", n)
            continue
        try:
            obj = orjson.loads(span.data)
        except orjson.JSONDecodeError:
            bad("invalid_json_line", f"line {n} is not valid JSON", n)
            continue
        if (problem := _shape(obj, n, endpoint)) is not None:
            bad(*problem[:2], n, problem[2])
            continue
        custom_id = obj["custom_id"]
        digest = _digest(custom_id)
        if digest in seen:
            bad("duplicate_custom_id", f"line {n}: the custom_id {custom_id[:64]!r} is used by an earlier line; each "
                "line's must be unique", n, "custom_id")
            continue
        seen.add(digest)
        try:
            asked = ask(endpoint, obj["body"])
        except Exception as e:  # whatever a line's body makes its route raise, the line is bad
            bad("invalid_request", f"line {n}: {_problem(e)}", n, "body")
            continue
        models.add(asked.model)
        offsets.append(span.offset)
    if not requests:
        bad("empty_file", "the input file holds no request lines", None)
    return Checked(offsets=offsets, errors=errors, models=models.first, models_count=len(models.seen))


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
    ("1h", "30m", "90s"); None for anything else (a text longer than MAX_WINDOW_CHARS too: "0000...1h" is no window
    worth recording)."""
    text = window.strip()
    if not 2 <= len(text) <= MAX_WINDOW_CHARS or not text.isascii() or not text[:-1].isdigit() or text[-1] not in "hms":
        return None
    n = int(text[:-1])
    seconds = n * {"h": 3600, "m": 60, "s": 1}[text[-1]]
    return float(seconds) if 0 < seconds <= 7 * 86400 else None
