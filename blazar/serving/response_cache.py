"""The response cache's decisions and its store, pure: whether a request uses the cache (`cache_use`), what identifies
its answer (`cache_key`), and the answers kept (`AnswerStore`, least recently used first out, bounded in bytes).
The serving step that asks and fills it is blazar/serving/cache_step.py.

An answer is stored as the engine sent it (its status, its content type, its bytes: a whole body, or the SSE blocks
of a stream), so a hit is played back through the same dialect conversion as a live answer. Its key is a sha256 over
everything that decides the engine's answer: the tenant (keys are tenants: never a key's entry for another key,
unless an admin put both in one cache group), the model file (its sha256), the engine build, the posture it runs at,
its template, the engine route and the engine's body after every Patch but the slot's placement. A change to any of
them is a miss.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import orjson

CACHE_HEADER = "x-blazar-cache"
CacheUse = Literal["use", "refresh"]
CACHE_CHOICES = ("use", "refresh", "off")  # the X-Blazar-Cache header's values
SETTING_CHOICES = ("exact", "semantic", "off")  # a model's or a key's setting (unset: no say)
# Engine fields that place or tag one request and never change its answer (the slot it runs on, whether the engine
# may reuse its KV): left out of the key.
VOLATILE_FIELDS = frozenset({"id_slot", "cache_prompt", "user"})
ENTRY_OVERHEAD_BYTES = 512  # what an entry costs beside its bytes (the object, its key)


def cache_use(header: str | None, key_setting: str | None, model_setting: str | None) -> CacheUse | None:
    """Whether a request reads the cache ("use"), runs the engine and replaces the entry ("refresh"), or neither
    (None). The header decides for one request; else the key's setting, where its admin set one; else the model's.
    NOTE: `X-Blazar-Cache: use` turns the cache on for that request without any setting: asking is opting in, and the
    entry is the caller's tenant's alone."""
    if header is not None:
        return None if header == "off" else "refresh" if header == "refresh" else "use"
    setting = key_setting if key_setting is not None else model_setting
    return "use" if setting in ("exact", "semantic") else None


def deterministic(body: Mapping[str, Any]) -> bool:
    """Sampling that gives the same answer every time: temperature 0, or an explicit seed; one choice."""
    n = body.get("n")
    if n is not None and n != 1:
        return False
    t, seed = body.get("temperature"), body.get("seed")
    if isinstance(t, int | float) and not isinstance(t, bool) and t == 0:
        return True
    return isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0


@dataclass(frozen=True, slots=True)
class Identity:
    """What, beside the request, decides the engine's answer: the model's file, the engine build, the posture and
    the template it runs with."""

    model_sha256: str
    engine: str
    posture: str
    template: str


def cache_key(tenant: str | None, identity: Identity, engine_path: str, body: Mapping[str, Any], *,
              stream: bool) -> str | None:
    """The entry's key (64 hex digits), or None when the body cannot be encoded canonically. `stream`: whether the
    answer is relayed as a stream (an entry holds SSE blocks or one body, never both)."""
    asked = {k: v for k, v in body.items() if k not in VOLATILE_FIELDS}
    try:
        canon = orjson.dumps([tenant, identity.model_sha256, identity.engine, identity.posture, identity.template,
                              engine_path, stream, asked], option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return None
    return hashlib.sha256(canon).hexdigest()


@dataclass(frozen=True, slots=True)
class Entry:
    """An engine's answer as it sent it: one body (`stream` False) or the SSE blocks of a stream."""

    model: str  # the store's name: what drops it when the model goes
    status: int
    content_type: str
    stream: bool
    blocks: tuple[bytes, ...]
    served_as: str | None  # the engine's name for the model in those bytes (the client's is put in on a hit)
    stored_at: float  # wall-clock seconds

    @property
    def size(self) -> int:
        return sum(len(b) for b in self.blocks) + ENTRY_OVERHEAD_BYTES


class AnswerStore:
    """Answers by key, least recently used dropped first once their bytes pass `max_bytes`."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: OrderedDict[str, Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def get(self, key: str) -> Entry | None:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def put(self, key: str, entry: Entry) -> bool:
        """Keep `entry` under `key` (replacing what was there); False when it alone is over the bound."""
        self._drop(key)
        if entry.size > self.max_bytes:
            return False
        self._entries[key] = entry
        self.bytes += entry.size
        while self.bytes > self.max_bytes:
            oldest = next(iter(self._entries))
            self._drop(oldest)
        return True

    def bound(self, max_bytes: int) -> None:
        """A new bound (the setting changed): the oldest go until the rest fits."""
        self.max_bytes = max_bytes
        while self.bytes > self.max_bytes and self._entries:
            self._drop(next(iter(self._entries)))

    def drop_model(self, model: str) -> int:
        """Every entry of `model` dropped (it was removed or replaced); how many."""
        gone = [k for k, e in self._entries.items() if e.model == model]
        for key in gone:
            self._drop(key)
        return len(gone)

    def _drop(self, key: str) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.bytes -= entry.size
