"""`blazar doctor` on a home whose request history was archived: the live log's and the archive's share of their
disks (`log_disk_share`), a segment missing or altered, leftover segment files; and the `log.seq` arithmetic that
tells the gaps archived ranges explain from holes."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from blazar.bootstrap import bootstrap
from blazar.clock import FakeClock
from blazar.events.archive import LogArchived
from blazar.events.requests import RequestCompleted, RequestReceived
from blazar.operations.archive_schedule import archive_now
from blazar.operations.doctor.seqcheck import SeqFacts, first_unexplained, verdict, whole
from tests.support.blazar_home import configure, home_paths
from tests.support.doctor import run_checks

DAY_S = 86400.0


def archive_old_history(home: Path, *, traces: int = 4) -> LogArchived:
    """`traces` request traces recorded 40 days ago, archived with a 30-day retention as `blazar log archive` does
    (the projections checkpointed after); returns the segment."""

    async def go() -> LogArchived:
        clock = FakeClock(time.time() - 40 * DAY_S)
        app = await bootstrap(paths=home_paths(home), env={}, actor="test:pytest", clock=clock)
        try:
            for i in range(traces):
                tid = f"old-{i}"
                await app.log.append(RequestReceived(trace_id=tid, dialect="openai", route="/v1/chat/completions",
                                                     model="m"), actor="gateway", trace_id=tid)
                await app.log.append(RequestCompleted(trace_id=tid, model="m", duration_ms=3.0), actor="gateway",
                                     trace_id=tid)
            clock.advance(40 * DAY_S)
            run = await archive_now(app, cutoff=clock.now() - 30 * DAY_S, actor="test:pytest")
            (seg,) = run.segments
            return seg
        finally:
            await app.close()

    return asyncio.run(go())


def test_an_archived_home_is_healthy(home: Path) -> None:
    seg = archive_old_history(home)
    found = run_checks(home)
    for name in ("log.seq", "log.segments", "log.archive_orphans", "log.disk_share"):
        assert found[name].status == "ok", found[name]
    assert "archived in 1 segment(s)" in found["log.seq"].observation
    assert f"1 segment(s) of {seg.count} archived events" in found["log.segments"].observation
    assert "the live log" in found["log.disk_share"].observation and "the archive" in \
        found["log.disk_share"].observation


def test_a_tiny_log_disk_share_warns_for_the_live_log_and_the_archive(home: Path) -> None:
    archive_old_history(home)
    configure(home, "log_disk_share", "0.000000001")
    check = run_checks(home)["log.disk_share"]
    assert check.status == "warn", check
    assert "the live log" in check.observation and "the archive" in check.observation
    assert "log_disk_share is 0%" in check.observation and "request_retention" in (check.fix or "")


def test_a_missing_segment_warns_and_names_it(home: Path) -> None:
    seg = archive_old_history(home)
    data = home_paths(home).archive / f"{seg.name}.jsonl.gz"
    data.unlink()
    for quick in (False, True):
        check = run_checks(home, quick=quick)["log.segments"]
        assert check.status == "warn", check
        assert seg.name in check.observation and "missing" in check.observation
        assert f"seq {seg.first_seq}..{seg.last_seq}" in check.observation


def test_an_altered_segment_warns_by_sha256_and_a_truncated_one_even_with_quick(home: Path) -> None:
    seg = archive_old_history(home)
    data = home_paths(home).archive / f"{seg.name}.jsonl.gz"
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    check = run_checks(home)["log.segments"]
    assert check.status == "warn" and seg.name in check.observation and "sha256" in check.observation
    data.write_bytes(bytes(raw[:-10]))
    check = run_checks(home, quick=True)["log.segments"]
    assert check.status == "warn" and "altered" in check.observation


def test_leftover_segment_files_warn(home: Path) -> None:
    seg = archive_old_history(home)
    root = home_paths(home).archive
    (root / "seg-000002-99-120.jsonl.gz").write_bytes(b"partial")
    (root / ".seg-000002-4242.jsonl.gz.tmp").write_bytes(b"partial")
    check = run_checks(home)["log.archive_orphans"]
    assert check.status == "warn", check
    assert "2 file(s)" in check.observation and "seg-000002-99-120.jsonl.gz" in check.observation
    assert seg.name not in check.observation and "next archive run removes them" in (check.fix or "")


# -- the seq arithmetic ------------------------------------------------------------------------------------------


def test_adjacent_ranges_explain_a_gap_that_spans_both() -> None:
    # Ranges 1..10 and 11..20, 7 archived from each; live: 2, 5, 9, 12, 15, 18, 21 (the last); count 7.
    facts = SeqFacts(count=7, last=21, ranges=[(1, 10, 7), (11, 20, 7)])
    assert facts.union() == [(1, 20)]
    assert whole(facts, live_in_union=6)
    assert first_unexplained(facts, [(10, 11)]) is None  # the gap 10..11 spans the two ranges
    assert verdict(facts, 6, None).status == "ok"


def test_a_hole_past_the_ranges_is_named() -> None:
    facts = SeqFacts(count=5, last=30, ranges=[(1, 20, 15)])
    # Live: five of 1..20 and 21..30 should all be live, but 25..30 are missing -> not whole.
    assert not whole(facts, live_in_union=5)
    assert first_unexplained(facts, [(18, 30)]) == 21
    check = verdict(facts, 5, [(18, 30)])
    assert check.status == "fail" and "seq 21 is missing" in check.observation


@pytest.mark.parametrize(("count", "last", "ok"), [(0, 0, True), (3, 3, True), (2, 3, False)])
def test_a_log_never_archived(count: int, last: int, ok: bool) -> None:
    facts = SeqFacts(count=count, last=last, ranges=[])
    assert whole(facts, 0) is ok
