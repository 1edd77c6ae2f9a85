"""The archive directory: the segments the live log's `archived` table names, opened and checked before use.

The log is not trusted with paths: a segment is found by its stem (checked to be a bare `seg-...` name) inside
this directory only, and its data file is hashed and compared with the sha256 the log recorded before any line of
it is read (once per process per segment). Files in the directory that no archived range names are leftovers of
an archive run that stopped before its commit: `orphans()` lists them, and only those may be removed.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blazar.durable import file_sha256
from blazar.errors import SegmentBroken, SegmentMissing
from blazar.events import segment_traces
from blazar.events.segment import (
    STEM,
    SUFFIXES,
    Block,
    Filters,
    Manifest,
    Row,
    index_blocks,
    index_keys,
    read_block,
    valid_stem,
    write_index,
)


@dataclass(frozen=True, slots=True)
class ArchivedRange:
    """One row of the live log's `archived` table: what it promises the archive holds."""

    segment: int
    name: str
    first_seq: int
    last_seq: int
    count: int
    sha256: str
    archived_seq: int

    @classmethod
    def of(cls, row: Sequence[Any]) -> ArchivedRange:
        return cls(int(row[0]), str(row[1]), int(row[2]), int(row[3]), int(row[4]), str(row[5]), int(row[6]))


ARCHIVED_COLUMNS = "segment, name, first_seq, last_seq, count, sha256, archived_seq"


class SegmentStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._manifests: dict[str, Manifest] = {}  # stem -> manifest, checked against the log's range
        self._data_ok: set[str] = set()  # stems whose data file's sha256 matched the log's record
        self._traces_cover: set[tuple[str, str]] = set()  # (stem, sha256) the index across segments lists
        self._lock = threading.Lock()

    def path(self, name: str, suffix: str) -> Path:
        if not valid_stem(name) or suffix not in SUFFIXES:
            raise SegmentBroken(name, None, "not a segment name (the log names segments by a bare seg-... stem)")
        return self.root / f"{name}{suffix}"

    # -- opening -------------------------------------------------------------------------------------------

    def manifest(self, rng: ArchivedRange) -> Manifest:
        """The segment's manifest, checked against the range the log recorded, with its index in place (rebuilt from
        the checked data file when missing). Cheap: the data file is hashed only before a block of it is first read
        (`_checked_data`). NOTE: the index is derived and not hashed here (that would cost every `blazar why` a
        read of every segment's index): rows only ever come from the checked data file and are filtered again, so a
        damaged index can hide rows from a look-up, never change them; `audit verify --archive` checks it."""
        with self._lock:
            got = self._manifests.get(rng.name)
        if got is not None:
            return got
        data = self.path(rng.name, ".jsonl.gz")
        mpath = self.path(rng.name, ".manifest.json")
        for path in (data, mpath):
            if not path.is_file():
                raise SegmentMissing(rng.name, rng.first_seq, rng.last_seq, f"no {path}")
        manifest = Manifest.decode(rng.name, mpath.read_bytes())
        if (manifest.sha256, manifest.first_seq, manifest.last_seq, manifest.count) != (
                rng.sha256, rng.first_seq, rng.last_seq, rng.count):
            raise SegmentBroken(rng.name, None, "the manifest does not describe the segment the log recorded")
        index = self.path(rng.name, ".index")
        if not index.is_file():
            self._checked_data(rng)
            self._rebuild_index(rng.name, manifest)
        with self._lock:
            self._manifests[rng.name] = manifest
        return manifest

    def _checked_data(self, rng: ArchivedRange) -> Path:
        """The data file, once its sha256 is the one the log recorded (hashed once per process)."""
        data = self.path(rng.name, ".jsonl.gz")
        with self._lock:
            if rng.name in self._data_ok:
                return data
        if not data.is_file():
            raise SegmentMissing(rng.name, rng.first_seq, rng.last_seq, f"no {data}")
        if file_sha256(data) != rng.sha256:
            raise SegmentBroken(rng.name, None, "the data file's sha256 differs from the one the log recorded: "
                                "it was altered (run `blazar audit verify --archive` for the first bad line)")
        with self._lock:
            self._data_ok.add(rng.name)
        return data

    def forget(self) -> None:
        """Check every segment again on next use (after files were replaced)."""
        with self._lock:
            self._manifests.clear()
            self._data_ok.clear()
            self._traces_cover.clear()

    def _rebuild_index(self, name: str, manifest: Manifest) -> None:
        with self.path(name, ".jsonl.gz").open("rb") as fh:
            keyed = [k for i, b in enumerate(manifest.blocks) for k in index_keys(read_block(fh, name, b), i)]
        write_index(self.path(name, ".index"), keyed)

    # -- reading -------------------------------------------------------------------------------------------

    def blocks(self, rng: ArchivedRange, *, after: int, upto: int | None, filters: Filters) -> list[Block]:
        """The blocks of the segment that may hold matching rows with seq in (after, upto]."""
        manifest = self.manifest(rng)
        if filters.types is not None and filters.types.isdisjoint(manifest.types):
            return []  # e.g. the audit export: no audit-relevant type was archived here
        wanted: set[int] | None = None
        key = "t" + filters.trace_id if filters.trace_id is not None else (
            "s" + filters.stream if filters.stream is not None else None)
        if key is not None:
            wanted = set(index_blocks(self.path(rng.name, ".index"), key))
        return [b for i, b in enumerate(manifest.blocks)
                if (wanted is None or i in wanted) and b.last_seq > after
                and (upto is None or b.first_seq <= upto) and filters.may_hold(b)]

    def block_rows(self, rng: ArchivedRange, block: Block, *, after: int, upto: int | None,
                   filters: Filters) -> list[Row]:
        with self._checked_data(rng).open("rb") as fh:
            rows = read_block(fh, rng.name, block)
        return [r for r in rows if r[0] > after and (upto is None or r[0] <= upto) and filters.matches(r)]

    def seq_at_time(self, ranges: Sequence[ArchivedRange], ts: float) -> int:
        """The last archived seq recorded at or before `ts` (0 when none)."""
        best = 0
        for rng in reversed(ranges):
            for block in reversed(self.manifest(rng).blocks):
                if block.ts_min > ts:
                    continue
                rows = self.block_rows(rng, block, after=0, upto=None, filters=Filters(until=ts))
                if rows:
                    best = max(best, int(rows[-1][0]))
                    if block.ts_max <= ts:  # every row of it counts: no later block of this segment is older
                        return best
        return best

    def _traces(self, ranges: Sequence[ArchivedRange]) -> Path:
        """The index across segments, listing every one of `ranges` (`segment_traces`)."""
        with self._lock:
            known = set(self._traces_cover)
        missing = [r for r in ranges if (r.name, r.sha256) not in known]
        if missing or not (self.root / segment_traces.NAME).is_file():
            for rng in missing:
                self.manifest(rng)  # checks it against the log, and its own index is in place
            path = segment_traces.bring_up_to_date(
                self.root, ranges, {r.name: self.path(r.name, ".index") for r in ranges})
            with self._lock:
                self._traces_cover.update((r.name, r.sha256) for r in ranges)
            return path
        return self.root / segment_traces.NAME

    def index_traces(self, ranges: Sequence[ArchivedRange]) -> None:
        """Bring the index across segments up to date with `ranges` (the archiver does, right after a commit)."""
        self._traces(ranges)

    def with_trace(self, ranges: Sequence[ArchivedRange], trace_id: str) -> list[ArchivedRange]:
        """The segments among `ranges` that hold events of `trace_id` (one look-up, whatever their number)."""
        if not ranges:
            return []
        hits = segment_traces.segments_with(self._traces(ranges), trace_id)
        return [r for r in ranges if r.segment in hits]

    def has_trace(self, ranges: Sequence[ArchivedRange], trace_id: str) -> bool:
        return bool(self.with_trace(ranges, trace_id))

    def trace_ids_starting(self, ranges: Sequence[ArchivedRange], prefix: str, *, limit: int) -> list[str]:
        if not ranges:
            return []
        return segment_traces.ids_starting(self._traces(ranges), prefix, limit)

    # -- the directory -------------------------------------------------------------------------------------

    def files(self) -> Iterator[Path]:
        if not self.root.is_dir():
            return
        for path in sorted(self.root.iterdir()):
            stem = next((path.name[: -len(s)] for s in SUFFIXES if path.name.endswith(s)), None)
            if stem is not None and STEM.fullmatch(stem):
                yield path

    def orphans(self, known: set[str]) -> list[Path]:
        """Segment files (and their temporaries) that no archived range names: a run that stopped before its
        commit left them, and nothing reads them."""
        found = [p for p in self.files() if p.name.split(".", 1)[0] not in known]
        if self.root.is_dir():
            found += [p for p in self.root.iterdir() if p.name.startswith(".seg-") and p.name.endswith(".tmp")]
        return sorted(found)

    def size_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.files())
