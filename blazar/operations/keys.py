"""Key commands: create, rotate, revoke, change limits. A secret is `blz_` + 256 random bits (url-safe base64); only
its 8-character prefix (the look-up index), a per-key random salt and HMAC-SHA-256(salt, secret) are recorded. The
secret is returned once, to be printed once, and is never written anywhere.

    BlazarError
    └── KeyCommandError         a key command refused: bad name, name taken, no such key, bad limit (exit 2)
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from typing import Any

from blazar.context import Blazar
from blazar.durations import parse_duration
from blazar.errors import KeyCommandError
from blazar.events.base import Recorded
from blazar.events.keys import KeyCreated, KeyLimitsChanged, KeyRevoked, KeyRotated
from blazar.projections.keys import ApiKey, key, prefixes_in_use

SECRET_PREFIX = "blz_"
PREFIX_CHARS = 8
SECRET_BYTES = 32  # 256 bits
SALT_BYTES = 16
NAME_MAX = 64
_NAME_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\Z")
_PATTERN_OK = re.compile(r"^[A-Za-z0-9._:/*?\[\]!-]+\Z")
PATTERN_MAX = 256
PATTERNS_MAX = 32  # key.created records them: blazar/events/bounds.py MODEL_PATTERNS
LIMITS = ("rpm", "tpm", "daily_tokens", "max_concurrent", "daily_audio_s", "max_storage_bytes", "max_open_batches")
# `--max-storage` sizes: bytes, or a number with one of these (binary) units.
_SIZE = re.compile(r"^\s*(?P<n>\d+(?:\.\d+)?)\s*(?P<unit>b|kib|mib|gib|tib|k|m|g|t)?\s*\Z", re.IGNORECASE)
_UNITS = {"b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30,
          "t": 1 << 40, "tib": 1 << 40}
MAX_SIZE = 1 << 50
# What `change_limits` takes besides the limits and the scope: tenancy (blazar/serving/tenancy.py).
TENANCY = ("cache_group", "may_prioritize", "weight", "cache")
WEIGHT_MAX = 1000  # a key's fair-share weight: 1 (the default) .. this
CACHE_SETTINGS = ("exact", "semantic", "off", "none")  # a key's response cache; "none": no say (the model's decides)




@dataclass(frozen=True)
class NewSecret:
    """A secret just made, with what the log keeps of it."""

    secret: str
    prefix: str
    salt: str
    hash: str


def digest(salt_hex: str, secret: str) -> str:
    """HMAC-SHA-256 of the secret under the key's salt, hex."""
    return hmac.new(bytes.fromhex(salt_hex), secret.encode(), hashlib.sha256).hexdigest()


def prefix_of(secret: str) -> str | None:
    """The look-up prefix of a presented secret, or None when it is not shaped like one of ours."""
    if not secret.startswith(SECRET_PREFIX) or len(secret) < len(SECRET_PREFIX) + PREFIX_CHARS:
        return None
    return secret[len(SECRET_PREFIX):len(SECRET_PREFIX) + PREFIX_CHARS]


def new_secret(taken: set[str] | frozenset[str] = frozenset()) -> NewSecret:
    """A fresh secret whose prefix no live key has (48 bits of prefix: a clash is rare, but never shared)."""
    for _ in range(100):
        secret = SECRET_PREFIX + secrets.token_urlsafe(SECRET_BYTES)
        prefix = prefix_of(secret)
        assert prefix is not None
        if prefix not in taken:
            salt = secrets.token_hex(SALT_BYTES)
            return NewSecret(secret=secret, prefix=prefix, salt=salt, hash=digest(salt, secret))
    raise KeyCommandError("could not draw a secret with an unused prefix")  # pragma: no cover: 100 clashes of 48 bits


def check_name(name: str) -> str:
    if not name or len(name) > NAME_MAX or not _NAME_OK.match(name):
        raise KeyCommandError(f"invalid key name {name[:NAME_MAX]!r}: 1-{NAME_MAX} characters of letters, digits, "
                              "'.', '_' and '-', starting with a letter or digit")
    return name


def check_patterns(patterns: list[str] | None) -> list[str]:
    if len(patterns or ()) > PATTERNS_MAX:
        raise KeyCommandError(f"{len(patterns or ())} model patterns; a key's scope holds at most {PATTERNS_MAX}")
    out = []
    for p in patterns or []:
        if not p or len(p) > PATTERN_MAX or not _PATTERN_OK.match(p):
            raise KeyCommandError(f"invalid model pattern {p[:PATTERN_MAX]!r}: a model name or an fnmatch glob "
                                  "(* ? [...]) of letters, digits and . _ - : /")
        out.append(p)
    return out


def check_group(group: str | None) -> str | None:
    """A cache group is named like a key (None or "": none)."""
    if group is None or group == "":
        return None
    if len(group) > NAME_MAX or not _NAME_OK.match(group):
        raise KeyCommandError(f"invalid cache group {group[:NAME_MAX]!r}: 1-{NAME_MAX} characters of letters, "
                              "digits, '.', '_' and '-', starting with a letter or digit")
    return group


def parse_size(text: str | None) -> int | None:
    """`--max-storage 1GiB|500MiB|2G|1048576`: bytes (binary units: G and GiB are 2^30); 0 stays 0."""
    if text is None:
        return None
    m = _SIZE.match(text)
    if m is None:
        raise KeyCommandError(f"--max-storage {text[:40]!r} is not a size: bytes, or a number with B, KiB, MiB, GiB or "
                              "TiB (1GiB, 500MiB)")
    n = float(m["n"]) * _UNITS[(m["unit"] or "b").lower()]
    if n > MAX_SIZE:
        raise KeyCommandError(f"--max-storage {text[:40]!r} is over 1 PiB")
    return int(n)


def check_limit(field: str, value: int | None) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        flag = "max-storage" if field == "max_storage_bytes" else field.replace("_", "-")
        raise KeyCommandError(f"--{flag} must be a whole number of at least 1 (got {value!r})")
    return value


def check_weight(value: object) -> int:
    """A key's fair-share weight: a whole number from 1 to WEIGHT_MAX."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= WEIGHT_MAX:
        raise KeyCommandError(f"--weight must be a whole number from 1 to {WEIGHT_MAX} (got {value!r})")
    return value


def expiry_ts(text: str | None, *, now: float) -> float | None:
    """`--expires 30d|12h|90m|3600`: when the key stops working, as epoch seconds."""
    if text is None:
        return None
    t = text.strip()
    try:
        seconds = float(t[:-1]) * 86400 if t.endswith("d") and t[:-1].replace(".", "", 1).isdigit() \
            else parse_duration(t)
    except ValueError as e:
        raise KeyCommandError(f"--expires: {e} (days too: 30d)") from None
    if not 0 < seconds <= 100 * 365 * 86400:
        raise KeyCommandError(f"--expires must be in the future and at most 100 years away (got {text!r})")
    return now + seconds


def _key(app: Blazar, name: str) -> ApiKey | None:
    return key(app.runner.state("keys"), name)


def _live(app: Blazar, name: str) -> ApiKey:
    found = _key(app, name)
    if found is None:
        raise KeyCommandError(f"no key named {name!r} (see `blazar keys list`)")
    if found.revoked:
        raise KeyCommandError(f"key {name!r} is revoked; create a new one with `blazar keys create`")
    return found


def _taken(app: Blazar) -> set[str]:
    return prefixes_in_use(app.runner.state("keys"))


async def create(app: Blazar, name: str, *, models: list[str] | None = None, rpm: int | None = None,
                 tpm: int | None = None, daily_tokens: int | None = None, max_concurrent: int | None = None,
                 admin: bool = False, expires: str | None = None, cache_group: str | None = None,
                 may_prioritize: bool = False, daily_audio_s: int | None = None,
                 max_storage_bytes: int | None = None, max_open_batches: int | None = None,
                 weight: int = 1, cache: str | None = None) -> tuple[Recorded, str]:
    """Record the key; returns the event and the secret (shown once, stored nowhere). `cache_group` puts it in a
    group whose keys share sessions, KV reuse and shared generations; `may_prioritize` lets it use
    X-Blazar-Priority and deadlines. `max_storage_bytes` and `max_open_batches` (None: the settings') bound what it
    may hold (blazar/serving/storage.py); `weight` is its fair share of a model's slots against other keys' (1 ..
    WEIGHT_MAX; blazar/serving/fair_queue.py)."""
    check_name(name)
    if _key(app, name) is not None:
        raise KeyCommandError(f"a key named {name!r} exists already (names are never reused, revoked ones included)")
    limits = {f: check_limit(f, v) for f, v in
              (("rpm", rpm), ("tpm", tpm), ("daily_tokens", daily_tokens), ("max_concurrent", max_concurrent),
               ("daily_audio_s", daily_audio_s), ("max_storage_bytes", max_storage_bytes),
               ("max_open_batches", max_open_batches))}
    made = new_secret(_taken(app))
    ev = KeyCreated(name=name, prefix=made.prefix, salt=made.salt, hash=made.hash, models=check_patterns(models),
                    admin=admin, expires_ts=expiry_ts(expires, now=app.clock.now()),
                    cache_group=check_group(cache_group), may_prioritize=bool(may_prioritize),
                    weight=check_weight(weight), cache=check_cache(cache), **limits)
    (rec,) = await app.record(ev)
    return rec, made.secret


def check_cache(value: Any) -> Any:
    """A key's response cache setting: "exact", "semantic", "off", or None ("none", or not given: no say of its own)."""
    if value is None or value == "none":
        return None
    if value not in CACHE_SETTINGS:
        raise KeyCommandError(f"cache is one of {', '.join(CACHE_SETTINGS)} (got {str(value)[:32]!r})")
    return value


async def rotate(app: Blazar, name: str) -> tuple[Recorded, str]:
    _live(app, name)
    made = new_secret(_taken(app))
    (rec,) = await app.record(KeyRotated(name=name, prefix=made.prefix, salt=made.salt, hash=made.hash))
    return rec, made.secret


async def revoke(app: Blazar, name: str) -> Recorded:
    _live(app, name)
    (rec,) = await app.record(KeyRevoked(name=name))
    return rec


async def change_limits(app: Blazar, name: str, changed: dict[str, Any]) -> Recorded | None:
    """`changed` maps a limit (or "models", "cache_group", "may_prioritize", "weight") to its new value; 0 for a
    limit means no limit of its own (for max_storage_bytes and max_open_batches: the settings' again), "" for the
    cache group none. None: nothing changed."""
    current = _live(app, name)
    clean: dict[str, Any] = {}
    for field, value in changed.items():
        if field == "models":
            value = check_patterns(value)
        elif field in LIMITS:
            value = None if value == 0 else check_limit(field, value)
        elif field == "cache_group":
            value = check_group(value)
        elif field == "cache":
            value = check_cache(value)
        elif field == "may_prioritize":
            if not isinstance(value, bool):
                raise KeyCommandError(f"may_prioritize is true or false (got {value!r})")
        elif field == "weight":
            value = check_weight(value)
        else:
            raise KeyCommandError(f"unknown limit {field!r}: one of models, {', '.join(LIMITS + TENANCY)}")
        had = list(current.models) if field == "models" else getattr(current, field)
        if had != value:
            clean[field] = value
    if not clean:
        return None
    (rec,) = await app.record(KeyLimitsChanged(name=name, changed=clean))
    return rec
