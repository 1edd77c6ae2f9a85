"""`blazar audit verify --archive` end to end: a clean archive verifies; an edited, dropped or swapped line, a
segment replaced by another whose lines chain, a rewritten file, an altered manifest, a segment swapped for another
and a deleted one are each named (segment and line) with exit 5. Also: the audit export reads across the cut."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import orjson
import pytest

from blazar.bootstrap import bootstrap, open_log_only
from blazar.clock import FakeClock
from blazar.events.archive import LogArchived
from blazar.events.chain import seal
from blazar.events.requests import RequestReceived
from blazar.operations.archive import archive
from blazar.paths import Paths
from blazar.queries.archive_verify import ArchiveReport, verify_archive
from blazar.queries.audit import export_audit, verify_lines
from tests.conftest import Cli
from tests.support.archived import seed_archived, segment_lines, write_segment_lines

EXIT_BROKEN = 5


async def _report(paths: Paths, clock: FakeClock) -> ArchiveReport:
    log = await open_log_only(paths=paths, clock=clock)
    try:
        return await verify_archive(log)
    finally:
        await log.close()


def _data(paths: Paths, seg: LogArchived, suffix: str = ".jsonl.gz") -> Path:
    return paths.archive / f"{seg.name}{suffix}"


async def _one_error(paths: Paths, clock: FakeClock, seg: LogArchived) -> tuple[int | None, str]:
    report = await _report(paths, clock)
    broken = [s for s in report.segments if not s.ok]
    assert [s.name for s in broken] == [seg.name], report.to_json()
    got = broken[0].to_json()
    return got["line"], got["error"]


async def test_a_clean_archive_verifies_through_the_cli(cli: Cli, paths: Paths, clock: FakeClock) -> None:
    segs = await seed_archived(paths, clock)
    res = cli("audit", "verify", "--archive")
    assert res.stdout.startswith(f"ok: 3 segments, 12 events, seq 1..{segs[-1].last_seq}, chain head {segs[-1].head}")
    doc = cli("audit", "verify", "--archive", "--json").json()
    assert doc["ok"] and doc["events"] == 12 and doc["head"] == segs[-1].head
    assert [(s["name"], s["ok"], s["line"]) for s in doc["segments"]] == [(s.name, True, None) for s in segs]
    # Exactly one of FILE and --archive.
    assert cli("audit", "verify", check=False).code == 2
    assert cli("audit", "verify", "--archive", str(paths.archive / "x"), check=False).code == 2


async def test_a_home_with_nothing_archived_verifies(cli: Cli) -> None:
    cli("config", "set", "telemetry.log_level", "info")
    assert cli("audit", "verify", "--archive").stdout.startswith("ok: no archived segments")


async def test_an_edited_line_is_named_by_segment_and_line_with_exit_5(cli: Cli, paths: Paths,
                                                                      clock: FakeClock) -> None:
    segs = await seed_archived(paths, clock)
    path = _data(paths, segs[1])
    lines = segment_lines(path)
    lines[2] = lines[2].replace(b'"actor":"gateway"', b'"actor":"intruder"')
    assert lines[2] != segment_lines(path)[2]
    write_segment_lines(path, lines)
    res = cli("audit", "verify", "--archive", check=False)
    assert res.code == EXIT_BROKEN
    assert (f"archive segment {segs[1].name} line 3: content does not match its hash: the line was edited"
            in res.stderr)
    doc = cli("audit", "verify", "--archive", "--json", check=False).json()
    assert not doc["ok"]
    assert [(s["ok"], s["line"]) for s in doc["segments"]] == [(True, None), (False, 3), (True, None)]


async def test_a_dropped_or_swapped_line_is_named(paths: Paths, clock: FakeClock) -> None:
    segs = await seed_archived(paths, clock)
    path = _data(paths, segs[0])
    original = path.read_bytes()
    lines = segment_lines(path)

    write_segment_lines(path, lines[:1] + lines[2:])
    line, error = await _one_error(paths, clock, segs[0])
    assert (line, error) == (2, f"archive segment {segs[0].name} line 2: does not follow line 1: a line was "
                                "dropped, inserted or reordered")

    write_segment_lines(path, [lines[0], lines[2], lines[1], lines[3]])
    assert (await _one_error(paths, clock, segs[0]))[0] == 2

    write_segment_lines(path, lines[:-1])  # the last line cut off: the chain holds up to it, the count does not
    line, error = await _one_error(paths, clock, segs[0])
    assert "holds 3 lines, log.archived recorded 4" in error

    path.write_bytes(original)
    assert (await _report(paths, clock)).ok


async def test_a_whole_segment_replaced_or_rewritten_is_caught(paths: Paths, clock: FakeClock) -> None:
    segs = await seed_archived(paths, clock)
    path = _data(paths, segs[2])
    lines = segment_lines(path)

    # Other content, chained correctly from the previous segment's head: every line's hash holds.
    prev, forged = segs[2].prev, []
    for raw in lines:
        obj = orjson.loads(raw)
        body = {k: v for k, v in obj.items() if k not in ("prev", "hash")}
        body["actor"] = "someone-else"
        line, prev = seal(body, prev)
        forged.append(line)
    write_segment_lines(path, forged)
    _, error = await _one_error(paths, clock, segs[2])
    assert "its lines chain, but to another head than log.archived recorded: the file was replaced" in error

    # The same lines compressed otherwise: the chain and head hold, the recorded sha256 does not.
    write_segment_lines(path, lines, level=1)
    _, error = await _one_error(paths, clock, segs[2])
    assert "the data file's sha256 differs from the one log.archived recorded" in error


async def test_an_altered_manifest_a_swapped_segment_and_a_missing_one(cli: Cli, paths: Paths,
                                                                     clock: FakeClock) -> None:
    segs = await seed_archived(paths, clock)
    manifest = _data(paths, segs[0], ".manifest.json")
    kept = manifest.read_bytes()
    manifest.write_bytes(kept.replace(b'"cutoff"', b'"cutoff" ', 1))
    _, error = await _one_error(paths, clock, segs[0])
    assert "the manifest's sha256 differs from the one log.archived recorded" in error
    manifest.write_bytes(kept)

    # Segment 1's file in segment 2's place: its first line follows the chain's start, not segment 1's head.
    second = _data(paths, segs[1])
    kept = second.read_bytes()
    shutil.copyfile(_data(paths, segs[0]), second)
    line, error = await _one_error(paths, clock, segs[1])
    assert (line, error) == (1, f"archive segment {segs[1].name} line 1: does not follow the previous segment's head")
    second.write_bytes(kept)

    _data(paths, segs[1]).unlink()
    res = cli("audit", "verify", "--archive", check=False)
    assert res.code == EXIT_BROKEN
    assert (f"archive segment {segs[1].name} (seq {segs[1].first_seq}..{segs[1].last_seq}) is missing "
            in res.stderr)
    assert "segment" in res.stderr and segs[0].name not in res.stderr


async def test_the_audit_export_reads_audit_records_inside_a_segment(paths: Paths, clock: FakeClock,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # No archivable type is audit-relevant today; make one so, and the export must find it in the segment.
    monkeypatch.setattr(RequestReceived, "AUDIT", True)
    app = await bootstrap(paths=paths, clock=clock, actor="test:pytest")
    try:
        for i in range(6):
            await app.log.append(received_event(i), actor="gateway", trace_id=f"aud-{i:04d}")
            clock.advance(1)
        until = clock.now() - 0.5  # the log.archived event (recorded at now) is not in the window
        before = io.BytesIO()
        at = clock.now()
        await export_audit(app.log, before, pii_scrub=False, now=at, until=until)
        run = await archive(app.log, cutoff=clock.now() + 1, now=clock.now())
        assert run.segments[0].audit_records == 6
        live = await app.log._fetch("SELECT COUNT(*) FROM events WHERE type = 'request.received'")
        assert live == [(0,)]
        after = io.BytesIO()
        summary = await export_audit(app.log, after, pii_scrub=False, now=at, until=until)
    finally:
        await app.close()
    assert summary.records >= 6
    assert after.getvalue() == before.getvalue()
    assert verify_lines(io.BytesIO(after.getvalue()).readlines()).records == summary.records


def received_event(i: int) -> RequestReceived:
    return RequestReceived(trace_id=f"aud-{i:04d}", dialect="openai", route="/v1/chat/completions", model="m",
                           body_bytes=i)
