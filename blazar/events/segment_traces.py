"""One index across every archive segment: which segments hold each trace id (`<archive>/traces.index`).

Trace ids are random, so without it a look-up of one archived trace (`blazar why`, the gateway's check that a
client's trace id is new) would open every segment's own index: linear in the segment count, about a second and a
half a year at one request a second. With it a look-up is one query, then the one segment's index and block.

Derived data like each segment's `.index`: built from those indexes, brought up to date on use (a segment the
`covered` table does not list is added; one listed with another sha256 means another archive: rebuilt), and safe to
delete. It can only narrow a look-up to segments, never supply a row: rows come from the checked data files.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from blazar.events.segment_store import ArchivedRange

NAME = "traces.index"
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS traces (trace_id TEXT NOT NULL, segment INTEGER NOT NULL,"
    " PRIMARY KEY (trace_id, segment)) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS covered (segment INTEGER PRIMARY KEY, sha256 TEXT NOT NULL)",
)


@contextlib.contextmanager
def _connect(path: Path) -> Iterator[sqlite3.Connection]:
    conn = sqlite3.connect(path, timeout=30, isolation_level=None)
    try:
        yield conn
    finally:
        conn.close()


def _segment_traces(index: Path) -> Iterator[tuple[str]]:
    """The trace ids a segment's own index lists."""
    conn = sqlite3.connect(f"{index.absolute().as_uri()}?mode=ro", uri=True)
    try:
        for (key,) in conn.execute("SELECT DISTINCT key FROM keys WHERE key >= 't' AND key < 'u'"):
            yield (key[1:],)
    finally:
        conn.close()


def bring_up_to_date(root: Path, ranges: Sequence[ArchivedRange], segment_index: dict[str, Path]) -> Path:
    """The index file, listing every segment in `ranges` (added from `segment_index[name]`, each segment's own
    index, which the caller has made sure exists)."""
    path = root / NAME
    with _connect(path) as conn:
        for statement in _SCHEMA:
            conn.execute(statement)
        covered = dict(conn.execute("SELECT segment, sha256 FROM covered"))
        if any(covered.get(r.segment, r.sha256) != r.sha256 for r in ranges):  # another archive's: start again
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("DELETE FROM traces")
            conn.execute("DELETE FROM covered")
            conn.execute("COMMIT")
            covered = {}
        for rng in ranges:
            if rng.segment in covered:
                continue
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(f"INSERT OR IGNORE INTO traces VALUES (?, {int(rng.segment)})",
                             _segment_traces(segment_index[rng.name]))
            conn.execute("INSERT OR REPLACE INTO covered VALUES (?, ?)", (rng.segment, rng.sha256))
            conn.execute("COMMIT")
    return path


def segments_with(path: Path, trace_id: str) -> set[int]:
    with _connect(path) as conn:
        return {r[0] for r in conn.execute("SELECT segment FROM traces WHERE trace_id = ?", (trace_id,))}


def ids_starting(path: Path, prefix: str, limit: int) -> list[str]:
    with _connect(path) as conn:
        rows = conn.execute("SELECT DISTINCT trace_id FROM traces WHERE trace_id >= ? AND trace_id < ?"
                            " ORDER BY trace_id LIMIT ?", (prefix, prefix + "\U0010ffff", limit))
        return [r[0] for r in rows]
