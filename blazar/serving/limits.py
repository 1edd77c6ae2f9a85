"""Per-key limits, in memory in the daemon: requests per minute and tokens per minute over a sliding 60 s window,
tokens and seconds of audio per UTC day, and concurrent requests (a lease taken before a request runs and given back
when its answer ends). Pure apart from the clock it is given; the gateway records a refusal as `request.rejected`.

    LimitExceeded (BlazarError)   429 rate_limit_exceeded: which limit, its value, and when to retry
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from blazar.clock import Clock
from blazar.errors import LimitExceeded
from blazar.projections.keys import ApiKey

WINDOW_S = 60.0
DAY_S = 86400.0




@dataclass(frozen=True, slots=True)
class KeyLimits:
    """A key's limits as the keys projection holds them (None: no limit)."""

    name: str
    rpm: int | None = None
    tpm: int | None = None
    daily_tokens: int | None = None
    max_concurrent: int | None = None
    daily_audio_s: int | None = None

    @classmethod
    def of(cls, key: ApiKey) -> KeyLimits:
        return cls(key.name, key.rpm, key.tpm, key.daily_tokens, key.max_concurrent, key.daily_audio_s)


@dataclass(slots=True)
class _Usage:
    requests: deque[float] = field(default_factory=deque)  # monotonic times of admitted requests
    tokens: deque[tuple[float, int]] = field(default_factory=deque)  # (monotonic time, tokens) of completions
    tokens_in_window: int = 0
    day: int = -1  # UTC day number the daily count is for
    tokens_today: int = 0
    audio_today: float = 0.0  # seconds of audio of completed speech requests
    in_flight: int = 0


@dataclass(slots=True)
class Lease:
    """One request's share of its key's limits; `Limiter.release` gives it back (once)."""

    name: str
    released: bool = False


def utc_day(ts: float) -> int:
    return int(ts // DAY_S)


class Limiter:
    """`acquire` before a request runs (raises LimitExceeded), `add_tokens` (and `add_audio`) when it completes,
    `release` when its answer ends. `seed(name, day)` gives the tokens a key already used that UTC day and
    `audio_seed(name, day)` its seconds of audio (from the log, at start)."""

    def __init__(self, clock: Clock, *, seed: Callable[[str, int], int] | None = None,
                 audio_seed: Callable[[str, int], float] | None = None) -> None:
        self.clock = clock
        self.seed = seed
        self.audio_seed = audio_seed
        self._usage: dict[str, _Usage] = {}

    def _of(self, name: str) -> _Usage:
        u = self._usage.get(name)
        if u is None:
            u = self._usage[name] = _Usage()
        return u

    def _roll(self, name: str, u: _Usage, now_mono: float, now_wall: float) -> None:
        edge = now_mono - WINDOW_S
        while u.requests and u.requests[0] <= edge:
            u.requests.popleft()
        while u.tokens and u.tokens[0][0] <= edge:
            u.tokens_in_window -= u.tokens.popleft()[1]
        day = utc_day(now_wall)
        if u.day != day:
            u.day = day
            u.tokens_today = self.seed(name, day) if self.seed is not None else 0
            u.audio_today = self.audio_seed(name, day) if self.audio_seed is not None else 0.0

    def acquire(self, limits: KeyLimits) -> Lease:
        mono, wall = self.clock.monotonic(), self.clock.now()
        u = self._of(limits.name)
        self._roll(limits.name, u, mono, wall)
        who = f"key {limits.name!r}"
        if limits.max_concurrent is not None and u.in_flight >= limits.max_concurrent:
            raise LimitExceeded(f"{who} already has {u.in_flight} request(s) running, its max_concurrent is "
                                f"{limits.max_concurrent}; retry when one ends", limit="max_concurrent",
                                value=limits.max_concurrent, retry_after_s=1.0)
        if limits.rpm is not None and len(u.requests) >= limits.rpm:
            wait = u.requests[len(u.requests) - limits.rpm] + WINDOW_S - mono
            raise LimitExceeded(f"{who} made {len(u.requests)} requests in the last 60 s, its rpm limit is "
                                f"{limits.rpm}", limit="rpm", value=limits.rpm, retry_after_s=_ceil(wait))
        if limits.tpm is not None and u.tokens_in_window >= limits.tpm:
            raise LimitExceeded(f"{who} used {u.tokens_in_window} tokens in the last 60 s, its tpm limit is "
                                f"{limits.tpm}", limit="tpm", value=limits.tpm,
                                retry_after_s=_ceil(self._tpm_wait(u, limits.tpm, mono)))
        if limits.daily_tokens is not None and u.tokens_today >= limits.daily_tokens:
            wait = (u.day + 1) * DAY_S - wall
            raise LimitExceeded(f"{who} used {u.tokens_today} tokens today (UTC), its daily_tokens limit is "
                                f"{limits.daily_tokens}", limit="daily_tokens", value=limits.daily_tokens,
                                retry_after_s=_ceil(wait))
        if limits.daily_audio_s is not None and u.audio_today >= limits.daily_audio_s:
            wait = (u.day + 1) * DAY_S - wall
            raise LimitExceeded(f"{who} used {u.audio_today:.1f} s of audio today (UTC), its daily_audio_s limit is "
                                f"{limits.daily_audio_s}", limit="daily_audio_s", value=limits.daily_audio_s,
                                retry_after_s=_ceil(wait))
        u.requests.append(mono)
        u.in_flight += 1
        return Lease(limits.name)

    @staticmethod
    def _tpm_wait(u: _Usage, tpm: int, mono: float) -> float:
        """Until enough of the window's tokens age out that the total is under the limit."""
        total = u.tokens_in_window
        for t, n in u.tokens:
            total -= n
            if total < tpm:
                return t + WINDOW_S - mono
        return WINDOW_S

    def extra(self, limits: KeyLimits) -> Lease | None:
        """One more concurrent share for a request that already holds its lease (best-of-N's extra candidates each
        run at once, so each counts against max_concurrent; not against rpm: it is one request); None when the key
        is at its max_concurrent."""
        u = self._of(limits.name)
        if limits.max_concurrent is not None and u.in_flight >= limits.max_concurrent:
            return None
        u.in_flight += 1
        return Lease(limits.name)

    def add_tokens(self, name: str, tokens: int) -> None:
        if tokens <= 0:
            return
        mono, wall = self.clock.monotonic(), self.clock.now()
        u = self._of(name)
        self._roll(name, u, mono, wall)
        u.tokens.append((mono, tokens))
        u.tokens_in_window += tokens
        u.tokens_today += tokens

    def add_audio(self, name: str, seconds: float) -> None:
        """A completed speech request's seconds of audio (what it transcribed or spoke) against the daily limit."""
        if seconds <= 0:
            return
        u = self._of(name)
        self._roll(name, u, self.clock.monotonic(), self.clock.now())
        u.audio_today += seconds

    def release(self, lease: Lease) -> None:
        if lease.released:
            return
        lease.released = True
        u = self._usage.get(lease.name)
        if u is not None and u.in_flight > 0:
            u.in_flight -= 1

    def in_flight(self, name: str) -> int:
        u = self._usage.get(name)
        return u.in_flight if u is not None else 0


def _ceil(seconds: float) -> float:
    return float(max(1, math.ceil(seconds)))
