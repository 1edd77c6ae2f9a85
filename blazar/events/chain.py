"""The hash chain shared by the audit export and archive segments: each line's sha256 covers its canonical JSON
(sorted keys, compact) including the previous line's hash (`prev`), so an edited, dropped, inserted or reordered
line is found at the first line whose hash or `prev` does not match."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import orjson

GENESIS = "0" * 64


def line_hash(obj: Mapping[str, Any]) -> str:
    """sha256 of the line's canonical JSON (sorted keys, compact) without its own `hash`; it covers `prev`."""
    body = {k: v for k, v in obj.items() if k != "hash"}
    return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()


def seal(body: Mapping[str, Any], prev: str) -> tuple[bytes, str]:
    """The JSONL line for `body` chained after `prev`, and its hash."""
    obj = {**body, "prev": prev}
    digest = line_hash(obj)
    obj["hash"] = digest
    return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS | orjson.OPT_APPEND_NEWLINE), digest
