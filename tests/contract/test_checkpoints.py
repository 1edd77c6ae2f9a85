"""Checkpoints: a projection state saved as of a seq and loaded again gives the same state as a full replay, with
or without a tail of later events, and whichever `EventLog` on the backend wrote or reads it."""

from __future__ import annotations

import asyncio

import orjson

from blazar.clock import FakeClock
from blazar.events.log import EventLog
from blazar.events.system import ConfigChanged, SnapshotTaken
from blazar.projections import all_projections
from blazar.projections.checkpoints import anchor_at, load_checkpoints, text_sha256
from blazar.projections.runner import ProjectionRunner
from tests.contract.workload import aliased, received
from tests.support.bounds import HANG_S

NAMES = sorted(p.name for p in all_projections())
VERSIONS = {p.name: p.version for p in all_projections()}


async def _seed(log: EventLog, clock: FakeClock, start: int, count: int) -> None:
    """`count` events that every kind of projection folds: models, requests, config, snapshots."""
    for i in range(start, start + count):
        clock.advance(0.25)
        kind = i % 4
        if kind == 0:
            await log.append(aliased(f"m{i % 3}", i), actor="cli:alice")
        elif kind == 1:
            ev = received(f"t{i}", i)
            await log.append(ev, actor="gateway", trace_id=ev.trace_id)
        elif kind == 2:
            await log.append(ConfigChanged(key="log_level", old=None, new=["info", "debug"][i % 2]), actor="cli:bob")
        else:
            await log.append(SnapshotTaken(path=f"/s/{i}", seq_last=i, event_count=i, db_sha256="a" * 64),
                             actor="daemon")


def _states(runner: ProjectionRunner) -> dict[str, bytes]:
    out = {name: runner.state_bytes(name) for name in NAMES}
    out["views"] = orjson.dumps(runner.views(), option=orjson.OPT_SORT_KEYS)
    return out


async def _replayed(log: EventLog, *, upto: int | None = None) -> ProjectionRunner:
    runner = ProjectionRunner(log, all_projections())
    await runner.start(upto=upto, use_checkpoints=False)
    assert all(s.halted is None for s in runner.status()), runner.status()
    return runner


def _origins(runner: ProjectionRunner) -> set[str]:
    return {s.origin for s in runner.status()}


async def test_a_saved_checkpoint_loads_to_the_state_of_a_full_replay(
    event_log: EventLog, second_log: EventLog, clock: FakeClock
) -> None:
    await _seed(event_log, clock, 0, 30)
    full = await _replayed(event_log)
    await full.checkpoint()

    resumed = ProjectionRunner(second_log, all_projections())  # another log on the backend reads it
    await resumed.start()
    assert _origins(resumed) == {"checkpoint at 30"}
    assert resumed.folded_at_start == 0 and resumed.seq == 30
    assert _states(resumed) == _states(full)


async def test_each_stored_checkpoint_holds_the_replayed_state_its_hash_and_its_anchor(
    event_log: EventLog, clock: FakeClock
) -> None:
    await _seed(event_log, clock, 0, 12)
    full = await _replayed(event_log)
    await full.checkpoint()
    stored = await load_checkpoints(event_log)
    assert sorted(stored) == NAMES
    anchor = await anchor_at(event_log, 12)
    assert anchor is not None and anchor.startswith(SnapshotTaken.TYPE + "@")
    for name, cp in stored.items():
        assert (cp.name, cp.version, cp.seq, cp.anchor) == (name, VERSIONS[name], 12, anchor)
        assert cp.state_text.encode() == full.state_bytes(name), name
        assert cp.sha256 == text_sha256(cp.state_text)


async def test_checkpoint_plus_tail_equals_a_full_replay(
    event_log: EventLog, second_log: EventLog, clock: FakeClock
) -> None:
    await _seed(event_log, clock, 0, 20)
    await (await _replayed(event_log)).checkpoint()
    await _seed(second_log, clock, 20, 15)  # the tail, appended by another log on the backend

    resumed = ProjectionRunner(event_log, all_projections())
    await resumed.start()
    assert _origins(resumed) == {"checkpoint at 20"}
    assert resumed.folded_at_start == 15 and resumed.seq == 35
    assert _states(resumed) == _states(await _replayed(event_log))


async def test_state_as_of_a_seq_before_the_checkpoint_is_folded_from_the_start(
    event_log: EventLog, clock: FakeClock
) -> None:
    await _seed(event_log, clock, 0, 16)
    await (await _replayed(event_log)).checkpoint()
    early = ProjectionRunner(event_log, all_projections())
    await early.start(upto=7)
    assert _origins(early) == {"folded from the start (checkpoint at 16 is past 7)"}
    assert early.seq == 7
    assert _states(early) == _states(await _replayed(event_log, upto=7))


async def test_a_live_runner_checkpoints_what_it_followed_and_a_restart_resumes_there(
    event_log: EventLog, second_log: EventLog, clock: FakeClock
) -> None:
    await _seed(event_log, clock, 0, 8)
    live = ProjectionRunner(event_log, all_projections(), checkpoint_every=5)
    await live.start()
    live.follow(poll_interval=0.02)
    try:
        await _seed(second_log, clock, 8, 12)  # seen by polling: another log's appends never wake this one
        async with asyncio.timeout(HANG_S):
            await live.wait_for(20)
    finally:
        await live.stop(checkpoint=True)
    assert {cp.seq for cp in (await load_checkpoints(event_log)).values()} == {20}

    resumed = ProjectionRunner(event_log, all_projections())
    await resumed.start()
    assert _origins(resumed) == {"checkpoint at 20"} and resumed.folded_at_start == 0
    assert _states(resumed) == _states(live) == _states(await _replayed(event_log))
