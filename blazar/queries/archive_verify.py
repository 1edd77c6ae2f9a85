"""`blazar audit verify --archive`: every archive segment the live log names, checked against what the log recorded
when it was archived. Read side: it opens files and the log, and writes nothing.

For each segment, in order: the live log's `archived` row and its `log.archived` event agree; the segment's `prev`
is the previous segment's `head` (else a segment was dropped or swapped); its data file and manifest exist (else
"missing"); every line's hash and link holds (the first edited, dropped or reordered line is named by its line
number inside the segment); the count and head are the recorded ones; the data file's and the manifest's sha256
are the recorded ones (a whole file replaced by another whose lines chain is caught here). Every segment is
checked, so a report names each broken one; the first is the error.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass
from typing import Any

from blazar.durable import file_sha256
from blazar.errors import ArchiveError, SegmentBroken, SegmentMissing
from blazar.events.archive import LogArchived
from blazar.events.chain import GENESIS
from blazar.events.log import EventLog
from blazar.events.log_sql import row_to_recorded
from blazar.events.segment import Manifest, walk_lines
from blazar.events.segment_store import ArchivedRange, SegmentStore


@dataclass(frozen=True, slots=True)
class SegmentCheck:
    """One segment as verified: `error` is None when it is intact."""

    segment: int
    name: str
    first_seq: int
    last_seq: int
    count: int
    head: str
    error: ArchiveError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self) -> dict[str, Any]:
        line = self.error.line if isinstance(self.error, SegmentBroken) else None
        return {"segment": self.segment, "name": self.name, "first_seq": self.first_seq, "last_seq": self.last_seq,
                "count": self.count, "head": self.head, "ok": self.ok, "line": line,
                "error": None if self.error is None else self.error.message}


@dataclass(frozen=True, slots=True)
class ArchiveReport:
    archive_dir: str | None
    segments: list[SegmentCheck]

    @property
    def ok(self) -> bool:
        return all(s.ok for s in self.segments)

    @property
    def first_error(self) -> ArchiveError | None:
        return next((s.error for s in self.segments if s.error is not None), None)

    @property
    def events(self) -> int:
        return sum(s.count for s in self.segments)

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "archive_dir": self.archive_dir, "segments": [s.to_json() for s in self.segments],
                "events": self.events, "head": self.segments[-1].head if self.segments else GENESIS}

    def describe(self) -> str:
        n = len(self.segments)
        if not n:
            return "no archived segments"
        noun = "segment" if n == 1 else "segments"
        return (f"{n} {noun}, {self.events} events, seq {self.segments[0].first_seq}..{self.segments[-1].last_seq}, "
                f"chain head {self.segments[-1].head}")


async def verify_archive(log: EventLog) -> ArchiveReport:
    """Check every segment the live log names; never raises for a broken segment (the report says it)."""
    ranges = await log.archived_ranges()
    recorded: dict[str, LogArchived] = {}
    async for rows in log.read_live_rows(types=[LogArchived.TYPE]):  # a control event: it never leaves the log
        for row in rows:
            event = row_to_recorded(row).event
            assert isinstance(event, LogArchived)
            recorded[event.name] = event
    store = log.archive
    root = None if store is None else str(store.root)
    if not ranges and not recorded:
        return ArchiveReport(root, [])
    if store is None:
        raise ArchiveError("the log has archived segments but no archive directory to read them from")
    checks = await asyncio.to_thread(_check_all, store, ranges, recorded)
    return ArchiveReport(root, checks)


def _check_all(store: SegmentStore, ranges: list[ArchivedRange],
               recorded: dict[str, LogArchived]) -> list[SegmentCheck]:
    checks: list[SegmentCheck] = []
    in_table = {r.name for r in ranges}
    prev: LogArchived | None = None
    for rng in ranges:
        event = recorded.get(rng.name)
        if event is None:
            checks.append(_result(rng, None, SegmentBroken(
                rng.name, None, "the archived table names it but the live log holds no log.archived event for it")))
            continue
        try:
            _check_links(rng, event, prev)
            _check_files(store, event)
            error: ArchiveError | None = None
        except ArchiveError as exc:
            error = exc
        checks.append(_result(rng, event, error))
        prev = event
    for name, event in sorted(recorded.items(), key=lambda kv: kv[1].segment):
        if name not in in_table:  # the record of its range is gone: the reads would skip these seqs
            rng = ArchivedRange(event.segment, name, event.first_seq, event.last_seq, event.count, event.sha256, 0)
            checks.append(_result(rng, event, SegmentBroken(
                name, None, "log.archived records it but the archived table does not name its range")))
    return sorted(checks, key=lambda c: c.segment)


def _result(rng: ArchivedRange, event: LogArchived | None, error: ArchiveError | None) -> SegmentCheck:
    head = event.head if event is not None else ""
    return SegmentCheck(rng.segment, rng.name, rng.first_seq, rng.last_seq, rng.count, head, error)


def _check_links(rng: ArchivedRange, event: LogArchived, prev: LogArchived | None) -> None:
    """The segment's place in the chain of segments, from what the log recorded."""
    name = rng.name
    if (event.segment, event.first_seq, event.last_seq, event.count, event.sha256) != (
            rng.segment, rng.first_seq, rng.last_seq, rng.count, rng.sha256):
        raise SegmentBroken(name, None, "its row in the archived table and its log.archived event disagree")
    want_segment, want_first, want_prev = (1, 1, GENESIS) if prev is None else (
        prev.segment + 1, prev.last_seq + 1, prev.head)
    if (event.segment, event.first_seq) != (want_segment, want_first):
        raise SegmentBroken(name, None, f"it is segment {event.segment} from seq {event.first_seq}, where segment "
                                        f"{want_segment} from seq {want_first} was due: a segment is missing")
    if event.prev != want_prev:
        after = "the chain's start" if prev is None else f"segment {prev.name}'s head"
        raise SegmentBroken(name, None, f"its chain does not follow {after}: a segment was dropped or swapped")


def _check_files(store: SegmentStore, event: LogArchived) -> None:
    name = event.name
    data = store.path(name, ".jsonl.gz")
    mpath = store.path(name, ".manifest.json")
    for path in (data, mpath):
        if not path.is_file():
            raise SegmentMissing(name, event.first_seq, event.last_seq, f"no {path}")
    check = walk_lines(data, name, prev=event.prev, first_seq=event.first_seq, last_seq=event.last_seq)
    if check.count != event.count:
        raise SegmentBroken(name, check.count, f"it holds {check.count} lines, log.archived recorded {event.count}: "
                                               "lines were dropped or added at the end")
    if check.head != event.head:
        raise SegmentBroken(name, None, "its lines chain, but to another head than log.archived recorded: the "
                                        "file was replaced")
    if file_sha256(data) != event.sha256:
        raise SegmentBroken(name, None, "its lines chain to the recorded head, but the data file's sha256 differs "
                                        "from the one log.archived recorded: the file was rewritten")
    raw = mpath.read_bytes()
    if hashlib.sha256(raw).hexdigest() != event.manifest_sha256:
        raise SegmentBroken(name, None, "the manifest's sha256 differs from the one log.archived recorded: the "
                                        "manifest was altered")
    manifest = Manifest.decode(name, raw)
    if (manifest.first_seq, manifest.last_seq, manifest.count, manifest.head) != (
            event.first_seq, event.last_seq, event.count, event.head):
        raise SegmentBroken(name, None, "the manifest does not describe the segment log.archived recorded")
