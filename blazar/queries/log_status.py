"""`blazar log status`: what the log holds and what it costs, read only: the live log's size and events (per day and
type, growth, oldest), the retention in force and what a run would archive now, and the archive's segments.

The archive side is read from the `archived` table and each segment's manifest as it lies on disk (not re-hashed:
`blazar doctor` and `audit verify` check the files; here a missing file is only said). Per-day counts are the live
log's; the archive contributes its counts by type (the manifests' `types`) and each segment's time range.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from blazar.errors import BlazarError
from blazar.events.archive import archivable_types
from blazar.events.log import EventLog
from blazar.events.segment import Manifest
from blazar.events.segment_store import ArchivedRange, SegmentStore
from blazar.logdb import live_bytes

DAY_S = 86400.0
# Growth is measured over this many days before now (or since the oldest live event, when the log is younger).
GROWTH_DAYS = 7
# A log younger than this is not extrapolated to a day: a few minutes of start-up say nothing about a day's growth.
MIN_GROWTH_SPAN_S = 3600.0
# The day (UTC, days since the epoch) of a row's ts, as each store writes it.
_DAY = {"sqlite": "CAST(ts / 86400 AS INTEGER)", "postgresql": "CAST(FLOOR(ts / 86400) AS BIGINT)"}


@dataclass(frozen=True)
class Retention:
    """The settings that decide archiving, as in force now."""

    request_retention: str
    retention_s: float
    archive_every_s: float


def _day(day: int) -> str:
    return datetime.fromtimestamp(day * DAY_S, UTC).strftime("%Y-%m-%d")


def _event(row: Any) -> dict[str, Any] | None:
    return None if row is None else {"seq": int(row[0]), "ts": float(row[1]), "type": str(row[2])}


async def log_status(log: EventLog, retention: Retention, *, now: float, days: int = 14) -> dict[str, Any]:
    """The whole report (its JSON form); `days`: how many most recent days of the live log to count by type."""
    types = archivable_types()
    marks = ", ".join("?" * len(types))
    count, first, last = (await log._fetch("SELECT COUNT(*), MIN(seq), MAX(seq) FROM events"))[0]
    oldest = await log._fetch("SELECT seq, ts, type FROM events ORDER BY seq LIMIT 1")
    oldest_arch = await log._fetch(f"SELECT seq, ts, type FROM events WHERE type IN ({marks}) ORDER BY seq LIMIT 1",
                                   types)
    size = await live_bytes(log)
    live = {"bytes": size, "events": int(count), "first_seq": first, "last_seq": last,
            "oldest": _event(oldest[0] if oldest else None),
            "oldest_archivable": _event(oldest_arch[0] if oldest_arch else None)}
    since_day = int(now // DAY_S) - days + 1
    day_sql = _DAY[log.backend]
    rows = await log._fetch(f"SELECT {day_sql} AS day, type, COUNT(*) FROM events WHERE ts >= ? "
                            "GROUP BY day, type ORDER BY day, type", (since_day * DAY_S,))
    per_day: dict[int, dict[str, int]] = {}
    for day, type_name, n in rows:
        per_day.setdefault(int(day), {})[str(type_name)] = int(n)
    by_type_rows = await log._fetch("SELECT type, COUNT(*) FROM events GROUP BY type ORDER BY type")
    ranges = await log.archived_ranges()
    archive = await _archive(log.archive, ranges)
    by_type: dict[str, dict[str, int]] = {str(t): {"live": int(n), "archived": 0} for t, n in by_type_rows}
    for seg in archive["segments"]:
        for type_name, n in (seg.get("types") or {}).items():
            by_type.setdefault(type_name, {"live": 0, "archived": 0})["archived"] += int(n)
    return {
        "backend": log.backend,
        "location": str(log.location),
        "now": now,
        "live": live,
        "types": dict(sorted(by_type.items())),
        "days": [{"day": _day(d), "events": sum(t.values()), "types": t} for d, t in sorted(per_day.items())],
        "growth": await _growth(log, now=now, oldest_ts=live["oldest"]["ts"] if live["oldest"] else None,
                                bytes_per_event=size / count if count else 0.0),
        "retention": await _retention(log, retention, ranges, types, now=now),
        "archive": archive,
    }


async def _growth(log: EventLog, *, now: float, oldest_ts: float | None, bytes_per_event: float) -> dict[str, Any]:
    """Events recorded over the last GROWTH_DAYS days (or since the oldest live event), per day; bytes per day is
    that times the live log's average bytes per event (an estimate: indexes and free pages included)."""
    start = now - GROWTH_DAYS * DAY_S
    if oldest_ts is not None:
        start = max(start, oldest_ts)
    span = now - start
    if oldest_ts is None or span < MIN_GROWTH_SPAN_S:
        return {"since": start, "span_days": span / DAY_S, "events": None, "events_per_day": None,
                "bytes_per_day": None, "bytes_per_event": bytes_per_event or None}
    (n,) = (await log._fetch("SELECT COUNT(*) FROM events WHERE ts >= ? AND ts <= ?", (start, now)))[0]
    per_day = int(n) * DAY_S / span
    return {"since": start, "span_days": span / DAY_S, "events": int(n), "events_per_day": per_day,
            "bytes_per_day": per_day * bytes_per_event, "bytes_per_event": bytes_per_event}


async def _retention(log: EventLog, retention: Retention, ranges: list[ArchivedRange], types: list[str], *,
                     now: float) -> dict[str, Any]:
    """The policy in force and what a run now would move: the archivable events after the last archived range up to
    the cutoff seq (the last live event, by seq, recorded before now - retention: `operations.archive.cutoff_seq`)."""
    last_archived = await log._fetch("SELECT MAX(ts) FROM events WHERE type = 'log.archived'")
    info: dict[str, Any] = {"request_retention": retention.request_retention, "retention_s": retention.retention_s,
                            "archive_every_s": retention.archive_every_s, "cutoff": None, "cutoff_seq": None,
                            "archivable_now": 0, "last_archived_at": last_archived[0][0] if last_archived else None}
    if retention.retention_s <= 0:
        return info
    cutoff = now - retention.retention_s
    rows = await log._fetch("SELECT seq FROM events WHERE ts < ? ORDER BY ts DESC, seq DESC LIMIT 1", (cutoff,))
    top = int(rows[0][0]) if rows else 0
    after = ranges[-1].last_seq if ranges else 0
    marks = ", ".join("?" * len(types))
    n = 0
    if top > after:
        n = int((await log._fetch(f"SELECT COUNT(*) FROM events WHERE seq > ? AND seq <= ? AND type IN ({marks})",
                                  (after, top, *types)))[0][0])
    info.update(cutoff=cutoff, cutoff_seq=top, archivable_now=n)
    return info


async def _archive(store: SegmentStore | None, ranges: list[ArchivedRange]) -> dict[str, Any]:
    if store is None:
        return {"dir": None, "count": len(ranges), "events": sum(r.count for r in ranges), "bytes": 0,
                "segments": [_segment(store, r) for r in ranges], "orphans": [], "orphan_bytes": 0}
    segments = [await asyncio.to_thread(_segment, store, r) for r in ranges]
    known = {r.name for r in ranges}
    orphans = await asyncio.to_thread(store.orphans, known)
    held = await asyncio.to_thread(lambda: [p for p in store.files() if p.name.split(".", 1)[0] in known])
    return {"dir": str(store.root), "count": len(ranges), "events": sum(r.count for r in ranges),
            "bytes": await asyncio.to_thread(_sizes, held), "segments": segments,
            "orphans": [p.name for p in orphans], "orphan_bytes": await asyncio.to_thread(_sizes, orphans)}


def _sizes(paths: list[Path]) -> int:
    total = 0
    for p in paths:
        with contextlib.suppress(FileNotFoundError):  # a run under way renames its temporaries
            total += p.stat().st_size
    return total


def _segment(store: SegmentStore | None, rng: ArchivedRange) -> dict[str, Any]:
    """One archived range, with its manifest's time range and counts by type where the manifest can be read."""
    seg: dict[str, Any] = {"segment": rng.segment, "name": rng.name, "first_seq": rng.first_seq,
                           "last_seq": rng.last_seq, "count": rng.count, "archived_seq": rng.archived_seq,
                           "bytes": None, "ts_min": None, "ts_max": None, "types": None, "missing": True}
    if store is None:
        return seg
    try:
        data = store.path(rng.name, ".jsonl.gz")
        seg["bytes"] = data.stat().st_size
        manifest = Manifest.decode(rng.name, store.path(rng.name, ".manifest.json").read_bytes())
    except (OSError, BlazarError):
        return seg
    seg.update(ts_min=manifest.ts_min, ts_max=manifest.ts_max, types=dict(manifest.types), missing=False)
    return seg
