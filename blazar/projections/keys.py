"""The `keys` projection: every API key by name (its prefix, salt and hash, scope, limits, admin flag, expiry, revoked
or not) and an index from the live keys' prefixes to their names, so the daemon checks a secret with one dict lookup
and one HMAC (blazar/api/auth.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from blazar.events.base import Recorded
from blazar.events.keys import KeyCreated, KeyLimitsChanged, KeyRevoked, KeyRotated
from blazar.projections.base import Projection, State, TypedState

LIMIT_FIELDS = (
    "models", "rpm", "tpm", "daily_tokens", "max_concurrent", "daily_audio_s", "cache_group", "may_prioritize",
    "max_storage_bytes", "max_open_batches",
)


class KeysState(TypedState):
    """The `keys` projection's state, read through `key`, `keys`, `live_by_prefix`, `prefixes_in_use`, `auth_on`."""

    __slots__ = ()


class KeysProjection(Projection[State]):
    name = "keys"
    state_type = KeysState
    version = 3  # 2: cache groups and the right to prioritize; 3: what a key may hold (storage, open batches)
    types = frozenset({KeyCreated.TYPE, KeyRotated.TYPE, KeyRevoked.TYPE, KeyLimitsChanged.TYPE})

    def initial(self) -> State:
        return {"keys": {}, "by_prefix": {}, "live": 0}

    def apply(self, state: State, rec: Recorded) -> State:
        ev = rec.event
        keys: dict[str, dict[str, Any]] = state["keys"]
        by_prefix: dict[str, str] = state["by_prefix"]
        if isinstance(ev, KeyCreated):
            old = keys.get(ev.name)
            if old is not None and by_prefix.get(old["prefix"]) == ev.name:
                by_prefix.pop(old["prefix"])
            keys[ev.name] = {
                "name": ev.name, "prefix": ev.prefix, "salt": ev.salt, "hash": ev.hash, "models": list(ev.models),
                "rpm": ev.rpm, "tpm": ev.tpm, "daily_tokens": ev.daily_tokens, "max_concurrent": ev.max_concurrent,
                "daily_audio_s": ev.daily_audio_s, "admin": ev.admin, "expires_ts": ev.expires_ts,
                "cache_group": ev.cache_group, "max_storage_bytes": ev.max_storage_bytes,
                "max_open_batches": ev.max_open_batches,
                "may_prioritize": ev.may_prioritize, "created_ts": rec.ts, "rotated_ts": None,
                "revoked": False, "revoked_ts": None, "actor": rec.actor,
            }
            by_prefix[ev.prefix] = ev.name
        else:
            assert isinstance(ev, KeyRotated | KeyRevoked | KeyLimitsChanged)
            key = keys.get(ev.name)
            if key is None or key["revoked"]:
                return state  # a change to an unknown or revoked key changes nothing (the handler refuses it)
            if isinstance(ev, KeyRotated):
                if by_prefix.get(key["prefix"]) == ev.name:
                    by_prefix.pop(key["prefix"])
                key.update(prefix=ev.prefix, salt=ev.salt, hash=ev.hash, rotated_ts=rec.ts)
                by_prefix[ev.prefix] = ev.name
            elif isinstance(ev, KeyRevoked):
                key.update(revoked=True, revoked_ts=rec.ts)
                if by_prefix.get(key["prefix"]) == ev.name:
                    by_prefix.pop(key["prefix"])
            else:
                assert isinstance(ev, KeyLimitsChanged)
                for field, value in ev.changed.items():
                    if field in LIMIT_FIELDS:
                        key[field] = list(value or []) if field == "models" else value
        state["live"] = sum(1 for k in keys.values() if not k["revoked"])
        return state

    def view(self, state: State) -> Any:
        """`blazar state` shows no salt or hash."""
        return {"keys": {n: _public(k) for n, k in state["keys"].items()}, "live": state["live"]}


def _public(key: dict[str, Any]) -> dict[str, Any]:
    """A key's row without its salt and hash."""
    return {k: v for k, v in key.items() if k not in ("salt", "hash")}


@dataclass(frozen=True, slots=True)
class ApiKey:
    """A key, typed: what auth, the gateway and the key commands read instead of the state's dicts."""

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
    daily_audio_s: int | None = None
    max_storage_bytes: int | None = None  # None: key_storage_max_mib
    max_open_batches: int | None = None  # None: key_open_batches_max
    rotated_ts: float | None = None
    revoked_ts: float | None = None
    actor: str = ""  # who created it

    def public(self) -> dict[str, Any]:
        """The key as `blazar keys --json` shows it: every field but its salt and hash."""
        return {"name": self.name, "prefix": self.prefix, "models": list(self.models), "rpm": self.rpm,
                "tpm": self.tpm, "daily_tokens": self.daily_tokens, "max_concurrent": self.max_concurrent,
                "daily_audio_s": self.daily_audio_s, "max_storage_bytes": self.max_storage_bytes,
                "max_open_batches": self.max_open_batches, "admin": self.admin, "expires_ts": self.expires_ts,
                "cache_group": self.cache_group,
                "may_prioritize": self.may_prioritize, "created_ts": self.created_ts, "rotated_ts": self.rotated_ts,
                "revoked": self.revoked, "revoked_ts": self.revoked_ts, "actor": self.actor}


def _typed(k: dict[str, Any]) -> ApiKey:
    return ApiKey(name=k["name"], prefix=k["prefix"], salt=k["salt"], hash=k["hash"],
                  models=tuple(k.get("models") or ()), rpm=k.get("rpm"), tpm=k.get("tpm"),
                  daily_tokens=k.get("daily_tokens"), max_concurrent=k.get("max_concurrent"), admin=bool(k["admin"]),
                  expires_ts=k.get("expires_ts"), revoked=bool(k["revoked"]), created_ts=float(k["created_ts"]),
                  cache_group=k.get("cache_group"), may_prioritize=bool(k.get("may_prioritize")),
                  daily_audio_s=k.get("daily_audio_s"), max_storage_bytes=k.get("max_storage_bytes"),
                  max_open_batches=k.get("max_open_batches"),
                  rotated_ts=k.get("rotated_ts"), revoked_ts=k.get("revoked_ts"), actor=str(k.get("actor") or ""))


def auth_on(state: KeysState) -> bool:
    """Auth is on as soon as one key is not revoked (an expired key still counts: expiry never opens the door)."""
    return bool(state._raw["live"])


def key(state: KeysState, name: str) -> ApiKey | None:
    """The key named `name` (revoked ones too), or None."""
    k = state._raw["keys"].get(name)
    return None if k is None else _typed(k)


def keys(state: KeysState) -> list[ApiKey]:
    """Every key (revoked ones too), by name."""
    raw = state._raw["keys"]
    return [_typed(raw[n]) for n in sorted(raw)]


def live_by_prefix(state: KeysState, prefix: str) -> ApiKey | None:
    """The live (not revoked) key whose secret starts with `prefix`: auth's one look-up."""
    name = state._raw["by_prefix"].get(prefix)
    return None if name is None else key(state, name)


def prefixes_in_use(state: KeysState) -> set[str]:
    """The prefixes of the live keys (a new secret never shares one)."""
    return set(state._raw["by_prefix"])
