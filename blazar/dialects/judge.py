"""Judging a whole chat answer, for best-of-N and cascades: is it valid (it stopped rather than being cut off, its
content follows the requested schema, a tool call's arguments are JSON), and how confident was the model (the mean
log-probability of its tokens, from the engine's `logprobs`). Pure: the answer in, the judgement out."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import orjson
from jsonschema import validators

_FINISHED = ("stop", "tool_calls")


@dataclass(frozen=True, slots=True)
class Judgement:
    valid: bool
    reason: str | None  # why not valid
    finish_reason: str | None
    mean_logprob: float | None
    completion_tokens: int | None

    @property
    def rank(self) -> tuple[bool, float]:
        """Validity first, then confidence: a larger rank is a better answer."""
        return (self.valid, self.mean_logprob if self.mean_logprob is not None else -math.inf)


def schema_of(body: dict[str, Any]) -> dict[str, Any] | bool | None:
    """The schema an answer to this engine body must follow (json_object: any object), or None."""
    rf = body.get("response_format")
    if isinstance(rf, dict):
        if rf.get("type") == "json_schema":
            spec = rf.get("json_schema")
            schema = spec.get("schema") if isinstance(spec, dict) else None
            return schema if isinstance(schema, dict | bool) else True
        if rf.get("type") == "json_object":
            return {"type": "object"}
    schema = body.get("json_schema")
    return schema if isinstance(schema, dict) else None


def mean_logprob(choice: dict[str, Any]) -> float | None:
    """The mean log-probability of the choice's tokens (OpenAI's `logprobs.content[].logprob`)."""
    content = (choice.get("logprobs") or {}).get("content")
    if not isinstance(content, list):
        return None
    values = [t["logprob"] for t in content if isinstance(t, dict) and isinstance(t.get("logprob"), int | float)
              and math.isfinite(t["logprob"])]
    return sum(values) / len(values) if values else None


def judge(answer: Any, schema: dict[str, Any] | bool | None) -> Judgement:
    """Validity and confidence of a chat completion's first choice."""
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return Judgement(False, "the engine's answer has no choice", None, None, None)
    choice = choices[0]
    finish = choice.get("finish_reason")
    got = answer.get("usage")
    usage: dict[str, Any] = got if isinstance(got, dict) else {}
    tokens = usage.get("completion_tokens") if isinstance(usage.get("completion_tokens"), int) else None
    lp = mean_logprob(choice)

    def invalid(why: str) -> Judgement:
        return Judgement(False, why, finish, lp, tokens)

    if finish not in _FINISHED:
        return invalid("cut off at max_tokens" if finish == "length" else f"finished with {finish!r}")
    raw = choice.get("message")
    message: dict[str, Any] = raw if isinstance(raw, dict) else {}
    for call in message.get("tool_calls") or []:
        args = (call.get("function") or {}).get("arguments") if isinstance(call, dict) else None
        try:
            orjson.loads(args if isinstance(args, str) else "")
        except orjson.JSONDecodeError:
            return invalid("a tool call's arguments are not JSON")
    if schema is not None and not message.get("tool_calls"):
        why = _schema_problem(message.get("content"), schema)
        if why is not None:
            return invalid(why)
    return Judgement(True, None, finish, lp, tokens)


def _schema_problem(content: Any, schema: dict[str, Any] | bool) -> str | None:
    try:
        data = orjson.loads(content if isinstance(content, str) else "")
    except orjson.JSONDecodeError:
        return "its content is not JSON"
    if isinstance(schema, bool):
        return None if schema else "the schema accepts nothing"
    validator = validators.validator_for(schema)(schema)
    error = next(iter(validator.iter_errors(data)), None)
    if error is None:
        return None
    where = ".".join(str(p) for p in error.absolute_path)
    return f"does not follow the schema{' at ' + where if where else ''}: {error.message[:200]}"


def winner(judgements: list[Judgement]) -> tuple[int, str]:
    """The best judgement's index and, in words, why it won."""
    best = max(range(len(judgements)), key=lambda i: (judgements[i].rank, -i))
    j = judgements[best]
    valid = [x for x in judgements if x.valid]
    score = f"mean logprob {j.mean_logprob:.3f}" if j.mean_logprob is not None else "no logprobs"
    if not j.valid:
        return best, f"no candidate was valid; the most confident ({score})"
    if len(valid) == 1 and len(judgements) > 1:
        return best, f"the only valid one ({score})"
    others = [x.mean_logprob for x in valid if x is not j and x.mean_logprob is not None]
    if others:
        return best, f"valid and the most confident ({score}, the next {max(others):.3f})"
    return best, f"valid ({score})"
