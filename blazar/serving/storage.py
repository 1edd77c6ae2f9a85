"""A key's storage quota and its cap on open batches (docs/15.BATCHES.md, "What a key may hold"): checked before an
upload is kept, before a batch is made, and before a batch line's result is written.

    used      what the log says the key holds (blazar/projections/batches.py `storage_used`): its files (uploads, its
              batches' output and error files), the results its open batches' lines wrote so far, the input an
              open batch still holds on disk
    pending   what this process is putting on disk for it and has not recorded yet (an upload being kept, a line's
              result being written), and the batches it is making: the `Ledger`, one per home in a process, so two
              uploads (or an upload and a line) at once cannot both take the last of the room

A key's limits are its own (`blazar keys create|limits --max-storage SIZE --max-open-batches N`), else the settings'
(`key_storage_max_mib`, `key_open_batches_max`; 0: none). The machine's owner (keys off, the CLI's credential) has
neither, as it has no rate limits.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from blazar.config import Settings
from blazar.errors import Refused
from blazar.paths import Paths
from blazar.projections.batches import BatchesState, open_count, storage_used
from blazar.projections.keys import ApiKey

OPEN_BATCHES_RETRY_S = 60.0  # a batch ends when its lines do: nothing says when, so a minute


@dataclass(frozen=True, slots=True)
class Limit:
    """A limit and where it comes from: the key's own option, or the setting that applies to keys without one."""

    value: int
    source: str  # "max_storage" (the key's), "key_storage_max_mib" (the setting's), ...


def storage_limit(key: ApiKey | None, settings: Settings) -> Limit | None:
    """The bytes `key` may hold; None: no limit (the machine's owner, or a setting of 0)."""
    if key is None:
        return None
    if key.max_storage_bytes is not None:
        return Limit(key.max_storage_bytes, "its max_storage")
    mib = settings.keys.key_storage_max_mib
    return Limit(mib << 20, "key_storage_max_mib") if mib else None


def open_batches_limit(key: ApiKey | None, settings: Settings) -> Limit | None:
    """How many open batches `key` may have; None: no cap."""
    if key is None:
        return None
    if key.max_open_batches is not None:
        return Limit(key.max_open_batches, "its max_open_batches")
    n = settings.keys.key_open_batches_max
    return Limit(n, "key_open_batches_max") if n else None


class Ledger:
    """What this process is putting into the content store for each owner, not yet in the log: bytes on their way,
    and batches being made. Held across the awaits between a check and its record, released once the log has it."""

    def __init__(self) -> None:
        self._bytes: Counter[str] = Counter()
        self._batches: Counter[str] = Counter()

    def pending_bytes(self, owner: str) -> int:
        return self._bytes[owner]

    def pending_batches(self, owner: str) -> int:
        return self._batches[owner]

    @contextlib.contextmanager
    def holding_bytes(self, owner: str, n: int) -> Iterator[None]:
        self._bytes[owner] += n
        try:
            yield
        finally:
            self._bytes[owner] -= n
            if self._bytes[owner] <= 0:
                del self._bytes[owner]

    @contextlib.contextmanager
    def holding_batch(self, owner: str) -> Iterator[None]:
        self._batches[owner] += 1
        try:
            yield
        finally:
            self._batches[owner] -= 1
            if self._batches[owner] <= 0:
                del self._batches[owner]


# NOTE: one ledger per home in a process, found by the home's data directory: the upload route and the batch runner
# are built apart (blazar/api/files.py, blazar/bootstrap.py) and must share it; tests run several homes in one
# process, each with its own.
_LEDGERS: dict[Path, Ledger] = {}


def ledger(paths: Paths) -> Ledger:
    return _LEDGERS.setdefault(paths.data_dir.resolve(), Ledger())


@dataclass(frozen=True, slots=True)
class Storage:
    """What an owner holds (recorded and on its way) against its limit."""

    owner: str
    used: int
    limit: Limit | None

    @property
    def room(self) -> int | None:
        """Bytes it may still add; None: no limit."""
        return None if self.limit is None else max(0, self.limit.value - self.used)

    def fits(self, adding: int) -> bool:
        return self.limit is None or self.used + adding <= self.limit.value

    def refusal(self, what: str, adding: int | None = None) -> Refused:
        """A 413 naming the numbers (`what` says what does not fit): nothing but deleting files makes room, so not a
        429, which SDKs retry by themselves."""
        assert self.limit is not None
        return Refused(f"{_who(self.owner)} holds {self.used} of the {self.limit.value} bytes of storage "
                       f"({_mib(self.used)} of {_mib(self.limit.value)}, {self.limit.source}) that its files and its "
                       f"batches' output count against: {what}; delete files (DELETE /v1/files/{{file_id}}) to make "
                       "room", reason="storage_quota_exceeded", http_status=413,
                       observations={"key": self.owner.removeprefix("key:"), "used_bytes": self.used,
                                     "limit_bytes": self.limit.value, "adding_bytes": adding,
                                     "limit": self.limit.source})


def storage(state: BatchesState, held: Ledger, owner: str, key: ApiKey | None, settings: Settings) -> Storage:
    """`owner`'s storage now: recorded, plus what is on its way in this process."""
    limit = storage_limit(key, settings)
    used = storage_used(state, owner) + held.pending_bytes(owner) if limit is not None else 0
    return Storage(owner, used, limit)


def refuse_open_batches(state: BatchesState, held: Ledger, owner: str, key: ApiKey | None,
                        settings: Settings) -> Refused | None:
    """A 429 when `owner` has as many open batches (recorded, or being made) as it may; None when one more fits."""
    limit = open_batches_limit(key, settings)
    if limit is None:
        return None
    n = open_count(state, owner) + held.pending_batches(owner)
    if n < limit.value:
        return None
    who = _who(owner)
    return Refused(f"{who} has {n} open batches, {limit.source} is {limit.value}: retry when one of them ends "
                   "(completed, failed, expired or cancelled)", reason="rate_limit_exceeded", http_status=429,
                   retry_after_s=OPEN_BATCHES_RETRY_S,
                   observations={"key": owner.removeprefix("key:"), "limit": "max_open_batches",
                                 "value": limit.value, "open": n})


def _who(owner: str) -> str:
    return f"key {owner.removeprefix('key:')!r}"


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"
