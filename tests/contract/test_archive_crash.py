"""An archive run killed at any moment (SIGKILL: no cleanup) leaves the log in the state before a segment or the
state after it, never between: every event is live or in a verified segment the log names, exactly once, and
every read answers as before. The next run completes and removes the files the dead one left behind."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys

import orjson
import pytest

from blazar.durable import file_sha256
from blazar.events.archive import LogArchived
from blazar.events.base import Event, Recorded
from blazar.events.log import EventLog
from blazar.events.nodes import NodeHeartbeat
from blazar.events.requests import RequestCompleted, RequestReceived, RequestRouted
from blazar.events.segment import walk_lines
from blazar.operations.archive import archive
from tests.contract.backends import Backend
from tests.contract.workload import REPO, aliased

T0 = 1_760_000_000.0
CHILD_TIMEOUT_S = 60.0
SUFFIXES = (".jsonl.gz", ".index", ".manifest.json")


def _trace(i: int) -> str:
    return f"{i:032x}"


async def _seed(log: EventLog, requests: int) -> list[Recorded]:
    """`requests` requests one second apart (received, routed, completed), a heartbeat every 5 s and a control
    event every 10 s."""
    out: list[Recorded] = []
    for i in range(requests):
        t, ts = _trace(i), T0 + i
        batch: list[tuple[Event, str | None]] = [
            (RequestReceived(trace_id=t, dialect="openai", route="/v1/chat/completions", model="qwen",
                             body_bytes=i), t),
            (RequestRouted(trace_id=t, model="qwen", instance_id="i1", port=8001, cold=i == 0), t),
            (RequestCompleted(trace_id=t, model="qwen", duration_ms=50.0 + i, completion_tokens=i % 100), t),
        ]
        if i % 5 == 0:
            batch.append((NodeHeartbeat(name="n1", in_flight=i % 3), None))
        if i % 10 == 0:
            batch.append((aliased("qwen", i), None))
        pending = [log.pending(ev, actor="gateway" if ev.ARCHIVABLE else "cli:alice", trace_id=tr, ts=ts)
                   for ev, tr in batch]
        out += await log.commit_pending(pending)
    return out


async def _run_child(backend: Backend, cutoff: float, segment_events: int, *args: str,
                     kill_after: float | None = None) -> int:
    """The child's exit status (negative: the signal that ended it)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.contract.archive_child", backend.location, str(backend.paths.archive),
        repr(cutoff), str(segment_events), *args, cwd=backend.paths.data_dir, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), CHILD_TIMEOUT_S)
        assert line == b"ready\n", line
        if kill_after is not None:
            await asyncio.sleep(kill_after)
            if proc.returncode is None:
                proc.send_signal(signal.SIGKILL)
        _, err = await asyncio.wait_for(proc.communicate(), CHILD_TIMEOUT_S)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode in (0, -signal.SIGKILL), err.decode()
    return proc.returncode


async def _check_consistent(log: EventLog, records: list[Recorded]) -> int:
    """The invariant after any crash: the ranges form a chain from seq 1; each range's archivable rows are gone from
    the live log and every other row is live; one log.archived per range; its segment verifies against the log;
    every read answers as before. Returns how many ranges the log names."""
    n = len(records)
    ranges = await log.archived_ranges()
    tail = [r async for r in log.read(after=n)]
    marks = [r.event for r in tail]
    assert all(isinstance(e, LogArchived) for e in marks) and len(marks) == len(ranges)
    covered, prev = 0, None
    for rng, mark in zip(ranges, marks, strict=True):
        assert isinstance(mark, LogArchived)
        assert (rng.first_seq, rng.name, rng.sha256, rng.count) == (covered + 1, mark.name, mark.sha256, mark.count)
        assert prev is None or mark.prev == prev
        # `audit verify`-style: the file the log names is the file it hashed, and its chain holds.
        assert log.archive is not None
        data = log.archive.path(rng.name, ".jsonl.gz")
        assert file_sha256(data) == rng.sha256
        check = walk_lines(data, rng.name, prev=mark.prev, first_seq=rng.first_seq, last_seq=rng.last_seq)
        assert (check.count, check.head) == (rng.count, mark.head)
        covered, prev = rng.last_seq, mark.head
    moved = {r.seq for r in records if r.seq <= covered and type(r.event).ARCHIVABLE}
    live = {row[0] for row in await log._fetch("SELECT seq FROM events", ())}
    assert live == (set(range(1, n + 1)) - moved) | {r.seq for r in tail}
    assert [r async for r in log.read(upto=n)] == records
    for i in (0, len(records) // 9, len(records) // 7):
        want = [r.seq for r in records if r.trace_id == _trace(i)]
        assert [r.seq async for r in log.read(trace_id=_trace(i))] == want
    return len(ranges)


def _files(log: EventLog) -> set[str]:
    assert log.archive is not None
    root = log.archive.root
    derived = {".archive.lock", "traces.index"}  # the run lock; the index across segments (derived)
    return {p.name for p in root.iterdir() if p.name not in derived} if root.is_dir() else set()


async def _finish(backend: Backend, records: list[Recorded], cutoff: float, segment_events: int) -> int:
    """A following run completes: every archivable event before the cutoff is archived and nothing else is left in
    the archive directory but the files of the ranges the log names. Returns the orphans it removed."""
    log = await backend.open()
    try:
        run = await archive(log, cutoff=cutoff, now=cutoff + 2, segment_events=segment_events)
        await _check_consistent(log, records)
        ranges = await log.archived_ranges()
        top = max(r.seq for r in records if r.ts < cutoff)
        assert ranges and ranges[-1].last_seq == top
        assert _files(log) == {f"{r.name}{s}" for r in ranges for s in SUFFIXES}
        return run.orphans_removed
    finally:
        await log.close()


@pytest.mark.parametrize(("step", "nth"), [(s, 1) for s in ("select", "write", "verify", "commit", "committed")]
                         + [("verify", 2), ("committed", 2)])
async def test_a_run_killed_at_each_step_leaves_the_old_or_the_new_state(backend: Backend, step: str,
                                                                         nth: int) -> None:
    log = await backend.open()
    try:
        records = await _seed(log, 60)
    finally:
        await log.close()
    cutoff, segment_events = T0 + 45, 50  # 46 requests of 3 events and 10 heartbeats: 3 segments

    code = await _run_child(backend, cutoff, segment_events, "--kill-at", step, "--nth", str(nth),
                            "--block-events", "7")
    assert code == -signal.SIGKILL

    log = await backend.open()
    try:
        # Segments before the one it died on are committed; that one is committed only if it died after commit.
        assert await _check_consistent(log, records) == nth - (0 if step == "committed" else 1)
        left = _files(log)
    finally:
        await log.close()
    if step == "write":  # the data file was written under its temporary name
        assert any(name.endswith(".tmp") for name in left), left
    removed = await _finish(backend, records, cutoff, segment_events)
    assert (removed > 0) == (step in ("write", "verify", "commit")), (step, removed, left)


async def test_runs_killed_at_random_moments_never_leave_a_gap(backend: Backend) -> None:
    log = await backend.open()
    try:
        records = await _seed(log, 900)
    finally:
        await log.close()
    segment_events = 40
    rng = random.Random(29)
    # Each round has new work (a later cutoff), so the kills land inside runs rather than after them.
    for cutoff in (T0 + 150, T0 + 300, T0 + 450, T0 + 600, T0 + 750):
        await _run_child(backend, cutoff, segment_events, "--block-events", "16",
                         kill_after=rng.uniform(0.02, 0.3))
        log = await backend.open()
        try:
            await _check_consistent(log, records)
        finally:
            await log.close()
    await _finish(backend, records, cutoff, segment_events)


async def test_an_uninterrupted_child_run_reports_what_it_archived(backend: Backend) -> None:
    """The child itself, run to the end: what the crash tests rely on when they do not kill it."""
    log = await backend.open()
    try:
        records = await _seed(log, 20)
    finally:
        await log.close()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.contract.archive_child", backend.location, str(backend.paths.archive),
        repr(T0 + 10), "1000", cwd=backend.paths.data_dir, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), CHILD_TIMEOUT_S)
    assert proc.returncode == 0, err.decode()
    run = orjson.loads(out.splitlines()[-1])
    assert run["events"] == sum(1 for r in records if r.ts < T0 + 10 and type(r.event).ARCHIVABLE)
    log = await backend.open()
    try:
        assert await _check_consistent(log, records) == 1
        assert len(_files(log)) == len(SUFFIXES)
    finally:
        await log.close()
