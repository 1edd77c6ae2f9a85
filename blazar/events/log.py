"""The event log's one interface, `EventLog`, and what its two stores share: the embedded SQLite file
(`log_sqlite.SqliteEventLog`) and PostgreSQL (`log_pg.PgEventLog`), siblings under it.

Written once here: appending (events validated and encoded, seqs handed out, this process's listeners told), reads
(the filters and keyset pagination of `log_sql.py`, merged with the archive's segments), follow's catch-up loop and
the small look-ups. Each store brings what only it can do: how rows go in gap-free (`_insert`), how a statement runs
(`_fetch`, `_execute_write`, `_snapshot`), how it learns that another process committed (`change_signature`,
`changed_elsewhere`, a `ChangeWatch` for each tail) and its whole-log copy for snapshots (`snapshot_into`; a store
that is not a SQLite file uses `snapshot_file.copy_into_file`). The checkpoints table is `checkpoint_store.py`'s,
composed in as `log.checkpoints`; the reads that reach into archive segments are `archive_reads.py`'s. Nothing
here knows which database it runs on.

Open a store with `await SqliteEventLog.open(path)` or `await PgEventLog.open(url)`, or from a configured location
with `blazar.logdb.open_log`; close it with `await log.close()`.
"""

from __future__ import annotations

import asyncio
import contextlib
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Self

from blazar.clock import Clock
from blazar.events import archive_reads
from blazar.events.base import Event, Pending, Recorded
from blazar.events.checkpoint_store import CheckpointStore
from blazar.events.location import LogLocation
from blazar.events.log_sql import READ_BATCH, Fetch, Rows, live_batches, row_to_recorded, where_of
from blazar.events.segment import Filters
from blazar.events.segment_store import ARCHIVED_COLUMNS, ArchivedRange, SegmentStore
from blazar.events.types import MAX_EVENT_BYTES, encode

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

# This process's commits a follow() keeps until it yields them; past that it reads the database instead.
FOLLOW_BUFFER = 10_000
# How long the last move of the log's files, once asked about, waits before it is asked about once more.
RECHECK_S = 2.0


class LastMove:
    """When the log's files last moved, so that the last move of a burst is asked about once more after `RECHECK_S`
    of quiet. NOTE: a commit's frames reach the disk a moment before readers can see it (SQLite updates its
    wal-index after them), and another process's commit right after ours looks like ours: a move asked about at
    once may say "nothing" and no later stat moves again. Used by a tail's watch and the following projection runner.
    """

    __slots__ = ("_at",)

    def __init__(self, at: float | None = None) -> None:
        self._at = at  # None: nothing left to ask about

    def moved(self, now: float) -> None:
        self._at = now

    def recheck_due(self, now: float) -> bool:
        """True once, `RECHECK_S` after the last move."""
        if self._at is None or now - self._at < RECHECK_S:
            return False
        self._at = None
        return True



class ChangeWatch(ABC):
    """How one tail (`EventLog.follow`) learns that another process committed; this process's own commits it is
    handed as they commit."""

    @abstractmethod
    def mark(self) -> None:
        """The tail is about to read the log: whatever was committed before now is in that read."""

    @abstractmethod
    async def wait(self, own_commit: asyncio.Event, poll_interval: float) -> bool:
        """Wait for this process's next commit (`own_commit` is set) or for a sign of another's; True when the
        tail must read the log to catch up."""


class EventLog(ABC):
    """The log: append-only, gap-free seqs from 1, one history read in seq order."""

    backend: ClassVar[str]

    def __init__(self, location: LogLocation, clock: Clock) -> None:
        self.location = location  # str() of it is safe to show: a URL's password is left out
        self.clock = clock
        self._last_seq = 0
        self._listeners: list[Callable[[list[Recorded]], None]] = []
        # Where archived segments are read from (reads reach across them); None: this log has no archive to read.
        self.archive: SegmentStore | None = None
        self.max_event_bytes = MAX_EVENT_BYTES  # event_max_kib, set by bootstrap: an event over it is refused
        self.checkpoints = CheckpointStore(self._fetch, self._execute_write)

    @abstractmethod
    async def close(self) -> None: ...

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- writing -------------------------------------------------------------------------------------------

    def pending(
        self,
        event: Event,
        *,
        actor: str,
        stream: str | None = None,
        trace_id: str | None = None,
        cause: int | None = None,
        ts: float | None = None,
    ) -> Pending:
        return Pending(
            event=event,
            stream=stream or event.stream_key(),
            trace_id=trace_id,
            actor=actor,
            cause=cause,
            ts=self.clock.now() if ts is None else ts,
        )

    async def append(
        self,
        events: Event | Iterable[Event],
        *,
        actor: str,
        stream: str | None = None,
        trace_id: str | None = None,
        cause: int | None = None,
    ) -> list[Recorded]:
        """Durable append: the events are committed (fsynced) when this returns."""
        batch = [events] if isinstance(events, Event) else list(events)
        pend = [self.pending(e, actor=actor, stream=stream, trace_id=trace_id, cause=cause) for e in batch]
        return await self.commit_pending(pend)

    async def commit_pending(self, batch: Sequence[Pending]) -> list[Recorded]:
        """Commit a batch in one transaction, assigning consecutive seqs. All or nothing."""
        if not batch:
            return []
        # validate (and bound) before touching the database
        encoded = [(p, p.data if p.data is not None else encode(p.event, self.max_event_bytes)) for p in batch]
        first = await self._insert(encoded)
        recorded = [Recorded(seq=first + i + 1, ts=p.ts, type=p.event.TYPE, v=p.event.V, stream=p.stream,
                             trace_id=p.trace_id, actor=p.actor, cause=p.cause, event=p.event)
                    for i, (p, _) in enumerate(encoded)]
        self._last_seq = first + len(encoded)
        for listener in self._listeners:
            listener(recorded)
        return recorded

    @abstractmethod
    async def _insert(self, encoded: Sequence[tuple[Pending, str]]) -> int:
        """Insert the rows (event, payload text) in one transaction, numbered on from the log's last seq; returns
        the seq before the first. Raises AppendOnlyViolation when the database refuses them."""

    async def commit_archived(self, pending: Pending, rng: ArchivedRange, types: Sequence[str]) -> Recorded:
        """The one path that removes rows from the log, in one transaction: append `pending` (the `log.archived`
        event), insert `rng` into `archived` (its `archived_seq` is set to that event's seq), then delete the rows
        of `types` in `rng`'s seq range, which must number exactly `rng.count` (else nothing happens). The
        database's delete trigger refuses any row outside a range `archived` names."""
        data = encode(pending.event, self.max_event_bytes)
        seq = await self._insert_archived(pending, data, rng, types)
        rec = Recorded(seq=seq, ts=pending.ts, type=pending.event.TYPE, v=pending.event.V, stream=pending.stream,
                       trace_id=pending.trace_id, actor=pending.actor, cause=pending.cause, event=pending.event)
        self._last_seq = seq
        for listener in self._listeners:
            listener([rec])
        return rec

    @contextlib.asynccontextmanager
    async def archive_lock(self) -> AsyncIterator[None]:
        """Held for an archive run beside the archive directory's own lock: nothing more for a SQLite log (one
        machine); PostgreSQL's takes an advisory lock every node sharing the log sees."""
        yield

    @abstractmethod
    async def _insert_archived(self, pending: Pending, data: str, rng: ArchivedRange, types: Sequence[str]) -> int:
        """`commit_archived`'s transaction; returns the seq of the `log.archived` row. Raises ArchiveError when the
        rows to remove do not number `rng.count` (the transaction rolled back)."""

    @property
    def last_appended(self) -> int:
        """The last seq this process committed."""
        return self._last_seq

    def subscribe(self, listener: Callable[[list[Recorded]], None]) -> Callable[[], None]:
        """Call `listener` with every batch this process commits, as it commits (no read back); returns the
        function that unsubscribes it. Other processes' appends are found with `changed_elsewhere`."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    # -- other processes' commits ----------------------------------------------------------------------------

    @abstractmethod
    def change_signature(self) -> tuple[tuple[int, int], ...]:
        """A cheap value (no query) that moves whenever any process may have committed: asked often, it tells when
        `changed_elsewhere` is worth asking."""

    @abstractmethod
    async def changed_elsewhere(self) -> bool:
        """Whether another process committed since the last call (the first call says yes)."""

    @abstractmethod
    async def _watch(self) -> ChangeWatch:
        """A new watch for one tail."""

    # -- connections -----------------------------------------------------------------------------------------

    @abstractmethod
    def reader(self) -> contextlib.AbstractAsyncContextManager[AsyncConnection]:
        """A SQLAlchemy connection for reading."""

    @abstractmethod
    def write_transaction(self) -> contextlib.AbstractAsyncContextManager[AsyncConnection]:
        """A SQLAlchemy connection inside a write transaction, for derived tables; never `events` (its triggers
        refuse)."""

    @abstractmethod
    async def _fetch(self, sql: str, params: Sequence[Any] = ()) -> Rows:
        """The rows of one read-only statement."""

    @abstractmethod
    async def _execute_write(self, sql: str, rows: Sequence[Sequence[Any]] | None = None) -> None:
        """One statement, once for each of `rows` (once without parameters when None), in one write transaction."""

    @abstractmethod
    def _snapshot(self) -> contextlib.AbstractAsyncContextManager[Fetch]:
        """Statements that all read one snapshot of the log."""

    # -- derived tables (checkpoints) ------------------------------------------------------------------------

    async def event_anchor(self, seq: int) -> tuple[str, float] | None:
        """(type, ts) of the event at `seq`, live or archived, or None."""
        rows = await self._fetch("SELECT type, ts FROM events WHERE seq = ?", (seq,))
        if rows:
            return rows[0][0], rows[0][1]
        async for batch in self.read_rows(after=seq - 1, upto=seq):
            return batch[0][2], batch[0][1]
        return None

    # -- reading -------------------------------------------------------------------------------------------

    async def last_seq(self) -> int:
        return int((await self._fetch("SELECT COALESCE(MAX(seq), 0) FROM events"))[0][0])

    async def archived_ranges(self) -> list[ArchivedRange]:
        """Every range moved into an archive segment, oldest first."""
        rows = await self._fetch(f"SELECT {ARCHIVED_COLUMNS} FROM archived ORDER BY segment")
        return [ArchivedRange.of(r) for r in rows]

    async def seq_at_time(self, ts: float) -> int:
        """The last seq recorded at or before `ts` (0 when none), archived events included."""
        live = int((await self._fetch("SELECT COALESCE(MAX(seq), 0) FROM events WHERE ts <= ?", (ts,)))[0][0])
        ranges = [r for r in await self.archived_ranges() if r.last_seq > live]
        if not ranges:
            return live
        return max(live, await asyncio.to_thread(archive_reads.segments(self.archive).seq_at_time, ranges, ts))

    async def trace_ids_starting(self, prefix: str, *, limit: int = 2) -> list[str]:
        """The distinct trace ids that start with `prefix`, in order (a range over the trace index, and over each
        archive segment's)."""
        sql = "SELECT DISTINCT trace_id FROM events WHERE trace_id >= ? AND trace_id < ? ORDER BY trace_id LIMIT ?"
        found = [row[0] for row in await self._fetch(sql, (prefix, prefix + "\U0010ffff", limit))]
        ranges = await self.archived_ranges()
        if ranges:
            store = archive_reads.segments(self.archive)
            more = await asyncio.to_thread(store.trace_ids_starting, ranges, prefix, limit=limit)
            found = sorted(set(found) | set(more))[:limit]
        return found

    async def has_trace(self, trace_id: str) -> bool:
        """Whether any event carries `trace_id`: the live trace index, then the archive segments' indexes."""
        if await self._has_live_trace(trace_id):
            return True
        ranges = await self.archived_ranges()
        return bool(ranges) and await asyncio.to_thread(archive_reads.segments(self.archive).has_trace, ranges,
                                                        trace_id)

    @abstractmethod
    async def _has_live_trace(self, trace_id: str) -> bool:
        """Whether any live event carries `trace_id` (one look-up in the trace index)."""

    async def read(
        self,
        *,
        after: int = 0,
        upto: int | None = None,
        types: Sequence[str] | None = None,
        stream: str | None = None,
        trace_id: str | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: int | None = None,
        batch: int = READ_BATCH,
    ) -> AsyncIterator[Recorded]:
        """Events in seq order matching every filter given (`after` is exclusive, `upto` inclusive)."""
        async for rows in self.read_rows(
            after=after, upto=upto, types=types, stream=stream, trace_id=trace_id,
            since=since, until=until, limit=limit, batch=batch,
        ):
            for row in rows:
                yield row_to_recorded(row)

    async def read_rows(
        self,
        *,
        after: int = 0,
        upto: int | None = None,
        types: Sequence[str] | None = None,
        stream: str | None = None,
        trace_id: str | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: int | None = None,
        batch: int = READ_BATCH,
    ) -> AsyncIterator[Rows]:
        """Undecoded rows (plain tuples) in batches, keyset-paginated on seq, all from one read snapshot.

        Archived events are read from their segments and merged in seq order with the live rows, so a reader sees
        one history whether or not parts of it were archived (slower: a segment block is inflated and parsed)."""
        where, params = where_of(types=types, stream=stream, trace_id=trace_id, since=since, until=until)
        filters = Filters(types=frozenset(types) if types else None, stream=stream, trace_id=trace_id,
                          since=since, until=until)
        remaining = limit
        async with self._snapshot() as fetch:
            ranges = await archive_reads.ranges_after(fetch, after, upto)
            if not ranges:  # the common case: nothing archived in the range asked for
                async for rows in live_batches(fetch, where, params, after, upto, remaining, batch):
                    yield rows
                return
            async for rows in archive_reads.merged(archive_reads.segments(self.archive), fetch, ranges, where, params,
                                                   filters, after, upto, batch):
                if remaining is not None:
                    rows = rows[:remaining]
                    remaining -= len(rows)
                if rows:
                    yield rows
                if remaining is not None and remaining <= 0:
                    return

    async def read_live_rows(self, *, types: Sequence[str] | None = None,
                             batch: int = READ_BATCH) -> AsyncIterator[Rows]:
        """The rows the live log holds, in seq order, without reaching into a segment: what a copy of the log
        carries beside its segment files (gaps and all), and the control events that never leave it (a segment
        that fails its check does not stop this read)."""
        where, params = where_of(types=types, stream=None, trace_id=None, since=None, until=None)
        async with self._snapshot() as fetch:
            async for rows in live_batches(fetch, where, params, 0, None, None, batch):
                yield rows

    async def follow(
        self,
        *,
        after: int = 0,
        poll_interval: float = 0.25,
        types: Sequence[str] | None = None,
        stream: str | None = None,
        trace_id: str | None = None,
        since: float | None = None,
        until: float | None = None,
    ) -> AsyncIterator[Recorded]:
        """A live tail: every matching event after `after`, then each new one as it is appended.

        This process's commits are handed over as they commit, with no read back, as long as their seqs run on
        from the last one seen (a query per commit would cost a reader connection each: about 1 ms of CPU per
        request with a console open). The database is read to catch up at the start, when the seqs jump (another
        process committed in between, or the tail fell `FOLLOW_BUFFER` behind), and when the store's watch sees
        another process's commit while this one is quiet (SQLite: a stat of its files every `poll_interval`, then
        its data_version; PostgreSQL: a NOTIFY from another backend).
        """
        types_wanted = frozenset(types) if types else None

        def wanted(rec: Recorded) -> bool:
            return ((types_wanted is None or rec.type in types_wanted)
                    and (stream is None or rec.stream == stream)
                    and (trace_id is None or rec.trace_id == trace_id)
                    and (since is None or rec.ts >= since) and (until is None or rec.ts <= until))

        local: deque[Recorded] = deque(maxlen=FOLLOW_BUFFER)
        arrived = asyncio.Event()

        def on_commit(batch: list[Recorded]) -> None:
            local.extend(batch)
            arrived.set()

        unsubscribe = self.subscribe(on_commit)
        try:
            watch = await self._watch()
            while True:
                # From the database: up to a seq read first, so that `after` passes the non-matching events too.
                watch.mark()
                top = await self.last_seq()
                async for rec in self.read(after=after, upto=top, types=types, stream=stream, trace_id=trace_id,
                                           since=since, until=until):
                    yield rec
                after = max(after, top)
                # Then from this process's commits, until a jump in seqs or another process's commit.
                while True:
                    while local and local[0].seq <= after:
                        local.popleft()
                    if local:
                        if local[0].seq != after + 1:
                            break
                        rec = local.popleft()
                        after = rec.seq
                        if wanted(rec):
                            yield rec
                        continue
                    if await watch.wait(arrived, poll_interval):
                        break
        finally:
            unsubscribe()

    # -- whole logs (snapshots) ------------------------------------------------------------------------------

    def snapshot_bytes(self) -> int:
        """What a copy by `snapshot_into` may take on the local disk, beyond the headroom every write keeps."""
        return 0

    @abstractmethod
    async def snapshot_into(self, target: Path) -> None:
        """The log as it is stored, from one consistent read, into a new SQLite log at `target` (the snapshot
        format's file): the `archived` ranges first, then the live rows, gaps and all (the segments the ranges
        name travel beside it as files)."""
