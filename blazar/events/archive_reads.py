"""Reads that reach into the archive: the ranges a read spans, and archived rows merged in seq order with the live
rows recorded meanwhile (block by block). The log composes them into `read_rows`; the segments are its `archive`."""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import AsyncIterator
from typing import Any

from blazar.errors import ArchiveError
from blazar.events.log_sql import Fetch, Rows, live_batches
from blazar.events.segment import Filters
from blazar.events.segment_store import ARCHIVED_COLUMNS, ArchivedRange, SegmentStore


def segments(store: SegmentStore | None) -> SegmentStore:
    """The archive's segments, where a read needs them."""
    if store is None:
        raise ArchiveError("the log has archived segments but no archive directory to read them from")
    return store


async def ranges_after(fetch: Fetch, after: int, upto: int | None) -> list[ArchivedRange]:
    """The archived ranges holding seqs in (after, upto]."""
    sql = f"SELECT {ARCHIVED_COLUMNS} FROM archived WHERE last_seq > ?"
    params: list[Any] = [after]
    if upto is not None:
        sql += " AND first_seq <= ?"
        params.append(upto)
    return [ArchivedRange.of(r) for r in await fetch(sql + " ORDER BY first_seq", params)]


async def merged(store: SegmentStore, fetch: Fetch, ranges: list[ArchivedRange], where: list[str],
                 params: list[Any], filters: Filters, after: int, upto: int | None, batch: int
                 ) -> AsyncIterator[Rows]:
    """Live rows and archived rows in seq order: block by block, each block's rows merged with the live rows
    in its seq span (the control events recorded meanwhile), the live rows between blocks read as they are."""
    if filters.trace_id is not None:
        # Trace ids are random: ask the index across segments which hold it, not each segment's own index.
        ranges = await asyncio.to_thread(store.with_trace, ranges, filters.trace_id)
    cursor = after
    for rng in ranges:
        blocks = await asyncio.to_thread(store.blocks, rng, after=cursor, upto=upto, filters=filters)
        for block in blocks:
            async for rows in live_batches(fetch, where, params, cursor, block.first_seq - 1, None, batch):
                yield rows
            cursor = max(cursor, block.first_seq - 1)
            archived = await asyncio.to_thread(store.block_rows, rng, block, after=cursor, upto=upto,
                                               filters=filters)
            top = block.last_seq if upto is None else min(block.last_seq, upto)
            live = [r async for rows in live_batches(fetch, where, params, cursor, top, None, batch)
                    for r in rows]
            merged = list(heapq.merge(archived, live, key=lambda r: r[0]))
            for i in range(0, len(merged), batch):
                yield merged[i:i + batch]
            cursor = top
    async for rows in live_batches(fetch, where, params, cursor, upto, None, batch):
        yield rows
