"""Snapshot and restore: a restored home holds the snapshot's events, byte for byte in the envelope, then its own
`snapshot.restored`, and every projection folds them to the state the original had at the snapshot's seq."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from blazar.bootstrap import bootstrap
from blazar.clock import FakeClock
from blazar.events.log import EventLog
from blazar.events.system import SnapshotRestored, SnapshotTaken
from blazar.operations.config import set_value
from blazar.operations.snapshot import Taken, restore_snapshot, take_snapshot
from blazar.operations.snapshot_verify import verify_snapshot
from blazar.projections import all_projections
from blazar.projections.runner import ProjectionRunner
from tests.contract.backends import Backend, open_log
from tests.contract.workload import aliased, received

ACTOR = "test:contract"


async def _events(log: EventLog, **filters: Any) -> list[dict[str, Any]]:
    return [rec.to_json() async for rec in log.read(**filters)]


async def _views(log: EventLog, *, upto: int | None = None, use_checkpoints: bool = False) -> bytes:
    runner = ProjectionRunner(log, all_projections())
    await runner.start(upto=upto, use_checkpoints=use_checkpoints)
    assert all(s.halted is None for s in runner.status()), runner.status()
    return orjson.dumps(runner.views(), option=orjson.OPT_SORT_KEYS)


async def _seed_and_snapshot(backend: Backend, clock: FakeClock, dest: Path) -> tuple[Taken, list, bytes]:
    """Config changes, model events and group-committed request events, a snapshot, then more events after it.
    Returns (the snapshot, the live log's events up to its seq, the live projections' views at that seq)."""
    app = await bootstrap(paths=backend.paths, clock=clock, actor=ACTOR)
    try:
        await set_value(app, "telemetry.log_level", "debug")
        await set_value(app, "log.checkpoint_every", "500")
        await app.record([aliased("qwen", i) for i in range(3)])
        writer = app.request_writer()
        for i in range(20):
            ev = received("t", i)
            writer.submit(ev, actor="gateway", trace_id=ev.trace_id)
        await writer.flush()
        clock.advance(5)
        taken = await take_snapshot(app, dest)
        # After the snapshot: none of this may appear in a home restored from it.
        clock.advance(5)
        await set_value(app, "telemetry.log_level", "error")
        await app.record(aliased("later", 99))
    finally:
        await app.close()
    seq = taken.manifest.seq_last
    log = await backend.open()
    try:
        return taken, await _events(log, upto=seq), await _views(log, upto=seq)
    finally:
        await log.close()


async def test_a_snapshot_describes_the_log_it_copied(backend: Backend, clock: FakeClock, tmp_path: Path) -> None:
    taken, before, _ = await _seed_and_snapshot(backend, clock, tmp_path / "snap")
    assert taken.path == tmp_path / "snap"
    manifest = verify_snapshot(taken.path).manifest
    assert manifest == taken.manifest
    assert (manifest.seq_first, manifest.seq_last, manifest.event_count) == (1, len(before), len(before))
    assert sum(manifest.counts_by_type.values()) == len(before)
    log = await backend.open()
    try:
        (rec,) = [r async for r in log.read(types=[SnapshotTaken.TYPE])]
    finally:
        await log.close()
    assert rec.seq == taken.seq == manifest.seq_last + 1  # recorded in the live log, after what it copied
    assert isinstance(rec.event, SnapshotTaken)
    assert rec.event.seq_last == manifest.seq_last and rec.event.db_sha256 == manifest.db_sha256


async def test_a_home_restored_from_a_snapshot_has_its_events_and_its_projection_state(
    backend: Backend, new_backend: Callable[[str], Backend], clock: FakeClock, tmp_path: Path
) -> None:
    taken, before, views = await _seed_and_snapshot(backend, clock, tmp_path / "snap")
    seq = taken.manifest.seq_last
    target = new_backend("restored")

    restored = await restore_snapshot(target.paths, taken.path, actor=ACTOR, clock=clock, env=os.environ)
    assert restored.warnings == [] and restored.config_rewritten
    assert restored.recorded.seq == seq + 1

    log = await target.open()
    try:
        assert await _events(log, upto=seq) == before
        after = [r async for r in log.read(after=seq)]
        assert [(r.seq, r.type, r.actor) for r in after] == [(seq + 1, SnapshotRestored.TYPE, ACTOR)]
        ev = after[0].event
        assert isinstance(ev, SnapshotRestored) and (ev.seq_last, ev.previous_seq_last) == (seq, 0)
        assert await _views(log, upto=seq) == views
        # The restore left checkpoints (rebuilt from the events): loading them gives the full replay's state.
        assert await _views(log, use_checkpoints=True) == await _views(log)
    finally:
        await log.close()

    # Opened as a home, it reads as the snapshot's: config agrees with the log, so nothing new is recorded.
    app = await bootstrap(paths=target.paths, clock=clock, actor=ACTOR)
    try:
        assert await app.log.last_seq() == seq + 1
        assert (app.settings().telemetry.log_level, app.settings().log.checkpoint_every) == ("debug", 500)
        # The restore checkpointed the snapshot's events before recording snapshot.restored: one event to fold.
        assert {r.origin for r in app.runner.status()} == {f"checkpoint at {seq}"} and app.folded_at_start == 1
    finally:
        await app.close()


async def test_restoring_over_a_home_rolls_it_back_and_keeps_the_replaced_log(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    taken, before, views = await _seed_and_snapshot(backend, clock, tmp_path / "snap")
    seq = taken.manifest.seq_last
    log = await backend.open()
    try:
        replaced = await _events(log)
    finally:
        await log.close()
    assert len(replaced) > seq + 1

    restored = await restore_snapshot(backend.paths, taken.path, actor=ACTOR, clock=clock, env=os.environ)
    ev = restored.recorded.event
    assert isinstance(ev, SnapshotRestored)
    assert ev.previous_seq_last == len(replaced) and ev.previous_kept_at is not None

    log = await backend.open()
    try:
        assert await _events(log, upto=seq) == before
        assert [r.type async for r in log.read(after=seq)] == [SnapshotRestored.TYPE]
        assert await _views(log, upto=seq) == views
    finally:
        await log.close()
    kept = await open_log(ev.previous_kept_at)
    try:
        assert await _events(kept) == replaced
    finally:
        await kept.close()
