"""Archiving: request history older than the retention leaves the live log for verified segments.

One run writes segments of at most `SEGMENT_EVENTS` events, oldest first. For each:

1. select: the range `(last archived seq, cutoff seq]` (the cutoff seq is the newest event recorded before
   `now - retention`), up to `SEGMENT_EVENTS` archivable events of it;
2. write the data file under a temporary name, fsync, and rename it into place; then its index and manifest;
3. verify: re-read the file from disk: every line's hash and link, the count, the head, the file's sha256, and a
   fingerprint of the rows equal to the one taken from the live log while writing;
4. commit, in one transaction: `log.archived` appended, the range recorded in `archived`, its rows deleted (the
   count must match, else the transaction rolls back).

A crash before step 4 leaves the live log as it was and files no range names (orphans, removed by the next run); a
crash after it leaves the new state. There is no state in between: the commit is one transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import logging
import os
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from blazar.durable import file_sha256, fsync_path, write_atomically
from blazar.errors import ArchiveBusy, ArchiveError, BlazarError
from blazar.events.archive import LogArchived, archivable_types
from blazar.events.base import Recorded
from blazar.events.chain import GENESIS
from blazar.events.log import EventLog
from blazar.events.segment import (
    Manifest,
    SegmentWriter,
    index_keys,
    read_block,
    stem_of,
    walk_lines,
    write_index,
)
from blazar.events.segment_store import ArchivedRange, SegmentStore
from blazar.events.types import audit_types, decode

log_ = logging.getLogger(__name__)
SEGMENT_EVENTS = 100_000
ACTOR = "archiver"

# Called with the name of each step as it is reached (crash tests kill the process at each one).
StepHook = Callable[[str], None]


@dataclass
class ArchiveRun:
    """What one run did."""

    cutoff: float
    segments: list[LogArchived] = field(default_factory=list)
    orphans_removed: int = 0

    @property
    def events(self) -> int:
        return sum(s.count for s in self.segments)

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.segments)

    def to_json(self) -> dict[str, Any]:
        return {"cutoff": self.cutoff, "segments": [s.model_dump(mode="json") for s in self.segments],
                "events": self.events, "bytes": self.bytes, "orphans_removed": self.orphans_removed}


def _no_step(_name: str) -> None:
    pass


async def cutoff_seq(log: EventLog, cutoff: float) -> int:
    """The last live event (by seq) recorded before `cutoff` (0 when none): ranges end there.

    NOTE: by seq, not by time. Clocks out of step can record an event with an earlier time after one with a later
    time; ending at the newest by time left such an event live, and the next run, with the same cutoff, archived it
    (a run was not idempotent, and a later cutoff could archive less than an earlier one). The live events recorded
    before the cutoff are the few since the last run (and the control events), so the `ts` index range is short."""
    rows = await log._fetch("SELECT max(seq) FROM events WHERE ts < ?", (cutoff,))
    return int(rows[0][0]) if rows and rows[0][0] is not None else 0


async def archive(log: EventLog, *, cutoff: float, now: float, actor: str = ACTOR,
                  segment_events: int = SEGMENT_EVENTS, max_segments: int | None = None,
                  step: StepHook = _no_step) -> ArchiveRun:
    """Archive every archivable event recorded before `cutoff`; returns what was done (nothing is not an error)."""
    if log.archive is None:
        raise ArchiveError("this log has no archive directory")
    store = log.archive
    await asyncio.to_thread(store.root.mkdir, mode=0o700, parents=True, exist_ok=True)
    with _run_lock(store):
        async with log.archive_lock():
            return await _archive_locked(log, store, cutoff=cutoff, now=now, actor=actor, segment_events=segment_events,
                                         max_segments=max_segments, step=step)


@contextlib.contextmanager
def _run_lock(store: SegmentStore) -> Iterator[None]:
    """One archive run at a time on this archive directory (the daemon's schedule and `blazar log archive`): a run
    removes files no range names, which another run may be writing."""
    with (store.root / ".archive.lock").open("a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ArchiveBusy(f"another archive run holds {store.root / '.archive.lock'}") from None
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


async def _archive_locked(log: EventLog, store: SegmentStore, *, cutoff: float, now: float, actor: str,
                          segment_events: int, max_segments: int | None, step: StepHook) -> ArchiveRun:
    run = ArchiveRun(cutoff=cutoff)
    ranges = await log.archived_ranges()
    run.orphans_removed = await asyncio.to_thread(_remove_orphans, store, {r.name for r in ranges})
    top = await cutoff_seq(log, cutoff)
    types = archivable_types()
    while max_segments is None or len(run.segments) < max_segments:
        ranges = await log.archived_ranges()
        after = ranges[-1].last_seq if ranges else 0
        if top <= after:
            break
        prev = await _head(log, ranges)
        rec = await _one_segment(log, store, after=after, top=top, prev=prev, segment=len(ranges) + 1,
                                 cutoff=cutoff, now=now, actor=actor, types=types, limit=segment_events, step=step)
        if rec is None:
            break
        assert isinstance(rec.event, LogArchived)
        run.segments.append(rec.event)
    return run


async def _head(log: EventLog, ranges: list[ArchivedRange]) -> str:
    """The chain head the next segment follows: the last `log.archived`'s head."""
    if not ranges:
        return GENESIS
    async for rows in log.read_rows(after=ranges[-1].archived_seq - 1, upto=ranges[-1].archived_seq):
        rec = rows[0]
        event = decode(rec[0], rec[2], rec[3], rec[8])
        assert isinstance(event, LogArchived)
        return event.head
    raise ArchiveError(f"the log.archived event of segment {ranges[-1].name} is missing from the live log")


async def _one_segment(log: EventLog, store: SegmentStore, *, after: int, top: int, prev: str, segment: int,
                       cutoff: float, now: float, actor: str, types: list[str], limit: int,
                       step: StepHook) -> Recorded | None:
    step("select")
    tmp = store.root / f".seg-{segment:06d}-{os.getpid()}.jsonl.gz.tmp"
    writer = SegmentWriter(tmp, prev, audit_types=frozenset(audit_types()))
    keyed: list[tuple[str, int]] = []
    last = after
    try:
        async for rows in log.read_rows(after=after, upto=top, types=types, limit=limit):
            await asyncio.to_thread(writer.add, rows)
            last = rows[-1][0]
        sha256, size = await asyncio.to_thread(writer.finish)
    except BaseException:
        writer.abort()
        raise
    if writer.count == 0:
        writer.abort()
        return None
    # The range answers for every archivable event up to the cutoff seq unless the segment filled up first.
    last_seq = top if writer.count < limit else last
    name = stem_of(segment, after + 1, last_seq)
    data_path = store.path(name, ".jsonl.gz")
    step("write")
    await asyncio.to_thread(os.replace, tmp, data_path)
    await asyncio.to_thread(fsync_path, store.root)
    with data_path.open("rb") as fh:
        for i, block in enumerate(writer.blocks):
            keyed.extend(index_keys(read_block(fh, name, block), i))
    await asyncio.to_thread(write_index, store.path(name, ".index"), keyed)
    ts_min = min(b.ts_min for b in writer.blocks)
    ts_max = max(b.ts_max for b in writer.blocks)
    manifest = Manifest(segment=segment, name=name, first_seq=after + 1, last_seq=last_seq, count=writer.count,
                        size=size, sha256=sha256, prev=prev, head=writer.head, ts_min=ts_min, ts_max=ts_max,
                        cutoff=cutoff, audit_records=writer.audit_records, types=writer.types,
                        blocks=tuple(writer.blocks), created_at=now,
                        index_sha256=await asyncio.to_thread(file_sha256, store.path(name, ".index")))
    encoded = manifest.encode()
    await asyncio.to_thread(write_atomically, store.path(name, ".manifest.json"), encoded)
    await asyncio.to_thread(fsync_path, store.root)
    step("verify")
    await asyncio.to_thread(_verify_written, store, manifest, writer.rows_digest.hexdigest())
    step("commit")
    event = LogArchived(segment=segment, name=name, first_seq=manifest.first_seq, last_seq=last_seq,
                        count=manifest.count, bytes=size, sha256=sha256,
                        manifest_sha256=hashlib.sha256(encoded).hexdigest(), prev=prev, head=manifest.head,
                        ts_min=ts_min, ts_max=ts_max, cutoff=cutoff, audit_records=manifest.audit_records)
    rng = ArchivedRange(segment=segment, name=name, first_seq=manifest.first_seq, last_seq=last_seq,
                        count=manifest.count, sha256=sha256, archived_seq=0)
    rec = await log.commit_archived(log.pending(event, actor=actor), rng, types)
    step("committed")
    try:  # derived: the index across segments learns this one now, not at the first look-up after
        await asyncio.to_thread(store.index_traces, [rng])
    except (OSError, sqlite3.Error, BlazarError) as e:
        log_.warning("the index across segments was not brought up to date (%s); the next look-up does it", e)
    return rec


def _verify_written(store: SegmentStore, manifest: Manifest, rows_sha256: str) -> None:
    """The segment as it is on disk holds exactly the rows read from the live log, chained as the manifest says."""
    name = manifest.name
    data_path = store.path(name, ".jsonl.gz")
    if file_sha256(data_path) != manifest.sha256:
        raise ArchiveError(f"segment {name}: the file on disk differs from what was written; nothing removed")
    check = walk_lines(data_path, name, prev=manifest.prev, first_seq=manifest.first_seq,
                       last_seq=manifest.last_seq)
    if (check.count, check.head, check.rows_sha256) != (manifest.count, manifest.head, rows_sha256):
        raise ArchiveError(f"segment {name}: re-read from disk, it does not hold the rows of the live log; "
                           "nothing removed")


def _remove_orphans(store: SegmentStore, known: set[str]) -> int:
    n = 0
    for path in store.orphans(known):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            n += 1
    return n
