"""Archiving changes where events live, never what the log says: for random logs (control and request events,
traces, heartbeats, timestamps that mostly rise), random cutoffs, segment and block sizes, every projection's state,
`state --at N` and every read answer after `archive` exactly as before it."""

from __future__ import annotations

import asyncio
import itertools
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blazar.clock import FakeClock
from blazar.events import segment
from blazar.events.archive import LogArchived
from blazar.events.base import Event, Recorded
from blazar.events.log import EventLog
from blazar.events.log_sqlite import SqliteEventLog
from blazar.events.models import ModelAliased
from blazar.events.nodes import NodeHeartbeat, NodeStarted
from blazar.events.requests import (
    RequestAdmitted,
    RequestCompleted,
    RequestFailed,
    RequestFirstToken,
    RequestReceived,
    RequestRejected,
    RequestRouted,
)
from blazar.events.system import SnapshotTaken
from blazar.operations.archive import archive
from blazar.projections import all_projections
from blazar.projections.runner import ProjectionRunner
from blazar.queries.state import state_at
from tests.support.states import json_bytes

# Each example opens a fresh database and replays it several times: a few hundred events, a few dozen examples.
PROPERTY = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
NAMES = sorted(p.name for p in all_projections())
T0 = 1_750_000_000.0
MODELS = ("qwen", "gemma")
TRACES = 12


def _trace(i: int) -> str:
    return f"{i:032x}"


def _event(kind: str, i: int, n: int) -> tuple[Event, str | None]:
    """The `kind` event for trace (or node, or model) `i`, its payload varied by `n`; with its trace id."""
    t, model = _trace(i), MODELS[i % 2]
    if kind == "received":
        return RequestReceived(trace_id=t, dialect="openai", route="/v1/chat/completions", model=model,
                               body_bytes=n, stream=n % 2 == 0), t
    if kind == "routed":
        return RequestRouted(trace_id=t, model=model, instance_id=f"i{i % 3}", port=8000 + i, cold=n % 3 == 0), t
    if kind == "admitted":
        return RequestAdmitted(trace_id=t, model=model, instance_id=f"i{i % 3}", slots=4, busy=n % 4 + 1,
                               waited_ms=float(n % 50)), t
    if kind == "first_token":
        return RequestFirstToken(trace_id=t, model=model, ttft_ms=10.0 + n % 90), t
    if kind == "completed":
        return RequestCompleted(trace_id=t, model=model, instance_id=f"i{i % 3}", duration_ms=100.0 + n,
                                prompt_tokens=n % 500, completion_tokens=n % 200, finish_reason="stop"), t
    if kind == "failed":
        return RequestFailed(trace_id=t, model=model, status=502, reason="engine_error", detail=f"x{n}"), t
    if kind == "rejected":
        return RequestRejected(trace_id=t, model=model, status=429, reason="queue_full", detail="full"), t
    if kind == "heartbeat":
        return NodeHeartbeat(name=f"node-{i % 2}", instances=n % 3, in_flight=n % 5), None
    if kind == "node_started":
        return NodeStarted(name=f"node-{i % 2}", url=f"http://10.0.0.{i % 2}:11434", pid=n, host="h"), None
    if kind == "aliased":
        return ModelAliased(alias=f"a{i}", target=model), None
    assert kind == "snapshot", kind
    return SnapshotTaken(path=f"/s/{n}", seq_last=n, event_count=n, db_sha256="0" * 64), None


REQUEST_KINDS = ("received", "routed", "admitted", "first_token", "completed", "failed", "rejected", "heartbeat")
CONTROL_KINDS = ("node_started", "aliased", "snapshot")


@dataclass(frozen=True)
class _Item:
    kind: str
    target: int  # the trace, node or model it concerns
    jitter: float  # seconds off the steady clock: timestamps rise, with a little disorder
    batch_end: bool  # the commit ends after this event


_item = st.builds(
    _Item,
    kind=st.one_of(st.sampled_from(REQUEST_KINDS), st.sampled_from(REQUEST_KINDS), st.sampled_from(CONTROL_KINDS)),
    target=st.integers(0, TRACES - 1),
    jitter=st.one_of(st.just(0.0), st.floats(-3.0, 3.0, allow_nan=False)),
    batch_end=st.booleans(),
)


@dataclass(frozen=True)
class _Plan:
    items: list[_Item]
    step_s: float  # the steady clock's step between events
    cutoffs: list[float]  # fractions of the timeline, one archive run each (rising)
    segment_events: int
    block_events: int
    checkpoint_at: float | None  # a checkpoint after this fraction of the events, or none


_plan = st.builds(
    _Plan,
    items=st.lists(_item, min_size=40, max_size=300),
    step_s=st.sampled_from([0.5, 1.0, 7.0]),
    cutoffs=st.lists(st.floats(-0.1, 1.1, allow_nan=False), min_size=1, max_size=2).map(sorted),
    segment_events=st.integers(1, 60),
    block_events=st.integers(1, 9),
    checkpoint_at=st.one_of(st.none(), st.floats(0, 1, allow_nan=False)),
)


# -- helpers ----------------------------------------------------------------------------------------------


def _run(body: Callable[[EventLog, FakeClock], Awaitable[None]]) -> None:
    """Run `body(log, clock)` on a fresh database and archive directory (hypothesis does not reset fixtures)."""

    async def main() -> None:
        with tempfile.TemporaryDirectory(prefix="blazar-archprop-") as tmp:
            clock = FakeClock(T0)
            log = await SqliteEventLog.open(Path(tmp) / "blazar.db", clock=clock)
            try:
                await body(log, clock)
            finally:
                await log.close()

    asyncio.run(main())


async def _write(log: EventLog, live: ProjectionRunner, plan: _Plan) -> list[Recorded]:
    batch = []
    cp = None if plan.checkpoint_at is None else int(plan.checkpoint_at * len(plan.items))
    for n, item in enumerate(plan.items):
        ev, trace = _event(item.kind, item.target, n)
        actor = "gateway" if ev.ARCHIVABLE else "cli:alice"
        batch.append(log.pending(ev, actor=actor, trace_id=trace, ts=T0 + n * plan.step_s + item.jitter))
        if item.batch_end or n == len(plan.items) - 1:
            for rec in await log.commit_pending(batch):
                live.apply(rec)
            batch = []
            if cp is not None and n >= cp:
                await live.checkpoint()
                cp = None
    return [rec async for rec in log.read()]


def _states(runner: ProjectionRunner) -> dict[str, bytes]:
    out = {name: runner.state_bytes(name) for name in NAMES}
    out["views"] = json_bytes(runner.views())
    return out


async def _replayed(log: EventLog, *, upto: int | None = None, use_checkpoints: bool = False) -> ProjectionRunner:
    runner = ProjectionRunner(log, all_projections())
    await runner.start(upto=upto, use_checkpoints=use_checkpoints)
    assert all(s.halted is None for s in runner.status())
    return runner


async def _reads(log: EventLog, upto: int, records: list[Recorded]) -> dict[str, Any]:
    """What every kind of read answers over seqs 1..upto (the log.archived events come after)."""
    ts = sorted(r.ts for r in records)
    mid = ts[len(ts) // 2]

    async def seqs(**filters: Any) -> list[int]:
        return [r.seq async for r in log.read(upto=upto, **filters)]

    out: dict[str, Any] = {
        "all": [r async for r in log.read(upto=upto)],
        "small batches": [r async for r in log.read(upto=upto, batch=3)],
        "after": await seqs(after=len(records) // 3),
        "types": await seqs(types=["request.received", "node.heartbeat", "model.aliased"]),
        "since/until": await seqs(since=ts[0] + 1, until=mid),
        "limit": await seqs(limit=7),
        "node stream": await seqs(stream="node:node-0"),
        "has_trace": [await log.has_trace(_trace(i)) for i in range(TRACES + 1)],
        "trace_ids_starting": await log.trace_ids_starting("0000", limit=TRACES + 1),
        "seq_at_time": [await log.seq_at_time(t) for t in (ts[0] - 1, ts[0], mid, ts[-1], ts[-1] + 1)],
        "anchors": [await log.event_anchor(s) for s in range(1, upto + 1, max(1, upto // 9))],
    }
    for i in range(TRACES):
        out[f"trace {i}"] = await seqs(trace_id=_trace(i))
        out[f"stream {i}"] = await seqs(stream=f"trace:{_trace(i)}")
    return out


def _top(records: list[Recorded], cutoff: float) -> int:
    """The seq a range ends at: the last event (by seq) recorded before the cutoff (operations.archive.cutoff_seq)."""
    return max((r.seq for r in records if r.ts < cutoff), default=0)


# -- properties -------------------------------------------------------------------------------------------


@PROPERTY
@given(plan=_plan, data=st.data())
def test_archiving_changes_no_state_and_no_read(plan: _Plan, data: st.DataObject) -> None:
    async def body(log: EventLog, clock: FakeClock) -> None:
        live = ProjectionRunner(log, all_projections())
        await live.start()
        records = await _write(log, live, plan)
        last = len(records)
        assert live.seq == last
        before = _states(live)
        reads_before = await _reads(log, last, records)
        ns = data.draw(st.lists(st.integers(0, last), min_size=1, max_size=3), label="N")
        at_before = {n: await state_at(log, seq=n, use_checkpoints=False) for n in ns}
        span = last * plan.step_s
        cutoffs = [T0 + f * span for f in plan.cutoffs]
        clock.advance(T0 + span + 10 - clock.now())

        archived: list[LogArchived] = []
        with mock.patch.object(segment, "BLOCK_EVENTS", plan.block_events):
            for cutoff in cutoffs:
                run = await archive(log, cutoff=cutoff, now=clock.now(), segment_events=plan.segment_events)
                archived += run.segments

        # Exactly the archivable events up to the last cutoff's seq left the live log, in chained ranges.
        top = max(_top(records, c) for c in cutoffs)
        moved = {r.seq for r in records if r.seq <= top and type(r.event).ARCHIVABLE}
        live_seqs = {row[0] for row in await log._fetch("SELECT seq FROM events", ())}
        assert live_seqs == set(range(1, last + len(archived) + 1)) - moved
        assert sum(s.count for s in archived) == len(moved)
        for a, b in itertools.pairwise(archived):
            assert (b.first_seq, b.prev) == (a.last_seq + 1, a.head)
        tail = [r async for r in log.read(after=last)]
        assert [r.event for r in tail] == archived and all(r.type == "log.archived" for r in tail)

        # Every read answers as before, through the segments.
        assert await _reads(log, last, records) == reads_before
        for n, want in at_before.items():
            assert await state_at(log, seq=n, use_checkpoints=False) == want, n
            assert await state_at(log, seq=n) == want, n

        # State: folded live before archiving == replayed from scratch (and from checkpoints) up to the same seq.
        assert _states(await _replayed(log, upto=last)) == before
        assert _states(await _replayed(log, upto=last, use_checkpoints=True)) == before
        # And with the log.archived events folded too, the live runner and a full replay still agree.
        await live.catch_up()
        assert live.seq == last + len(archived)
        assert _states(live) == _states(await _replayed(log)) == _states(await _replayed(log, use_checkpoints=True))

    _run(body)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=st.lists(_item, min_size=1, max_size=60))
def test_a_cutoff_before_every_event_archives_nothing(items: list[_Item]) -> None:
    async def body(log: EventLog, clock: FakeClock) -> None:
        live = ProjectionRunner(log, all_projections())
        await live.start()
        plan = _Plan(items=items, step_s=1.0, cutoffs=[], segment_events=5, block_events=2, checkpoint_at=None)
        records = await _write(log, live, plan)
        first_ts = min(r.ts for r in records)
        run = await archive(log, cutoff=first_ts, now=first_ts + 1000, segment_events=5)
        assert run.segments == [] and run.events == 0
        assert [r async for r in log.read()] == records
        assert await log.archived_ranges() == []
        assert log.archive is not None
        assert [p.name for p in log.archive.files()] == []

    _run(body)
