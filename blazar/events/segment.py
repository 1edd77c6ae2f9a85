"""Archive segments: the file format, written once and never changed.

A segment is three files named by its stem (`seg-000001-<first_seq>-<last_seq>`) in the archive directory:

- `<stem>.jsonl.gz`: one JSON line per event in seq order, each line hash-chained to the one before
  (`blazar.events.chain`: the first line follows the previous segment's head, so all segments form one chain). The
  line holds the stored row exactly (`data` is the payload's stored text), so a row read back is the row that left
  the live log. Lines are compressed in blocks of `BLOCK_EVENTS`, each block a gzip member of its own: the
  concatenation is one ordinary gzip file (`zcat` reads it), and a reader seeks to one block without inflating the
  others.
- `<stem>.manifest.json`: the segment's identity (seq range, count, the file's sha256, the chain's `prev` and
  `head`, time range, counts by type) and each block's offset, length, seq and time range.
- `<stem>.index`: derived data, rebuilt when missing: which blocks hold each trace id and stream (a small SQLite
  table), so `why` of an archived trace inflates one block instead of the segment.

The live log's `log.archived` event pins the file's and the manifest's sha256; a reader checks the file against it
once per process before trusting a byte of it.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import os
import re
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from blazar.errors import SegmentBroken
from blazar.events.chain import line_hash, seal

FORMAT = "blazar-segment"
VERSION = 1
BLOCK_EVENTS = 1024
LINE_KEYS = ("seq", "ts", "type", "v", "stream", "trace_id", "actor", "cause", "data")
STEM = re.compile(r"^seg-(\d{6})-(\d+)-(\d+)$")
SUFFIXES = (".jsonl.gz", ".manifest.json", ".index")

Row = tuple[Any, ...]


def stem_of(segment: int, first_seq: int, last_seq: int) -> str:
    return f"seg-{segment:06d}-{first_seq}-{last_seq}"


def valid_stem(name: str) -> bool:
    """A segment's name as an event may give it: a bare stem, never a path."""
    return STEM.fullmatch(name) is not None


@dataclass(frozen=True, slots=True)
class Block:
    offset: int
    length: int
    first_seq: int
    last_seq: int
    count: int
    ts_min: float
    ts_max: float

    def to_json(self) -> dict[str, Any]:
        return {"offset": self.offset, "length": self.length, "first_seq": self.first_seq,
                "last_seq": self.last_seq, "count": self.count, "ts_min": self.ts_min, "ts_max": self.ts_max}


@dataclass(frozen=True, slots=True)
class Manifest:
    segment: int
    name: str
    first_seq: int  # the range this segment answers for (every archivable event in it is here)
    last_seq: int
    count: int
    size: int  # the data file's bytes
    sha256: str
    prev: str
    head: str
    ts_min: float
    ts_max: float
    cutoff: float
    audit_records: int
    types: dict[str, int]
    blocks: tuple[Block, ...]
    created_at: float
    index_sha256: str  # the index file as written (a different one is rebuilt from the data file)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT, "version": VERSION, "segment": self.segment, "name": self.name,
            "first_seq": self.first_seq, "last_seq": self.last_seq, "count": self.count, "bytes": self.size,
            "sha256": self.sha256, "prev": self.prev, "head": self.head, "ts_min": self.ts_min,
            "ts_max": self.ts_max, "cutoff": self.cutoff, "audit_records": self.audit_records,
            "types": dict(sorted(self.types.items())), "blocks": [b.to_json() for b in self.blocks],
            "created_at": self.created_at, "index_sha256": self.index_sha256,
        }

    def encode(self) -> bytes:
        return orjson.dumps(self.to_json(), option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2)

    @classmethod
    def decode(cls, name: str, raw: bytes) -> Manifest:
        try:
            obj = orjson.loads(raw)
            if obj.get("format") != FORMAT or obj.get("version") != VERSION:
                raise SegmentBroken(name, None, f"manifest is not a {FORMAT} v{VERSION} manifest")
            return cls(
                segment=int(obj["segment"]), name=str(obj["name"]), first_seq=int(obj["first_seq"]),
                last_seq=int(obj["last_seq"]), count=int(obj["count"]), size=int(obj["bytes"]),
                sha256=str(obj["sha256"]), prev=str(obj["prev"]), head=str(obj["head"]),
                ts_min=float(obj["ts_min"]), ts_max=float(obj["ts_max"]), cutoff=float(obj["cutoff"]),
                audit_records=int(obj["audit_records"]), types={str(k): int(v) for k, v in obj["types"].items()},
                blocks=tuple(Block(**{k: b[k] for k in Block.__slots__}) for b in obj["blocks"]),
                created_at=float(obj["created_at"]), index_sha256=str(obj["index_sha256"]),
            )
        except SegmentBroken:
            raise
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as e:
            raise SegmentBroken(name, None, f"manifest unreadable: {e}") from None


@dataclass(frozen=True, slots=True)
class Filters:
    """The filters `EventLog.read_rows` takes, applied to archived rows."""

    types: frozenset[str] | None = None
    stream: str | None = None
    trace_id: str | None = None
    since: float | None = None
    until: float | None = None

    def matches(self, row: Row) -> bool:
        _, ts, type_name, _, stream, trace_id, *_ = row
        return ((self.types is None or type_name in self.types)
                and (self.stream is None or stream == self.stream)
                and (self.trace_id is None or trace_id == self.trace_id)
                and (self.since is None or ts >= self.since) and (self.until is None or ts <= self.until))

    def may_hold(self, block: Block) -> bool:
        return ((self.since is None or block.ts_max >= self.since)
                and (self.until is None or block.ts_min <= self.until))


def row_fingerprint(rows: Iterable[Row], digest: Any) -> int:
    """Feed rows into `digest` in one canonical form (what the live log held); returns how many."""
    n = 0
    for row in rows:
        digest.update(orjson.dumps(list(row)))
        n += 1
    return n


# -- writing ---------------------------------------------------------------------------------------------------


@dataclass
class SegmentWriter:
    """Writes one segment's data file (under a temporary name) block by block as rows arrive."""

    path: Path
    prev: str
    audit_types: frozenset[str] = frozenset()
    head: str = ""
    count: int = 0
    audit_records: int = 0
    types: dict[str, int] = field(default_factory=dict)
    blocks: list[Block] = field(default_factory=list)
    rows_digest: Any = field(default_factory=hashlib.sha256)  # what was written, in row form
    _pending: list[Row] = field(default_factory=list)
    _fh: BinaryIO | None = None
    _file_digest: Any = field(default_factory=hashlib.sha256)
    _offset: int = 0

    def __post_init__(self) -> None:
        self.head = self.prev
        self._fh = self.path.open("wb")

    def add(self, rows: Sequence[Row]) -> None:
        self._pending.extend(rows)
        while len(self._pending) >= BLOCK_EVENTS:
            self._flush(self._pending[:BLOCK_EVENTS])
            del self._pending[:BLOCK_EVENTS]

    def _flush(self, rows: Sequence[Row]) -> None:
        assert self._fh is not None
        lines = []
        for row in rows:
            line, self.head = seal(dict(zip(LINE_KEYS, row, strict=True)), self.head)
            lines.append(line)
            self.types[row[2]] = self.types.get(row[2], 0) + 1
            if row[2] in self.audit_types:
                self.audit_records += 1
        row_fingerprint(rows, self.rows_digest)
        member = gzip.compress(b"".join(lines), compresslevel=6, mtime=0)
        self._fh.write(member)
        self._file_digest.update(member)
        self.blocks.append(Block(offset=self._offset, length=len(member), first_seq=rows[0][0],
                                 last_seq=rows[-1][0], count=len(rows), ts_min=min(r[1] for r in rows),
                                 ts_max=max(r[1] for r in rows)))
        self._offset += len(member)
        self.count += len(rows)

    def finish(self) -> tuple[str, int]:
        """Flush, fsync and close; returns (sha256, bytes) of the file."""
        if self._pending:
            self._flush(self._pending)
            self._pending = []
        assert self._fh is not None
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()
        self._fh = None
        return self._file_digest.hexdigest(), self._offset

    def abort(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


# -- reading ---------------------------------------------------------------------------------------------------


def _row_of(name: str, n: int, raw: bytes) -> tuple[Row, dict[str, Any]]:
    try:
        obj = orjson.loads(raw)
        return tuple(obj[k] for k in LINE_KEYS), obj
    except (orjson.JSONDecodeError, KeyError, TypeError):
        raise SegmentBroken(name, n, "not a segment line (unreadable JSON or missing keys)") from None


def read_block(fh: BinaryIO, name: str, block: Block) -> list[Row]:
    """The rows of one block (its bytes were checked with the file's sha256 when the segment was opened)."""
    fh.seek(block.offset)
    try:
        text = gzip.decompress(fh.read(block.length))
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise SegmentBroken(name, None, f"block at seq {block.first_seq} does not inflate: {e}") from None
    return [_row_of(name, 0, raw)[0] for raw in text.splitlines()]


@dataclass(frozen=True, slots=True)
class ChainCheck:
    """What a walk over a segment's lines found: rows, their fingerprint (as `SegmentWriter.rows_digest`), head."""

    count: int
    head: str
    rows_sha256: str
    first_seq: int | None
    last_seq: int | None


def walk_lines(path: Path, name: str, *, prev: str, first_seq: int, last_seq: int) -> ChainCheck:
    """Read every line of a segment, checking each line's hash, its link to the line before, and seq order and
    range; raises SegmentBroken naming the first bad line (1-based, across the whole file)."""
    digest = hashlib.sha256()
    head, last, first, n = prev, None, None, 0
    try:
        with gzip.open(path, "rb") as fh:
            for n, raw in enumerate(fh, start=1):
                row, obj = _row_of(name, n, raw.rstrip(b"\n"))
                if "hash" not in obj or "prev" not in obj or line_hash(obj) != obj["hash"]:
                    raise SegmentBroken(name, n, "content does not match its hash: the line was edited")
                if obj["prev"] != head:
                    detail = ("does not follow the previous segment's head" if n == 1 else
                              f"does not follow line {n - 1}: a line was dropped, inserted or reordered")
                    raise SegmentBroken(name, n, detail)
                seq = row[0]
                if not isinstance(seq, int) or not first_seq <= seq <= last_seq:
                    raise SegmentBroken(name, n, f"seq {seq!r} is outside the segment's range {first_seq}..{last_seq}")
                if last is not None and seq <= last:
                    raise SegmentBroken(name, n, f"seq {seq} does not come after seq {last}: out of order")
                first = seq if first is None else first
                last = seq
                head = obj["hash"]
                digest.update(orjson.dumps(list(row)))
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise SegmentBroken(name, n + 1, f"the file does not inflate past here: {e}") from None
    return ChainCheck(count=n, head=head, rows_sha256=digest.hexdigest(), first_seq=first, last_seq=last)


# -- the trace and stream index (derived) -----------------------------------------------------------------------


_INDEX_SCHEMA = "CREATE TABLE keys (key TEXT NOT NULL, block INTEGER NOT NULL, PRIMARY KEY (key, block)) WITHOUT ROWID"


def index_keys(rows: Iterable[Row], block: int) -> Iterator[tuple[str, int]]:
    for row in rows:
        yield "s" + row[4], block
        if row[5] is not None:
            yield "t" + row[5], block


def write_index(path: Path, keyed: Iterable[tuple[str, int]]) -> None:
    """The index of one segment, written under a temporary name and renamed into place."""
    tmp = path.with_name(f".{path.name}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    conn = sqlite3.connect(tmp, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=OFF")
        conn.execute(_INDEX_SCHEMA)
        conn.execute("BEGIN")
        conn.executemany("INSERT OR IGNORE INTO keys VALUES (?, ?)", keyed)
        conn.execute("COMMIT")
    finally:
        conn.close()
    with tmp.open("rb+") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def index_blocks(path: Path, key: str) -> list[int]:
    conn = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True)
    try:
        return [r[0] for r in conn.execute("SELECT block FROM keys WHERE key = ? ORDER BY block", (key,))]
    finally:
        conn.close()

