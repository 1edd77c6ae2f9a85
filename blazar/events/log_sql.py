"""The SQL both log stores run (written with `?` placeholders; the PostgreSQL store numbers them): the columns, the
statements a copy or an archive run writes, the read filters and keyset pagination, and a row's decoding."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from blazar.events.base import Recorded
from blazar.events.segment_store import ARCHIVED_COLUMNS
from blazar.events.types import decode

COLUMNS = "seq, ts, type, v, stream, trace_id, actor, cause, data"
READ_BATCH = 5000
INSERT_INTO_FILE = f"INSERT INTO events ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
INSERT_ARCHIVED = f"INSERT INTO archived ({ARCHIVED_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)"

Rows = list[tuple[Any, ...]]
# Runs one statement (`?` placeholders) inside a store's read snapshot; returns its rows.
Fetch = Callable[[str, Sequence[Any]], Awaitable[Rows]]


def row_to_recorded(row: Sequence[Any]) -> Recorded:
    seq, ts, type_name, v, stream, trace_id, actor, cause, data = row
    return Recorded(
        seq=seq,
        ts=ts,
        type=type_name,
        v=v,
        stream=stream,
        trace_id=trace_id,
        actor=actor,
        cause=cause,
        event=decode(seq, type_name, v, data),
    )


def where_of(*, types: Sequence[str] | None, stream: str | None, trace_id: str | None, since: float | None,
           until: float | None) -> tuple[list[str], list[Any]]:
    """The filters as SQL conditions (after the seq bounds) and their parameters."""
    where: list[str] = []
    params: list[Any] = []
    if types:
        where.append(f"type IN ({', '.join('?' * len(types))})")
        params.extend(types)
    if stream is not None:
        where.append("stream = ?")
        params.append(stream)
    if trace_id is not None:
        where.append("trace_id = ?")
        params.append(trace_id)
    if since is not None:
        where.append("ts >= ?")
        params.append(since)
    if until is not None:
        where.append("ts <= ?")
        params.append(until)
    return where, params


async def live_batches(fetch: Fetch, where: list[str], params: list[Any], after: int, upto: int | None,
                        limit: int | None, batch: int) -> AsyncIterator[Rows]:
    """Live rows with seq in (after, upto] matching `where`, keyset-paginated on seq."""
    if upto is not None and upto <= after:
        return
    bounds = ["seq > ?"] + (["seq <= ?"] if upto is not None else [])
    sql = f"SELECT {COLUMNS} FROM events WHERE {' AND '.join(bounds + where)} ORDER BY seq LIMIT ?"
    tail = ([upto] if upto is not None else []) + params
    remaining = limit
    while remaining is None or remaining > 0:
        n = batch if remaining is None else min(batch, remaining)
        rows = await fetch(sql, (after, *tail, n))
        if not rows:
            return
        yield rows
        after = rows[-1][0]
        if remaining is not None:
            remaining -= len(rows)
        if len(rows) < n:
            return
