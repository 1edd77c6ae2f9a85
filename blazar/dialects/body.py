"""A dialect's request body checked against its pydantic model before it is translated: the model is what the
OpenAPI document shows (blazar/api/openapi.py), so a type the document does not allow is refused here, as a
DialectError naming the field (a 400 in the caller's shape). The translators' own checks follow for what a JSON
schema cannot say (a role's order, a tool result's call)."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from blazar.dialects.errors import DialectError

M = TypeVar("M", bound=BaseModel)

# The JSON schemas that several bodies share: a duration as blazar/durations.py reads it.
_NUMBER_RE = r"[0-9]+(\.[0-9]+)?"
DURATION: dict[str, Any] = {
    "oneOf": [{"type": ["number", "null"]},
              {"type": "string", "pattern": rf"^[+-]?({_NUMBER_RE}|({_NUMBER_RE}(ns|us|µs|ms|s|m|h))+)$"}],
    "description": 'a duration ("5m", "1h30m", "300"), seconds, or negative for forever'}


def checked(model: type[M], body: Any) -> M:
    """`body` validated by `model`; the first problem as a DialectError ("max_tokens: input should be ...")."""
    if not isinstance(body, dict):
        raise DialectError("body: expected a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as e:
        raise DialectError(_said(e)) from None


def _said(e: ValidationError) -> str:
    """The first field at fault and what it should be. A union's members each add an error, their loc ending in the
    member's type ('system', 'str'): the field is the loc's names up to its first such tag, the message every
    member's, joined."""
    errors = e.errors(include_url=False)
    loc = errors[0]["loc"]
    where = ".".join(str(p) for p in loc[:1] + tuple(p for p in loc[1:] if isinstance(p, int))) or "body"
    said = [err["msg"] for err in errors if err["loc"][:1] == loc[:1]]
    msg = ", or ".join(dict.fromkeys(m[:1].lower() + m[1:] for m in said))
    return f"{where}: {msg}"
