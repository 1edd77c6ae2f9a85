"""The `keys` projection: every API key by name (its prefix, salt and hash, scope, limits, admin flag, expiry, revoked
or not) and an index from the live keys' prefixes to their names, so the daemon checks a secret with one dict lookup
and one HMAC (blazar/api/auth.py)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from blazar.events.base import Recorded
from blazar.events.keys import KeyCreated, KeyLimitsChanged, KeyRevoked, KeyRotated
from blazar.projections.base import Projection

LIMIT_FIELDS = (
    "models", "rpm", "tpm", "daily_tokens", "max_concurrent", "daily_audio_s", "cache_group", "may_prioritize", "cache",
    "max_storage_bytes", "max_open_batches", "weight",
)


@dataclass(frozen=True, slots=True)
class ApiKey:
    """A key: the state's entry, handed out as it is to auth, the gateway and the key commands (frozen; `apply`
    replaces it when it is rotated, revoked or its limits change)."""

    name: str
    prefix: str
    salt: str
    hash: str
    models: tuple[str, ...]  # fnmatch patterns of the models it may use; () for every model
    rpm: int | None
    tpm: int | None
    daily_tokens: int | None
    max_concurrent: int | None
    admin: bool
    expires_ts: float | None
    revoked: bool
    created_ts: float
    cache_group: str | None = None
    may_prioritize: bool = False
    cache: str | None = None  # the response cache: "exact", "semantic", "off", None (no say)
    daily_audio_s: int | None = None
    max_storage_bytes: int | None = None  # None: key_storage_max_mib
    max_open_batches: int | None = None  # None: key_open_batches_max
    rotated_ts: float | None = None
    revoked_ts: float | None = None
    actor: str = ""  # who created it
    weight: int = 1  # its fair share of a model's slots against other keys' (blazar/serving/fair_queue.py)

    def public(self) -> dict[str, Any]:
        """The key as `blazar keys --json` shows it: every field but its salt and hash."""
        return {"name": self.name, "prefix": self.prefix, "models": list(self.models), "rpm": self.rpm,
                "tpm": self.tpm, "daily_tokens": self.daily_tokens, "max_concurrent": self.max_concurrent,
                "daily_audio_s": self.daily_audio_s, "max_storage_bytes": self.max_storage_bytes,
                "max_open_batches": self.max_open_batches, "admin": self.admin, "expires_ts": self.expires_ts,
                "cache_group": self.cache_group, "weight": self.weight, "may_prioritize": self.may_prioritize,
                "cache": self.cache, "created_ts": self.created_ts, "rotated_ts": self.rotated_ts,
                "revoked": self.revoked, "revoked_ts": self.revoked_ts, "actor": self.actor}


@dataclass(slots=True)
class KeysState:
    """The `keys` projection's state, read through `key`, `keys`, `live_by_prefix`, `prefixes_in_use`, `auth_on`."""

    keys: dict[str, ApiKey] = field(default_factory=dict)  # by name, revoked ones too
    by_prefix: dict[str, str] = field(default_factory=dict)  # a live key's prefix -> its name
    live: int = 0  # keys not revoked: auth is on while there is one


class KeysProjection(Projection[KeysState]):
    name = "keys"
    state_type = KeysState
    # 2: cache groups and the right to prioritize; 3: what a key may hold (storage, open batches); 4: a typed state;
    # 5: a key's fair-share weight; 6: the response cache
    version = 6
    types = frozenset({KeyCreated.TYPE, KeyRotated.TYPE, KeyRevoked.TYPE, KeyLimitsChanged.TYPE})

    def initial(self) -> KeysState:
        return KeysState()

    def apply(self, state: KeysState, rec: Recorded) -> KeysState:
        ev = rec.event
        keys, by_prefix = state.keys, state.by_prefix
        if isinstance(ev, KeyCreated):
            old = keys.get(ev.name)
            if old is not None and by_prefix.get(old.prefix) == ev.name:
                by_prefix.pop(old.prefix)
            keys[ev.name] = ApiKey(
                name=ev.name, prefix=ev.prefix, salt=ev.salt, hash=ev.hash, models=tuple(ev.models), rpm=ev.rpm,
                tpm=ev.tpm, daily_tokens=ev.daily_tokens, max_concurrent=ev.max_concurrent, admin=ev.admin,
                expires_ts=ev.expires_ts, revoked=False, created_ts=rec.ts, cache_group=ev.cache_group,
                may_prioritize=ev.may_prioritize, cache=ev.cache, daily_audio_s=ev.daily_audio_s,
                max_storage_bytes=ev.max_storage_bytes, max_open_batches=ev.max_open_batches, actor=rec.actor,
                weight=ev.weight)
            by_prefix[ev.prefix] = ev.name
        else:
            assert isinstance(ev, KeyRotated | KeyRevoked | KeyLimitsChanged)
            key = keys.get(ev.name)
            if key is None or key.revoked:
                return state  # a change to an unknown or revoked key changes nothing (the handler refuses it)
            if isinstance(ev, KeyRotated):
                if by_prefix.get(key.prefix) == ev.name:
                    by_prefix.pop(key.prefix)
                keys[ev.name] = replace(key, prefix=ev.prefix, salt=ev.salt, hash=ev.hash, rotated_ts=rec.ts)
                by_prefix[ev.prefix] = ev.name
            elif isinstance(ev, KeyRevoked):
                keys[ev.name] = replace(key, revoked=True, revoked_ts=rec.ts)
                if by_prefix.get(key.prefix) == ev.name:
                    by_prefix.pop(key.prefix)
            else:
                assert isinstance(ev, KeyLimitsChanged)
                changed: dict[str, Any] = {f: tuple(v or ()) if f == "models" else v
                                           for f, v in ev.changed.items() if f in LIMIT_FIELDS}
                keys[ev.name] = replace(key, **changed)
        state.live = sum(1 for k in keys.values() if not k.revoked)
        return state

    def view(self, state: KeysState) -> Any:
        """`blazar state` shows no salt or hash."""
        return {"keys": {k.name: k.public() for k in state.keys.values()}, "live": state.live}


def auth_on(state: KeysState) -> bool:
    """Auth is on as soon as one key is not revoked (an expired key still counts: expiry never opens the door)."""
    return state.live > 0


def key(state: KeysState, name: str) -> ApiKey | None:
    """The key named `name` (revoked ones too), or None."""
    return state.keys.get(name)


def keys(state: KeysState) -> list[ApiKey]:
    """Every key (revoked ones too), by name."""
    return [k for _, k in sorted(state.keys.items())]


def live_by_prefix(state: KeysState, prefix: str) -> ApiKey | None:
    """The live (not revoked) key whose secret starts with `prefix`: auth's one look-up."""
    name = state.by_prefix.get(prefix)
    return None if name is None else state.keys.get(name)


def prefixes_in_use(state: KeysState) -> set[str]:
    """The prefixes of the live keys (a new secret never shares one)."""
    return set(state.by_prefix)
