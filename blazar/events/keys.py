"""Events about API keys: created, rotated, revoked, limits changed. Only the secret's prefix, a per-key salt and
the HMAC-SHA-256 of the secret under that salt are recorded, never the secret; the audit trail shows the prefix
only. Stream `key:<name>`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from blazar.events.base import Event
from blazar.events.bounds import MODEL_PATTERNS, Bound
from blazar.events.types import register

# What audit_details leaves out of every key event: a hash and its salt are no one's business outside the daemon.
_SECRET_FIELDS = frozenset({"salt", "hash"})


class _KeyEvent(Event):
    AUDIT = True

    name: str

    def stream_key(self) -> str:
        return f"key:{self.name}"

    def audit_details(self) -> dict[str, Any]:
        return {k: v for k, v in self.model_dump(mode="json").items() if k not in _SECRET_FIELDS}


@register
class KeyCreated(_KeyEvent):
    """A key exists. `prefix` is the 8 characters after "blz_"; `hash` = HMAC-SHA-256(salt, secret), hex. The audit
    shows neither salt nor hash."""

    TYPE = "key.created"

    prefix: str
    salt: str
    hash: str
    # fnmatch-style globs over model names; empty: every model
    models: Annotated[list[str], MODEL_PATTERNS] = Field(default_factory=list)
    rpm: int | None = None
    tpm: int | None = None
    daily_tokens: int | None = None
    max_concurrent: int | None = None
    daily_audio_s: int | None = None  # seconds of audio (speech in or out) per UTC day
    admin: bool = False
    expires_ts: float | None = None
    # Keys are tenants: a key's prompts reuse KV only with its own (or its cache group's: keys an admin put in one
    # group on purpose share sessions, KV reuse and shared generations).
    cache_group: str | None = None
    may_prioritize: bool = False  # X-Blazar-Priority and deadlines are honoured only for such a key
    # The response cache for its deterministic requests: "exact" on, "semantic" on with similar prompts' answers
    # too, "off" off, None: no say (the model's decides).
    cache: Literal["exact", "semantic", "off"] | None = None
    # What it may hold (blazar/serving/storage.py); None: the settings' key_storage_max_mib, key_open_batches_max.
    max_storage_bytes: int | None = None  # its files and its batches' output and error files
    max_open_batches: int | None = None
    # Its share of a model's slots against other keys' at the same priority (blazar/serving/fair_queue.py): a key of
    # weight 3 is served three times the tokens of a key of weight 1 while both wait.
    weight: int = Field(default=1, ge=1, le=1000)


@register
class KeyRotated(_KeyEvent):
    """The key has a new secret; the old one stops working at once."""

    TYPE = "key.rotated"

    prefix: str
    salt: str
    hash: str


@register
class KeyRevoked(_KeyEvent):
    """The key stops working at once; its limits and history stay in the log."""

    TYPE = "key.revoked"


@register
class KeyLimitsChanged(_KeyEvent):
    """Only the fields in `changed` were set (a None in it means: no limit any more, or for `max_storage_bytes` and
    `max_open_batches` the settings' again; `cache_group` None: none, `may_prioritize` a bool, `weight` an int,
    `cache` "exact", "semantic", "off" or None: no say)."""

    TYPE = "key.limits_changed"

    changed: Annotated[dict[str, Any], Bound(MODEL_PATTERNS.json + 2048)]  # a limit, the patterns, ...
