"""Pure deciders for the supervisor: which instances to evict for room, which have idled past their keep-alive,
when to look again, and when a crashing model's circuit opens. No I/O and no clock: the caller passes `now` and
the observations, records the decision as an event (with the scores and `why`), then acts on it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from blazar.fit.refusal import fmt_bytes

# The reload cost assumed for an instance whose load time is unknown (it never became ready, or an old log).
DEFAULT_RELOAD_S = 5.0


@dataclass(frozen=True)
class Candidate:
    """A loaded instance as the eviction decider sees it."""

    instance_id: str
    model: str
    bytes: int  # what evicting it frees: the larger of planned and measured
    idle_s: float  # since its last request ended (0 while one runs)
    in_flight: int
    pinned: bool
    keep_alive_s: float | None  # None: forever
    load_ms: int | None  # how long its last load took; None when unknown

    @property
    def evictable(self) -> bool:
        return self.in_flight == 0 and not self.pinned

    @property
    def reload_s(self) -> float:
        return DEFAULT_RELOAD_S if self.load_ms is None else self.load_ms / 1000

    @property
    def score(self) -> float:
        """The cost of losing it: seconds to load it again, discounted by how long nobody has used it."""
        return self.reload_s / (1.0 + max(0.0, self.idle_s))

    def rank(self) -> tuple[bool, float, int, str]:
        """Cheapest to lose first; keep-alive forever last; the larger first among equals; then by id (a total
        order, so the same observations always give the same victims)."""
        return (self.keep_alive_s is None, self.score, -self.bytes, self.instance_id)


@dataclass(frozen=True)
class Victims:
    """What decide_victims chose, with every considered candidate's score and the reason in one line."""

    victims: tuple[Candidate, ...]
    scores: dict[str, float]  # instance_id -> score, for every evictable candidate
    excluded: dict[str, str]  # instance_id -> "busy" | "pinned"
    shortfall_bytes: int
    need_count: int
    why: str = field(default="")

    @property
    def bytes_freed(self) -> int:
        return sum(v.bytes for v in self.victims)

    @property
    def ids(self) -> list[str]:
        return [v.instance_id for v in self.victims]


def _meets(chosen: Sequence[Candidate], shortfall: int, count: int) -> bool:
    return len(chosen) >= count and sum(c.bytes for c in chosen) >= shortfall


def _pick(ordered: list[Candidate], shortfall: int, count: int) -> list[Candidate] | None:
    """A minimal set from `ordered` (cheapest first) meeting both needs, or None when all of them would not."""
    if not _meets(ordered, shortfall, count):
        return None
    if count <= 1:
        # One victim beats several: the cheapest single instance that frees enough on its own.
        for c in ordered:
            if c.bytes >= shortfall:
                return [c]
    chosen: list[Candidate] = []
    for c in ordered:
        chosen.append(c)
        if _meets(chosen, shortfall, count):
            break
    # A large late pick can make earlier small ones unnecessary: drop them, the dearest first. One pass leaves a
    # minimal set, since removing more only lowers the count and the bytes.
    for c in reversed(chosen[:-1]):
        rest = [x for x in chosen if x is not c]
        if _meets(rest, shortfall, count):
            chosen = rest
    return chosen


def decide_victims(cands: Iterable[Candidate], *, need_bytes: int, free_bytes: int,
                   need_count: int) -> Victims | None:
    """The instances to evict so that `need_bytes` fit beside `free_bytes` and `need_count` instances go (for
    max_loaded_models); an empty Victims when nothing must go; None when no allowed set is enough.

    Never a busy (in_flight > 0) or pinned instance. The cost model: score = reload seconds (load_ms / 1000, or
    DEFAULT_RELOAD_S when unknown) / (1 + idle seconds), so a model that loads fast or has sat unused longest is
    the cheapest to lose; among equal scores the one freeing more bytes goes first, then the lower instance_id.
    Keep-alive forever ranks after every other, but still goes when nothing else makes room. Only as many go as
    needed: the cheapest single instance that suffices, else a greedy pick in rank order with the picks that
    turned out unnecessary dropped; instances with a finite keep-alive are tried alone before any forever one.
    """
    every = list(cands)
    allowed = sorted((c for c in every if c.evictable), key=Candidate.rank)
    excluded = {c.instance_id: ("busy" if c.in_flight else "pinned") for c in every if not c.evictable}
    scores = {c.instance_id: round(c.score, 6) for c in allowed}
    shortfall = max(0, need_bytes - free_bytes)
    count = max(0, need_count)
    if shortfall == 0 and count == 0:
        return Victims((), scores, excluded, 0, 0, "nothing to evict: it fits and the count limit allows one more")
    finite = [c for c in allowed if c.keep_alive_s is not None]
    chosen = _pick(finite, shortfall, count) if len(finite) < len(allowed) else None
    if chosen is None:
        chosen = _pick(allowed, shortfall, count)
    if chosen is None:
        return None
    chosen.sort(key=Candidate.rank)
    return Victims(tuple(chosen), scores, excluded, shortfall, count, _why(chosen, shortfall, count, excluded))


def _why(chosen: list[Candidate], shortfall: int, count: int, excluded: dict[str, str]) -> str:
    names = ", ".join(f"{c.instance_id} ({c.model}, reload {c.reload_s:.1f} s, idle {c.idle_s:.0f} s)"
                      for c in chosen)
    needs = []
    if shortfall:
        needs.append(f"{fmt_bytes(shortfall)} short (frees {fmt_bytes(sum(c.bytes for c in chosen))})")
    if count:
        needs.append(f"{count} over max_loaded_models")
    text = f"evict {names}: {' and '.join(needs)}; cheapest to lose first, score = reload s / (1 + idle s)"
    if excluded:
        text += "; not considered: " + ", ".join(f"{i} ({r})" for i, r in sorted(excluded.items()))
    return text


@dataclass(frozen=True)
class IdleView:
    """A loaded, ready instance as the idle reaper sees it (idle_s measured at the `now` passed alongside)."""

    instance_id: str
    idle_s: float
    in_flight: int
    pinned: bool
    keep_alive_s: float | None  # None: forever


def _reapable(v: IdleView) -> bool:
    return v.in_flight == 0 and not v.pinned and v.keep_alive_s is not None


def decide_idle(instances: Iterable[IdleView], now: float) -> list[tuple[str, float]]:
    """(instance_id, idle_s) of every instance idle for at least its keep-alive (0: at once), longest overdue
    first. Busy, pinned and keep-alive-forever instances never appear. `now` is when idle_s was measured."""
    due = [v for v in instances if _reapable(v) and v.keep_alive_s is not None and v.idle_s >= v.keep_alive_s]
    due.sort(key=lambda v: (-(v.idle_s - (v.keep_alive_s or 0.0)), v.instance_id))
    return [(v.instance_id, v.idle_s) for v in due]


def next_wakeup(instances: Iterable[IdleView], now: float) -> float | None:
    """Seconds from `now` until the first keep-alive runs out (0 when one is already due); None when no instance
    can idle out (all busy, pinned or forever, or none loaded). A request that ends resets the clock: the caller
    wakes the reaper then."""
    waits = [v.keep_alive_s - v.idle_s for v in instances if _reapable(v) and v.keep_alive_s is not None]
    return max(0.0, min(waits)) if waits else None


def decide_circuit(crash_ts: Iterable[float], now: float, *, limit: int, window_s: float) -> bool:
    """Open the circuit when at least `limit` crashes happened within the last `window_s` seconds (inclusive; a
    crash stamped after `now`, as a stepped wall clock can do, counts as recent)."""
    recent = sum(1 for ts in crash_ts if ts >= now - window_s)
    return limit > 0 and recent >= limit
