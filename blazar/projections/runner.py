"""Runs projections: load checkpoints, catch up on the tail, apply live events, write checkpoints.

The daemon and the CLI use this same code. `start(upto=N)` gives the state as of seq N (time travel): a
checkpoint is used only when it lies at or before N, else the projection folds from the beginning.
A projection whose `apply` raises halts at that seq (its state stays at the seq before) and says so in
`status()`; it never skips an event silently. The others go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, overload

from pydantic import ValidationError

from blazar.errors import BlazarError, DiskFull, LogUnreachable, ProjectionError
from blazar.events.base import Event, NodeLocal, Recorded
from blazar.events.log import EventLog, LastMove
from blazar.events.types import decode
from blazar.projections.audit import AuditState
from blazar.projections.base import Projection
from blazar.projections.batches import BatchesState
from blazar.projections.calibration import CalibrationState
from blazar.projections.catalog import CatalogState
from blazar.projections.checkpoints import (
    StoredCheckpoint,
    anchor_at,
    anchor_of,
    load_checkpoints,
    save_checkpoints,
    text_sha256,
)
from blazar.projections.codec import StateCodec, codec_for
from blazar.projections.config import ConfigState
from blazar.projections.engines import EnginesState
from blazar.projections.keys import KeysState
from blazar.projections.metrics import MetricsState
from blazar.projections.nodes import NodesState
from blazar.projections.prefix import PrefixState
from blazar.projections.profiles import ProfilesState
from blazar.projections.realtime import RealtimeState
from blazar.projections.remotes import RemotesState
from blazar.projections.residency import ResidencyState
from blazar.projections.sessions import SessionsState
from blazar.projections.stats import StatsState
from blazar.projections.traces import TracesState
from blazar.projections.workers import WorkersState

log = logging.getLogger(__name__)
# How long the live runner waits before reading again when the log's database cannot be reached.
UNREACHABLE_RETRY_S = 1.0


@dataclass(slots=True)
class _Slot:
    projection: Projection[Any]
    state: Any
    seq: int = 0
    origin: str = "empty"
    halted: ProjectionError | None = None
    applied_since_checkpoint: int = 0
    # The anchor is the restored checkpoint's until an event is folded, then that of the last event folded,
    # kept as (type, ts) and formatted only when a checkpoint is written: formatting it for every event and
    # projection was a quarter of replay time (bench/log.py).
    restored_anchor: str = ""
    last_type: str | None = None
    last_ts: float = 0.0
    codec: StateCodec = field(init=False)

    def __post_init__(self) -> None:
        self.codec = codec_for(self.projection.state_type)

    @property
    def anchor(self) -> str:
        return self.restored_anchor if self.last_type is None else anchor_of(self.last_type, self.last_ts)


@dataclass(frozen=True)
class ProjectionStatus:
    name: str
    version: int
    seq: int
    origin: str
    halted: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "seq": self.seq, "origin": self.origin,
                "halted": self.halted}


def _elsewhere(event: Event, node: str) -> bool:
    """A node-local event that happened on another node."""
    return isinstance(event, NodeLocal) and event.node not in ("", node)


class ProjectionRunner:
    def __init__(self, event_log: EventLog, projections: Iterable[Projection[Any]], *, checkpoint_every: int = 10_000,
                 node: str = ""):
        self.log = event_log
        self.checkpoint_every = checkpoint_every
        self.node = node  # where several gateways share the log: node-local projections fold this node's alone
        self._slots = {p.name: _Slot(p, p.initial()) for p in projections}
        self._task: asyncio.Task[None] | None = None
        self._changed = asyncio.Condition()
        self._nudge = asyncio.Event()  # this process committed: fold (or catch up) now
        self._unsubscribe: Callable[[], None] = lambda: None
        self._own_signature: tuple[tuple[int, int], ...] = ()
        self.folded_at_start = 0

    # -- queries -------------------------------------------------------------------------------------------

    # One overload per projection: `state("catalog")` is a CatalogState, which only blazar.projections.catalog's
    # readers open (tests/unit/projections/test_typed_state.py checks each overload names its projection's own
    # state_type).
    @overload
    def state(self, name: Literal["audit"]) -> AuditState: ...
    @overload
    def state(self, name: Literal["batches"]) -> BatchesState: ...
    @overload
    def state(self, name: Literal["calibration"]) -> CalibrationState: ...
    @overload
    def state(self, name: Literal["catalog"]) -> CatalogState: ...
    @overload
    def state(self, name: Literal["config"]) -> ConfigState: ...
    @overload
    def state(self, name: Literal["engines"]) -> EnginesState: ...
    @overload
    def state(self, name: Literal["keys"]) -> KeysState: ...
    @overload
    def state(self, name: Literal["metrics"]) -> MetricsState: ...
    @overload
    def state(self, name: Literal["nodes"]) -> NodesState: ...
    @overload
    def state(self, name: Literal["prefix"]) -> PrefixState: ...
    @overload
    def state(self, name: Literal["profiles"]) -> ProfilesState: ...
    @overload
    def state(self, name: Literal["realtime"]) -> RealtimeState: ...
    @overload
    def state(self, name: Literal["remotes"]) -> RemotesState: ...
    @overload
    def state(self, name: Literal["residency"]) -> ResidencyState: ...
    @overload
    def state(self, name: Literal["sessions"]) -> SessionsState: ...
    @overload
    def state(self, name: Literal["stats"]) -> StatsState: ...
    @overload
    def state(self, name: Literal["traces"]) -> TracesState: ...
    @overload
    def state(self, name: Literal["workers"]) -> WorkersState: ...

    def state(self, name: str) -> Any:
        """Projection `name`'s state now, typed: its fields, and its module's readers (`stored(state, "gemma")`)."""
        return self._slots[name].state

    def state_bytes(self, name: str) -> bytes:
        """Projection `name`'s state as a checkpoint would hold it: for replay checks."""
        slot = self._slots[name]
        return slot.codec.dump(slot.state)

    def views(self) -> dict[str, Any]:
        return {name: s.projection.view(s.state) for name, s in sorted(self._slots.items())}

    @property
    def seq(self) -> int:
        """The seq every running projection has reached."""
        live = [s.seq for s in self._slots.values() if s.halted is None]
        return min(live) if live else 0

    def status(self) -> list[ProjectionStatus]:
        return [
            ProjectionStatus(n, s.projection.version, s.seq, s.origin, s.halted.message if s.halted else None)
            for n, s in sorted(self._slots.items())
        ]

    # -- start-up ------------------------------------------------------------------------------------------

    async def start(self, *, upto: int | None = None, use_checkpoints: bool = True) -> None:
        """Restore from checkpoints where valid, then fold the tail (up to `upto`, inclusive)."""
        if use_checkpoints:
            stored = await load_checkpoints(self.log)
            for slot in self._slots.values():
                cp = stored.get(self._checkpoint_name(slot))
                slot.origin = await self._restore(slot, cp, upto) if cp else "rebuilt: no checkpoint"
        else:
            for slot in self._slots.values():
                slot.origin = "rebuilt: checkpoints not used"
        self.folded_at_start = await self.catch_up(upto=upto)

    async def _restore(self, slot: _Slot, cp: StoredCheckpoint, upto: int | None) -> str:
        p = slot.projection
        if cp.version != p.version:
            return f"rebuilt: version {cp.version} -> {p.version}"
        if upto is not None and cp.seq > upto:
            return f"folded from the start (checkpoint at {cp.seq} is past {upto})"
        if text_sha256(cp.state_text) != cp.sha256:
            return "rebuilt: checkpoint corrupt (sha256 mismatch)"
        try:
            state = slot.codec.load(cp.state_text)
        except ValidationError:
            return "rebuilt: checkpoint corrupt (not this projection's state)"
        if await anchor_at(self.log, cp.seq) != cp.anchor:
            return "rebuilt: checkpoint belongs to another history"
        slot.state, slot.seq, slot.restored_anchor, slot.last_type = state, cp.seq, cp.anchor, None
        return f"checkpoint at {cp.seq}"

    async def catch_up(self, *, upto: int | None = None) -> int:
        """Apply every event past each projection's seq. Returns how many events were read."""
        live = [s for s in self._slots.values() if s.halted is None]
        if not live:
            return 0
        start = min(s.seq for s in live)
        n = 0
        async for rows in self.log.read_rows(after=start, upto=upto):
            for row in rows:
                self._apply_row(row)
            n += len(rows)
        return n

    def _apply_row(self, row: tuple[Any, ...], rec: Recorded | None = None) -> None:
        """Fold one stored row into every projection that has not seen it; decode at most once."""
        seq, ts, type_name, v, stream, trace_id, actor, cause, data = row
        for slot in self._slots.values():
            if slot.halted is not None or slot.seq >= seq:
                continue
            p = slot.projection
            if p.wants(type_name):
                try:
                    if rec is None:
                        rec = Recorded(seq, ts, type_name, v, stream, trace_id, actor, cause,
                                       decode(seq, type_name, v, data))
                    if not (p.node_local and self.node and _elsewhere(rec.event, self.node)):
                        slot.state = p.apply(slot.state, rec)
                except Exception as exc:  # a projection halts on any failure, by design
                    detail = exc.message if isinstance(exc, BlazarError) else f"{type(exc).__name__}: {exc}"
                    slot.halted = ProjectionError(p.name, seq, detail)
                    log.error("%s", slot.halted.message)
                    continue
            slot.seq = seq
            slot.last_type, slot.last_ts = type_name, ts
            slot.applied_since_checkpoint += 1

    def apply(self, rec: Recorded) -> None:
        """Apply one event that was just appended (live path); events already folded are skipped."""
        row = (rec.seq, rec.ts, rec.type, rec.v, rec.stream, rec.trace_id, rec.actor, rec.cause, None)
        self._apply_row(row, rec)

    # -- checkpoints ---------------------------------------------------------------------------------------

    async def checkpoint(self) -> None:
        items = [
            (self._checkpoint_name(s), s.projection.version, s.seq, s.anchor, s.codec.dump(s.state))
            for s in self._slots.values()
            if s.seq > 0
        ]
        if items:
            await save_checkpoints(self.log, items)
        for s in self._slots.values():
            s.applied_since_checkpoint = 0

    def _checkpoint_name(self, slot: _Slot) -> str:
        p = slot.projection
        return f"{p.name}@{self.node}" if p.node_local and self.node else p.name

    def _checkpoint_due(self) -> bool:
        return any(s.applied_since_checkpoint >= self.checkpoint_every for s in self._slots.values())

    # -- live ----------------------------------------------------------------------------------------------

    def follow(self, *, poll_interval: float = 0.25) -> None:
        """Start applying new events as they land: this process's commits as they are made (handed over by the log,
        never read back), other processes' when the log's change signature moved (checked every `poll_interval`:
        SQLite's files stat-ed, PostgreSQL's notifications counted) and `changed_elsewhere` confirms it (SQLite's
        data_version): an idle daemon runs no query."""
        if self._task is None:
            self._unsubscribe = self.log.subscribe(self._on_commit)
            self._task = asyncio.get_running_loop().create_task(self._follow(poll_interval), name="projections")

    def _on_commit(self, recorded: list[Recorded]) -> None:
        """A batch this process just committed: folded at once when nothing unseen comes before it, else the
        follow loop catches up from the log (another process appended in between)."""
        if recorded and recorded[0].seq == self.seq + 1:
            for rec in recorded:
                self.apply(rec)
        self._own_signature = self.log.change_signature()  # the signature as this commit left it
        self._nudge.set()

    async def _follow(self, poll_interval: float) -> None:
        loop = asyncio.get_running_loop()
        seen = self.log.change_signature()
        last_move = LastMove(loop.time())  # the start is such a moment too
        await self.log.changed_elsewhere()  # the baseline
        await self.catch_up()
        while True:
            async with self._changed:
                self._changed.notify_all()
            if self._checkpoint_due():
                try:
                    await self.checkpoint()
                except (LogUnreachable, DiskFull) as e:  # derived data: made at the next chance
                    log.warning("checkpoint not written (%s)", e)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(poll_interval):  # not wait_for: no task made per poll
                    await self._nudge.wait()
            self._nudge.clear()
            now = self.log.change_signature()  # before the read: a write during it shows as a change next time
            ask = False
            if now != seen:  # a move that is not this process's own last commit is another process's
                ask = now != self._own_signature
                last_move.moved(loop.time())
            elif last_move.recheck_due(loop.time()):
                ask = True
            try:
                if (ask and await self.log.changed_elsewhere()) or self.seq < self.log.last_appended:
                    await self.catch_up()
            except LogUnreachable as e:  # the log's database is away: this process's own commits still fold
                log.warning("projections cannot read the log (%s); trying again", e)
                await asyncio.sleep(UNREACHABLE_RETRY_S)
                continue
            seen = now

    async def wait_for(self, seq: int) -> None:
        """Wait until the live runner has applied `seq`; callers bound it with `asyncio.timeout`."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.seq >= seq)

    async def stop(self, *, checkpoint: bool = True) -> None:
        if self._task is not None:
            self._unsubscribe()
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if checkpoint:
            try:
                await self.checkpoint()
            except (LogUnreachable, DiskFull) as e:  # derived data: the next start folds from the last one instead
                log.warning("checkpoint not written at stop (%s)", e)

