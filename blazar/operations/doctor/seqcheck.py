"""The `log.seq` verdict for both stores: seq 1..last is whole once the archived ranges are counted.

Archiving removes request history from the live log, so the live seqs have gaps; each is explained when an
`archived` range covers it. The counts prove it without reading every row: outside the ranges' union every seq
must be live, and inside it exactly the ranges' counts must be missing (a commit deletes exactly `count` rows of a
range). Only when the counts disagree are the gaps read, to name the first seq no range explains.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from blazar.operations.doctor.report import Check, ok

_RESTORE = "restore the latest snapshot: `blazar restore PATH` (`blazar snapshot` makes them)"

# Live gaps (first missing seq, last missing seq) that no single archived range holds, oldest first: the gap before
# the first live event, then one after each live event whose successor is not live. The `archived` clause is left
# out on a log whose schema has no such table yet. Parameters: last seq, limit.
GAPS = """
SELECT g.lo, g.hi FROM (
    SELECT ev.seq + 1 AS lo, (SELECT MIN(nx.seq) FROM events nx WHERE nx.seq > ev.seq) - 1 AS hi
    FROM events ev WHERE ev.seq < ? AND NOT EXISTS (SELECT 1 FROM events nx WHERE nx.seq = ev.seq + 1)
    UNION ALL
    SELECT 1 AS lo, (SELECT MIN(seq) FROM events) - 1 AS hi WHERE (SELECT MIN(seq) FROM events) > 1
) g {covered} ORDER BY g.lo LIMIT ?
"""
# Gaps read to name the first hole, beyond one per archived range (a gap may span two adjacent ranges).
GAPS_READ = 1000
COVERED = "WHERE NOT EXISTS (SELECT 1 FROM archived a WHERE g.lo >= a.first_seq AND g.hi <= a.last_seq)"


def gaps_sql(*, has_archived: bool) -> str:
    return GAPS.format(covered=COVERED if has_archived else "")


@dataclass(frozen=True)
class SeqFacts:
    """What the counts say: live events, the last seq, and each archived range (first_seq, last_seq, count)."""

    count: int
    last: int
    ranges: Sequence[tuple[int, int, int]]

    def union(self) -> list[tuple[int, int]]:
        """The seqs the archived ranges cover, merged into disjoint spans within 1..last, in order."""
        spans: list[tuple[int, int]] = []
        for lo, hi, _ in sorted(self.ranges):
            lo, hi = max(lo, 1), min(hi, self.last)
            if lo > hi:
                continue
            if spans and lo <= spans[-1][1] + 1:
                spans[-1] = (spans[-1][0], max(spans[-1][1], hi))
            else:
                spans.append((lo, hi))
        return spans


def whole(facts: SeqFacts, live_in_union: int) -> bool:
    """Every seq 1..last is live or in an archived range, and exactly the ranges' counts are missing inside them."""
    covered = sum(hi - lo + 1 for lo, hi in facts.union())
    archived = sum(c for _, _, c in facts.ranges)
    return facts.count - live_in_union == facts.last - covered and covered - live_in_union == archived


def first_unexplained(facts: SeqFacts, gaps: Iterable[tuple[int, int]]) -> int | None:
    """The first missing seq that no archived range covers, among `gaps` (lo, hi), or None."""
    spans = facts.union()
    for lo, hi in gaps:
        seq = lo
        for a, b in spans:
            if seq > hi:
                break
            if b < seq:
                continue
            if a > seq:
                return seq
            seq = b + 1
        if seq <= hi:
            return seq
    return None


def verdict(facts: SeqFacts, live_in_union: int, gaps: Iterable[tuple[int, int]] | None) -> Check:
    """`log.seq`: ok when `whole`; else the first hole no range explains (`gaps` read only then), or the ranges'
    counts that do not match what is missing inside them."""
    n_ranges = len(facts.ranges)
    archived = sum(c for _, _, c in facts.ranges)
    if facts.count == 0 and not n_ranges:
        return ok("log", "seq", "no events yet")
    if whole(facts, live_in_union):
        if not n_ranges:
            return ok("log", "seq", f"seq 1..{facts.last} without gaps ({facts.count} events)")
        return ok("log", "seq", f"seq 1..{facts.last} whole: {facts.count} live events and {archived} archived in "
                  f"{n_ranges} segment(s); every gap in the live log lies in an archived range")
    hole = first_unexplained(facts, gaps or ())
    if hole is not None:
        missing = facts.last - facts.count - archived
        return Check("log", "seq", "fail", f"seq {hole} is missing and no archived range holds it ({missing} seq "
                     f"number(s) between 1 and {facts.last} unaccounted for): events were deleted outside Blazar",
                     fix=_RESTORE)
    covered = sum(hi - lo + 1 for lo, hi in facts.union())
    return Check("log", "seq", "fail", f"inside the archived ranges {covered - live_in_union} seq number(s) are "
                 f"missing from the live log, but the ranges account for {archived}: events were deleted outside "
                 "Blazar", fix=_RESTORE)
