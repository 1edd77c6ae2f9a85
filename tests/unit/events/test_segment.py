"""The archive segment format: what is written reads back row for row, the chain names the first bad line, and a
segment is found only by a bare stem inside the archive directory."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from blazar.durable import file_sha256
from blazar.errors import SegmentBroken
from blazar.events.chain import GENESIS
from blazar.events.segment import (
    Manifest,
    SegmentWriter,
    read_block,
    stem_of,
    valid_stem,
    walk_lines,
)
from blazar.events.segment_store import SegmentStore


def _rows(n: int, first: int = 1) -> list[tuple]:
    return [(first + i * 2, 1000.0 + i, "request.received", 1, f"trace:t{i}", f"t{i}", "gw", None,
             f'{{"trace_id": "t{i}", "note": "naïve ☃"}}') for i in range(n)]


def _write(path: Path, rows: list[tuple], monkeypatch: pytest.MonkeyPatch, block: int = 4) -> SegmentWriter:
    monkeypatch.setattr("blazar.events.segment.BLOCK_EVENTS", block)
    writer = SegmentWriter(path, GENESIS)
    writer.add(rows[:5])
    writer.add(rows[5:])
    writer.finish()
    return writer


def test_rows_read_back_exactly_block_by_block(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = _rows(11)
    writer = _write(tmp_path / "s.jsonl.gz", rows, monkeypatch)
    assert [b.count for b in writer.blocks] == [4, 4, 3]
    with (tmp_path / "s.jsonl.gz").open("rb") as fh:
        got = [r for b in writer.blocks for r in read_block(fh, "s", b)]
    assert got == rows
    # One ordinary gzip file: zcat reads it whole.
    assert len(gzip.decompress((tmp_path / "s.jsonl.gz").read_bytes()).splitlines()) == 11
    check = walk_lines(tmp_path / "s.jsonl.gz", "s", prev=GENESIS, first_seq=1, last_seq=21)
    assert (check.count, check.head, check.rows_sha256) == (11, writer.head, writer.rows_digest.hexdigest())


def _rewrite(path: Path, edit) -> None:  # type: ignore[no-untyped-def]
    lines = gzip.decompress(path.read_bytes()).splitlines(keepends=True)
    path.write_bytes(gzip.compress(b"".join(edit(lines))))


@pytest.mark.parametrize(("edit", "line", "says"), [
    (lambda ls: [*ls[:3], ls[3].replace(b"\\u2603", b"x").replace(b"gw", b"GW"), *ls[4:]], 4, "edited"),
    (lambda ls: [*ls[:6], *ls[7:]], 7, "dropped, inserted or reordered"),
    (lambda ls: [*ls[:2], ls[3], ls[2], *ls[4:]], 3, "dropped, inserted or reordered"),
], ids=["edited", "dropped", "reordered"])
def test_the_chain_names_the_first_bad_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, edit, line: int,
                                            says: str) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "s.jsonl.gz"
    _write(path, _rows(9), monkeypatch)
    _rewrite(path, edit)
    with pytest.raises(SegmentBroken) as info:
        walk_lines(path, "s", prev=GENESIS, first_seq=1, last_seq=17)
    assert info.value.line == line and says in str(info.value)


def test_a_segment_that_does_not_follow_the_previous_head_is_named(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "s.jsonl.gz"
    _write(path, _rows(3), monkeypatch)
    with pytest.raises(SegmentBroken, match="line 1: does not follow the previous segment's head"):
        walk_lines(path, "s", prev="f" * 64, first_seq=1, last_seq=5)
    with pytest.raises(SegmentBroken, match="outside the segment's range"):
        walk_lines(path, "s", prev=GENESIS, first_seq=2, last_seq=5)


@pytest.mark.parametrize("name", ["../seg-000001-1-2", "seg-000001-1-2/x", "/etc/passwd", "seg-1-1-2", "", "seg-"])
def test_only_a_bare_stem_names_a_segment(tmp_path: Path, name: str) -> None:
    assert not valid_stem(name)
    with pytest.raises(SegmentBroken, match="not a segment name"):
        SegmentStore(tmp_path).path(name, ".jsonl.gz")
    assert valid_stem(stem_of(1, 1, 2)) and SegmentStore(tmp_path).path(stem_of(1, 1, 2), ".index").parent == tmp_path


def test_a_manifest_round_trips_and_a_foreign_one_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "s.jsonl.gz"
    writer = _write(path, _rows(5), monkeypatch)
    manifest = Manifest(segment=1, name=stem_of(1, 1, 9), first_seq=1, last_seq=9, count=5, size=path.stat().st_size,
                        sha256=file_sha256(path), prev=GENESIS, head=writer.head, ts_min=1000.0, ts_max=1004.0,
                        cutoff=2000.0, audit_records=0, types=writer.types, blocks=tuple(writer.blocks),
                        created_at=3000.0, index_sha256="0" * 64)
    assert Manifest.decode(manifest.name, manifest.encode()) == manifest
    with pytest.raises(SegmentBroken, match="manifest"):
        Manifest.decode("x", b'{"format": "something-else"}')
    with pytest.raises(SegmentBroken, match="manifest unreadable"):
        Manifest.decode("x", b"not json")
