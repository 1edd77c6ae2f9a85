"""Bounds on what a request may cost before anything else looks at it: JSON nesting depth, and the length and
characters of the names a request carries (model names, trace ids). Checked before a byte of it is logged; a
refused value is echoed only truncated, so bad input can never grow the append-only log."""

from __future__ import annotations

import re
from typing import Any

import falcon
import orjson

from blazar.errors import DialectError

MAX_JSON_DEPTH = 64
MAX_NAME_CHARS = 256
SHOWN_CHARS = 64
# No control characters (a trailing newline included) and no whitespace: names are tokens, not text.
_NAME_OK = re.compile(r"[^\x00-\x20\x7f]{1,256}")


def shown(value: str) -> str:
    """`value` as an error message may echo it: the first SHOWN_CHARS characters, with the length of the rest."""
    text = value if len(value) <= SHOWN_CHARS else f"{value[:SHOWN_CHARS]}…({len(value.encode())} bytes)"
    return repr(text)



def check_name(value: Any, what: str = "model") -> str:
    """A name a request uses: a string of 1..256 characters with no control characters or whitespace."""
    if not isinstance(value, str):
        raise DialectError(f"{what}: a string is expected", code="invalid_request")
    if not _NAME_OK.fullmatch(value):
        raise DialectError(f"invalid {what} name {shown(value)}: at most {MAX_NAME_CHARS} characters, with no spaces "
                           "or control characters", code="invalid_model_name" if what == "model" else "invalid_request")
    return value


def depth(value: Any) -> int:
    """How deeply `value`'s lists and objects nest (a scalar is 0), without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        level += 1
        if level > deepest:
            deepest = level
            if deepest > MAX_JSON_DEPTH:
                return deepest
        stack.extend((c, level) for c in children if isinstance(c, dict | list))
    return deepest


def check_depth(value: Any) -> Any:
    if depth(value) > MAX_JSON_DEPTH:
        raise falcon.HTTPBadRequest(description=f"the request body nests deeper than {MAX_JSON_DEPTH} levels")
    return value


def loads(data: bytes | str) -> Any:
    """orjson.loads with the nesting bound: the JSON media handler's loader for every route."""
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        if "depth limit" in str(e):  # orjson's own limit (1024) is deeper than ours: the same answer
            raise falcon.HTTPBadRequest(
                description=f"the request body nests deeper than {MAX_JSON_DEPTH} levels") from None
        raise
    return check_depth(value)
