"""Replay is the test of the design: for random logs, live state == checkpoint + tail == full rebuild,
`state --at N` == the fold of the first N events, and a damaged checkpoint is noticed and rebuilt."""

from __future__ import annotations

import asyncio
import hashlib
import tempfile
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from blazar import config
from blazar.clock import FakeClock
from blazar.events import Event, Recorded, register
from blazar.events.log import EventLog
from blazar.events.log_sqlite import SqliteEventLog
from blazar.events.lora import LoraAdded, LoraMetadata, LoraRemoved
from blazar.events.model_settings import ModelConfigured, ModelSettings, ModelVariantCreated
from blazar.events.models import (
    InstanceMemoryMeasured,
    ModelAliased,
    ModelAliasRemoved,
    ModelPullCompleted,
    ModelPullFailed,
    ModelPullStarted,
    ModelRemoved,
    ModelTemplateProbed,
    ShardFile,
    TemplateTrial,
)
from blazar.events.nodes import NodeDown, NodeHeartbeat, NodeStarted, NodeStopped
from blazar.events.projectors import EncoderShape, ModelProjectorRemoved, ModelProjectorSet, ProjectorMetadata
from blazar.events.realtime import RealtimeProfileRemoved, RealtimeProfileSet
from blazar.events.remotes import RemoteAdded, RemoteCircuitClosed, RemoteCircuitOpened, RemoteRemoved
from blazar.events.requests import RequestCacheHit, RequestPlaced, RequestPrefixCompared
from blazar.events.sessions import KvIdentity, SessionDropped, SessionRemoved, SessionRestored, SessionSaved
from blazar.events.system import ConfigChanged, SnapshotTaken
from blazar.events.tuning import BenchRecorded, Machine, Posture, ProfileAdopted, ProfileReset
from blazar.projections import all_projections, fold
from blazar.projections.checkpoints import drop_checkpoints, load_checkpoints
from blazar.projections.runner import ProjectionRunner
from blazar.queries.state import state_at
from tests.support.catalog import imported
from tests.support.replay_events import engine_event, instance_event, key_event, worker_event
from tests.support.states import json_bytes

# Each example opens a fresh database and fsyncs every append: keep the counts modest.
PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
NAMES = sorted(p.name for p in all_projections())


@register
class _Pinged(Event):
    """Test-only, not audit-relevant: only `stats` sees it."""

    TYPE: ClassVar[str] = "proptest.pinged"
    CONTROL: ClassVar[bool] = False
    n: int
    note: str = ""

    def stream_key(self) -> str:
        return f"instance:{self.n % 3}"


@register
class _Flagged(Event):
    """Test-only and audit-relevant, with an outcome of its own, so `audit` counts it by outcome."""

    TYPE: ClassVar[str] = "proptest.flagged"
    AUDIT: ClassVar[bool] = True
    model: str
    outcome: Literal["ok", "refused", "failed"] = "ok"

    def stream_key(self) -> str:
        return f"model:{self.model}"

    def audit_outcome(self) -> str:
        return self.outcome


# -- strategies -------------------------------------------------------------------------------------------

_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)  # no lone surrogates
_hex = st.text(alphabet="0123456789abcdef", min_size=32, max_size=32)


# Keys whose valid values a generic strategy cannot guess (durations, paths, URLs, names).
_SAMPLES: dict[str, list[str]] = {
    "engine.keep_alive": ["5m", "300", "-1", "0", "1h30m", "45s"],
    "server.tls_cert": ["", "/etc/blazar/cert.pem"],
    "server.tls_key": ["", "/etc/blazar/cert.pem"],
    "log.database_url": ["", "postgresql+asyncpg://blazar@db.lan:5432/blazar"],
    "cluster.node_name": ["", "gpu-1", "box.lan"],
    "cluster.node_url": ["", "http://10.0.0.2:11434", "https://gw.example"],
    "telemetry.otlp_endpoint": ["", "http://127.0.0.1:4318", "https://otel.example/v1/traces"],
    "retention.request_retention": ["30d", "0", "12h", "3600"],
    "retention.archive_dir": ["", "/srv/blazar-archive"],
}


def _config_value(key: str) -> st.SearchStrategy[Any]:
    """A valid value for `key`, from the settings schema itself (a new key needs no change here)."""
    info = config.FIELDS[key]
    ann = info.annotation
    if typing.get_origin(ann) is Literal:
        return st.sampled_from(typing.get_args(ann))
    if ann is bool:
        return st.booleans()
    if key in _SAMPLES:
        return st.sampled_from(_SAMPLES[key])
    if ann == dict[str, str]:
        return st.dictionaries(st.sampled_from(["x-team", "x-env"]), st.sampled_from(["ml", "dev"]), max_size=2)
    if ann is str:
        return st.sampled_from(["127.0.0.1", "::1", "0.0.0.0"])
    if ann == list[str]:
        origins = ["https://app.example", "http://localhost:5173"]
        items = origins if key == "server.cors_origins" else ["blazar.lan", "box"]
        return st.lists(st.sampled_from(items), max_size=2, unique=True)
    bounds = {type(m).__name__: m for m in info.metadata}
    above = "Gt" in bounds  # an exclusive lower bound (log_disk_share > 0): the bound itself is not valid
    lo = bounds["Ge"].ge if "Ge" in bounds else bounds["Gt"].gt if above else 0
    hi = bounds["Le"].le if "Le" in bounds else 1 << 20
    if ann is int:
        return st.integers(lo + 1 if above else lo, hi)
    if ann is float:
        return st.floats(lo, hi, exclude_min=above, allow_nan=False, allow_infinity=False)
    raise AssertionError(f"no strategy for config key {key!r} of type {ann!r}")


@dataclass(frozen=True)
class _ConfigSpec:
    """A config change without its `old` value, which depends on what came before."""

    key: str
    new: Any
    source: Literal["cli", "file"]


@st.composite
def _config_spec(draw: st.DrawFn) -> _ConfigSpec:
    key = draw(st.sampled_from(sorted(config.FIELDS)))
    new = draw(st.one_of(st.none(), _config_value(key).map(lambda v: config.validate_value(key, v))))
    return _ConfigSpec(key, new, draw(st.sampled_from(["cli", "file"])))


_snapshot = st.builds(
    SnapshotTaken,
    path=_text.map(lambda s: f"/snapshots/{s}.tar"),
    seq_last=st.integers(0, 10_000),
    event_count=st.integers(0, 10_000),
    db_sha256=_hex.map(lambda h: h * 2),
    model_files=st.integers(0, 20),
)
_pinged = st.builds(_Pinged, n=st.integers(-(2**53), 2**53), note=_text)
_flagged = st.builds(_Flagged, model=st.sampled_from(["qwen", "llama", "gemma"]),
                     outcome=st.sampled_from(["ok", "refused", "failed"]))

# The KV bank: saves, drops, removals and restores of a few sessions and models, and the turns placed for them (the
# sessions projection's bank bytes and counters must replay exactly).
_session = st.sampled_from(["s1", "s2", "chat-3"])
_model = st.sampled_from(["qwen", "gemma"])
_bytes = st.integers(0, 1 << 32)
_ms = st.floats(0, 10_000, allow_nan=False, allow_infinity=False)
_identity = st.builds(KvIdentity, engine=st.sampled_from(["b1", "b2"]), model_sha256=st.sampled_from(["aa", "bb"]),
                      ctx_tokens=st.sampled_from([2048, 4096]), cache_type_k=st.sampled_from(["f16", "q8_0"]),
                      cache_type_v=st.just("f16"), swa_full=st.booleans())
_saved = st.builds(SessionSaved, session=_session, model=_model, instance_id=st.sampled_from(["i1", "i2"]),
                   slot_id=st.integers(0, 3), file=_text.map(lambda t: f"slots/m/{t}.bin"), bytes=_bytes,
                   tokens=st.integers(0, 100_000), duration_ms=_ms, identity=_identity,
                   reason=st.sampled_from(["evicted", "stopped", "shutdown", "requested"]))
_dropped = st.builds(SessionDropped, session=_session, model=_model, file=st.just("slots/m/x.bin"), bytes=_bytes,
                     reason=st.sampled_from(["bank_full", "missing"]))
_removed = st.builds(SessionRemoved, session=_session, files=st.lists(st.just("slots/m/x.bin"), max_size=2),
                     bytes=_bytes)
_restored = st.builds(SessionRestored, session=_session, model=_model, instance_id=st.just("i1"),
                      slot_id=st.integers(0, 3), tokens=st.integers(0, 100_000), duration_ms=_ms)
_placed = st.builds(RequestPlaced, trace_id=_hex, model=_model, instance_id=st.sampled_from(["i1", "i2"]),
                    slot_id=st.integers(0, 3), session=_session, kv=st.sampled_from(["warm", "restored", "cold"]),
                    reason=_text, restored_tokens=st.one_of(st.none(), st.integers(0, 100_000)),
                    restore_ms=st.one_of(st.none(), _ms))
# Chat turns compared with the one before (the prefix projection's clients: a few agents, misses and breaks).
_prefix = st.builds(RequestPrefixCompared, trace_id=_hex, model=_model, instance_id=st.just("i1"),
                    agent=st.sampled_from([None, "claude-cli", "codex"]), previous_trace_id=_hex,
                    previous_prompt_tokens=st.integers(0, 5000), previous_messages=st.integers(1, 9),
                    messages=st.integers(1, 9), prompt_tokens=st.integers(0, 5000), reused_tokens=st.integers(0, 5000),
                    missed=st.booleans(), part=st.sampled_from([None, "system", "tools", "role", "message"]),
                    message_index=st.one_of(st.none(), st.integers(0, 9)), reprocessed_tokens=st.integers(0, 5000),
                    prefill_ms=st.one_of(st.none(), _ms))
# A response cache hit (the metrics projection counts it by key, from the actor).
_cache_hit = st.builds(RequestCacheHit, trace_id=_hex, model=_model, source=st.just("exact"),
                       entry=st.sampled_from(["ab" * 32, "cd" * 32]), age_s=_ms)
_session_event = st.one_of(_saved, _dropped, _removed, _restored, _placed, _cache_hit)
# Remote engines: registrations, removals and circuits of a few names.
_remote_name = st.sampled_from(["b", "vllm", "lab"])
_remote_event = st.one_of(
    st.builds(RemoteAdded, name=_remote_name, url=st.sampled_from(["http://h:1", "https://api.example"]),
              models=st.lists(_model, min_size=1, max_size=2, unique=True),
              api_key_env=st.one_of(st.none(), st.just("KEY")), max_concurrent=st.integers(1, 16)),
    st.builds(RemoteRemoved, name=_remote_name),
    st.builds(RemoteCircuitOpened, name=_remote_name, failures=st.integers(1, 9), reason=_text,
              source=st.sampled_from(["health_check", "request"]), open_until=_ms),
    st.builds(RemoteCircuitClosed, name=_remote_name, latency_ms=st.one_of(st.none(), _ms)))

# Realtime profiles: set (replaced) and removed, of a few names.
_profile_name = st.sampled_from(["talk", "desk"])
_realtime_event = st.one_of(
    st.builds(RealtimeProfileSet, name=_profile_name, stt=st.sampled_from(["whisper-base", "wt"]), llm=_model,
              tts=st.sampled_from(["joe", "amy"]), speaker=st.one_of(st.none(), st.just("b"))),
    st.builds(RealtimeProfileRemoved, name=_profile_name))

# The store's models, as the catalog folds them: imports (one outside the store: refused), variants, settings,
# aliases, pulls, template probes, projectors and adapters of a few names; its entries hold the events' pydantic
# parts, which a checkpoint must give back as they were.
_store_name = st.sampled_from(["qwen", "gemma", "tiny:q8"])
_sha = st.sampled_from(["ab" * 32, "cd" * 32])
_VISION = ProjectorMetadata(projector_type="gemma3", modalities=["vision"], weights_bytes=1024, tensor_count=3,
                            vision=EncoderShape(embedding_length=64, block_count=1, head_count=1, projection_dim=64,
                                                image_size=112, patch_size=14, scale_factor=2))
_catalog_event = st.one_of(
    st.builds(imported, _store_name, sha256=_sha,
              shards=st.sampled_from([[], [ShardFile(path="s/a.gguf", bytes=1, sha256="01" * 32)]])),
    st.builds(imported, _store_name, path=st.just("/outside/precious.txt")),
    st.builds(ModelRemoved, name=_store_name, path=st.just("qwen.gguf"), file_deleted=st.booleans()),
    st.builds(ModelVariantCreated, name=st.just("terse"), base=_store_name,
              settings=st.just(ModelSettings(system="Be terse."))),
    st.builds(ModelConfigured, name=_store_name,
              settings=st.sampled_from([ModelSettings(), ModelSettings(system="hi", parameters={"top_k": 4})])),
    st.builds(ModelAliased, alias=st.just("chat"), target=_store_name),
    st.builds(ModelAliasRemoved, alias=st.just("chat"), target=_store_name),
    st.builds(ModelPullStarted, target=st.just("org/q"), name=_store_name, source_kind=st.just("hub"),
              total_bytes=st.one_of(st.none(), _bytes)),
    st.builds(ModelPullCompleted, target=st.just("org/q"), name=_store_name, bytes=_bytes, sha256=_sha,
              duration_ms=st.integers(0, 10_000), downloaded_bytes=_bytes),
    st.builds(ModelPullFailed, target=st.just("org/q"), name=_store_name, reason=st.just("network"), detail=_text,
              partial_bytes=_bytes),
    st.builds(ModelTemplateProbed, name=_store_name, sha256=_sha, engine_tag=st.just("b1"), prompts=st.just(5),
              max_tokens=st.just(16), chosen=st.just("chatml"),
              trials=st.just([TemplateTrial(template="chatml", ended=5, answered=4, tokens=31)])),
    st.builds(ModelProjectorSet, name=_store_name, path=st.just(f"mmproj/{'cd' * 32}.gguf"), source=st.just("/m"),
              bytes=_bytes, sha256=st.just("cd" * 32), linked=st.booleans(), metadata=st.just(_VISION)),
    st.builds(ModelProjectorRemoved, name=_store_name, path=st.just(f"mmproj/{'cd' * 32}.gguf"),
              file_deleted=st.booleans()),
    st.builds(LoraAdded, model=_store_name, name=st.sampled_from(["a", "b"]), path=st.just(f"lora/{'ef' * 32}.gguf"),
              source=st.just("/l"), sha256=st.just("ef" * 32), bytes=_bytes, linked=st.booleans(),
              metadata=st.just(LoraMetadata(architecture="llama", rank=4, alpha=8.0, tensor_bytes=64,
                                            tensor_count=2))),
    st.builds(LoraRemoved, model=_store_name, name=st.sampled_from(["a", "b"]), path=st.just(f"lora/{'ef' * 32}.gguf"),
              file_deleted=st.booleans()))
# Memory measured after loads (calibration), benchmarks and profiles (profiles), and the nodes of a cluster.
_MACHINE = Machine(fingerprint="f" * 16, cpu="cpu", cores=2, memory_bytes=1 << 30)
_measured = st.builds(InstanceMemoryMeasured, model=_store_name, ctx_tokens=st.sampled_from([2048, 4096]),
                      slots=st.integers(1, 2), planned_bytes=_bytes, measured_bytes=_bytes)
_profile_event = st.one_of(
    st.builds(BenchRecorded, bench_id=st.sampled_from(["b1", "b2"]), model=_store_name,
              posture=st.sampled_from([Posture(), Posture(threads=2)]), engine_tag=st.just("b1"),
              machine=st.just(_MACHINE), ctx=st.just(2048), results=st.just([]), duration_s=st.just(1.0)),
    st.builds(ProfileAdopted, model=_store_name, posture=st.just(Posture(threads=2)), engine_tag=st.just("b1"),
              machine=st.just(_MACHINE), rule=_text, bench_id=st.one_of(st.none(), st.just("b2"))),
    st.builds(ProfileReset, model=_store_name, reason=_text))
_node_name = st.sampled_from(["a", "b"])
_node_event = st.one_of(
    st.builds(NodeStarted, name=_node_name, url=st.just("http://a:1"), pid=st.integers(1, 9), host=st.just("h"),
              insecure_cluster=st.booleans()),
    st.builds(NodeHeartbeat, name=_node_name, instances=st.integers(0, 3), in_flight=st.integers(0, 3)),
    st.builds(NodeStopped, name=_node_name),
    st.builds(NodeDown, name=_node_name, detail=_text, noticed_by=_node_name))


@dataclass(frozen=True)
class _Item:
    """One event to append, with the envelope its caller chose."""

    event: Event | _ConfigSpec
    actor: str
    stream: str | None
    trace_id: str | None


_item = st.builds(
    _Item,
    event=st.one_of(_config_spec(), _config_spec(), _snapshot, _pinged, _flagged, _session_event, _prefix,
                    _remote_event, _realtime_event,
                    _catalog_event, _measured, _profile_event, _node_event, instance_event, engine_event, key_event,
                    worker_event),
    actor=st.one_of(st.sampled_from(["cli:alice", "cli:bob", "user:carol", "daemon", "gateway"]),
                    _text.filter(bool)),
    stream=st.one_of(st.none(), st.sampled_from(["system", "model:qwen", "engine:e1", "instance:i-7"])),
    trace_id=st.one_of(st.none(), _hex),
)


@dataclass(frozen=True)
class _Step:
    """One commit (1-4 events), how the live runner learns of it, and whether a checkpoint follows."""

    items: list[_Item]
    advance: float  # clock seconds before the commit (0: several events share a timestamp)
    by_other_process: bool  # appended through a second handle: the live runner must catch up from the log
    live: Literal["apply", "catch_up", "apply_twice"]
    checkpoint: bool


_step = st.builds(
    _Step,
    items=st.lists(_item, min_size=1, max_size=4),
    advance=st.one_of(st.just(0.0), st.floats(0.001, 86_400, allow_nan=False)),
    by_other_process=st.booleans(),
    live=st.sampled_from(["apply", "catch_up", "apply_twice"]),
    checkpoint=st.booleans(),
)
_steps = st.lists(_step, min_size=1, max_size=12)


# -- helpers ----------------------------------------------------------------------------------------------


def _run(body: Callable[[EventLog, EventLog, FakeClock], Awaitable[None]]) -> None:
    """Run `body(log, other, clock)` on a fresh database (hypothesis does not reset pytest fixtures)."""

    async def main() -> None:
        with tempfile.TemporaryDirectory(prefix="blazar-prop-") as tmp:
            db = Path(tmp) / "blazar.db"
            clock = FakeClock()
            log = await SqliteEventLog.open(db, clock=clock)
            other = await SqliteEventLog.open(db, clock=clock)
            try:
                await body(log, other, clock)
            finally:
                await other.close()
                await log.close()

    asyncio.run(main())


def _materialise(items: list[_Item], overrides: dict[str, Any]) -> list[tuple[Event, _Item]]:
    out: list[tuple[Event, _Item]] = []
    for item in items:
        ev = item.event
        if isinstance(ev, _ConfigSpec):
            old = overrides.get(ev.key)
            if ev.new is None:
                overrides.pop(ev.key, None)
            else:
                overrides[ev.key] = ev.new
            ev = ConfigChanged(key=ev.key, old=old, new=ev.new, source=ev.source)
        out.append((ev, item))
    return out


async def _commit(log: EventLog, clock: FakeClock, step: _Step, overrides: dict[str, Any]) -> list[Recorded]:
    clock.advance(step.advance)
    batch = [
        log.pending(ev, actor=item.actor, stream=item.stream, trace_id=item.trace_id)
        for ev, item in _materialise(step.items, overrides)
    ]
    return await log.commit_pending(batch)


async def _write_all(log: EventLog, other: EventLog, clock: FakeClock, steps: list[_Step]) -> list[Recorded]:
    overrides: dict[str, Any] = {}
    for step in steps:
        await _commit(other if step.by_other_process else log, clock, step, overrides)
    return [rec async for rec in log.read()]


def _states(runner: ProjectionRunner) -> dict[str, bytes]:
    """Every projection's state and view, as the bytes a checkpoint would store (exact, key order aside)."""
    out = {name: runner.state_bytes(name) for name in NAMES}
    out["views"] = json_bytes(runner.views())
    return out


async def _rebuilt(log: EventLog, *, upto: int | None = None) -> ProjectionRunner:
    runner = ProjectionRunner(log, all_projections())
    await runner.start(upto=upto, use_checkpoints=False)
    return runner


async def _checkpoint_at(log: EventLog, seq: int) -> None:
    """Leave exactly one checkpoint per projection, as of `seq`."""
    await drop_checkpoints(log)
    runner = await _rebuilt(log, upto=seq)
    await runner.checkpoint()


def _origins(runner: ProjectionRunner) -> dict[str, str]:
    return {s.name: s.origin for s in runner.status()}


# -- properties -------------------------------------------------------------------------------------------


@PROPERTY
@given(steps=_steps)
def test_live_state_equals_checkpoint_plus_tail_equals_full_rebuild(steps: list[_Step]) -> None:
    async def body(log: EventLog, other: EventLog, clock: FakeClock) -> None:
        live = ProjectionRunner(log, all_projections())
        await live.start()
        overrides: dict[str, Any] = {}
        checkpointed = 0
        for step in steps:
            recs = await _commit(other if step.by_other_process else log, clock, step, overrides)
            if step.by_other_process or step.live == "catch_up":
                await live.catch_up()
            else:
                for rec in recs:
                    live.apply(rec)
            if step.live == "apply_twice":  # an event folded already is skipped, not folded again
                for rec in recs:
                    live.apply(rec)
            assert live.seq == recs[-1].seq
            if step.checkpoint:
                await live.checkpoint()
                checkpointed = live.seq

        rebuilt = await _rebuilt(log)
        resumed = ProjectionRunner(log, all_projections())
        await resumed.start()

        assert all(s.halted is None for s in live.status() + rebuilt.status() + resumed.status())
        assert live.seq == rebuilt.seq == resumed.seq == await log.last_seq()
        expected_origin = f"checkpoint at {checkpointed}" if checkpointed else "rebuilt: no checkpoint"
        assert set(_origins(resumed).values()) == {expected_origin}
        assert resumed.folded_at_start == live.seq - checkpointed
        assert _states(live) == _states(rebuilt) == _states(resumed)

    _run(body)


@PROPERTY
@given(steps=_steps, data=st.data())
def test_state_at_n_equals_the_fold_of_the_first_n_events(steps: list[_Step], data: st.DataObject) -> None:
    async def body(log: EventLog, other: EventLog, clock: FakeClock) -> None:
        records = await _write_all(log, other, clock, steps)
        total = len(records)
        assert [r.seq for r in records] == list(range(1, total + 1))
        for n in data.draw(st.lists(st.integers(0, total), min_size=1, max_size=3), label="N"):
            want = json_bytes({p.name: p.view(fold(p, records[:n])) for p in all_projections()})

            placements: list[tuple[str, int | None]] = [("none", None)]
            if n >= 1:
                placements.append(("before", data.draw(st.integers(1, n), label="checkpoint before N")))
            if n < total:
                placements.append(("past", data.draw(st.integers(n + 1, total), label="checkpoint past N")))
            for where, cp_seq in placements:
                if cp_seq is None:
                    await drop_checkpoints(log)
                else:
                    await _checkpoint_at(log, cp_seq)
                for use_checkpoints in (True, False):
                    got = await state_at(log, seq=n, use_checkpoints=use_checkpoints)
                    assert got["seq"] == n, (where, use_checkpoints)
                    assert json_bytes(got["projections"]) == want, (where, cp_seq, use_checkpoints)
                # The checkpoint is used exactly when it lies at or before N.
                runner = ProjectionRunner(log, all_projections())
                await runner.start(upto=n)
                origins = set(_origins(runner).values())
                if where == "before":
                    assert origins == {f"checkpoint at {cp_seq}"}
                    assert runner.folded_at_start == n - (cp_seq or 0)
                elif where == "past":
                    assert origins == {f"folded from the start (checkpoint at {cp_seq} is past {n})"}

    _run(body)


_corruption = st.one_of(
    st.tuples(st.just("random bytes"), st.binary(max_size=64)),
    st.tuples(st.just("flipped character"), st.tuples(st.integers(0, 10_000), st.characters(codec="ascii"))),
    st.tuples(st.just("truncated"), st.integers(0, 10_000)),
    st.tuples(st.just("wrong sha256"), _hex.map(lambda h: h * 2)),
)


@PROPERTY
@given(steps=_steps, tail=st.lists(_step, max_size=3), victims=st.sets(st.sampled_from(NAMES), min_size=1),
       corruption=_corruption)
def test_a_corrupt_checkpoint_is_detected_and_rebuilt_to_the_same_state(
    steps: list[_Step], tail: list[_Step], victims: set[str], corruption: tuple[str, Any]
) -> None:
    async def body(log: EventLog, other: EventLog, clock: FakeClock) -> None:
        await _write_all(log, other, clock, steps)
        cp_seq = await log.last_seq()
        await _checkpoint_at(log, cp_seq)
        await _write_all(log, other, clock, tail)  # events after the checkpoint: a tail to fold

        stored = await load_checkpoints(log)
        kind, arg = corruption
        for name in sorted(victims):
            cp = stored[name]
            state: str | bytes = cp.state_text
            sha = cp.sha256
            if kind == "random bytes":
                state = arg
            elif kind == "flipped character":
                pos, char = arg
                pos %= len(cp.state_text)
                state = cp.state_text[:pos] + char + cp.state_text[pos + 1:]
            elif kind == "truncated":
                state = cp.state_text[: arg % len(cp.state_text)]
            else:
                sha = arg
            assume(state != cp.state_text or sha != cp.sha256)
            assume(hashlib.sha256(state if isinstance(state, bytes) else state.encode()).hexdigest() != sha)
            async with log.write_transaction() as conn:
                await conn.exec_driver_sql(
                    "UPDATE checkpoints SET state = ?, sha256 = ? WHERE name = ?", (state, sha, name)
                )

        runner = ProjectionRunner(log, all_projections())
        await runner.start()
        origins = _origins(runner)
        for name in NAMES:
            if name in victims:
                assert origins[name].startswith("rebuilt: checkpoint corrupt"), origins
            else:
                assert origins[name] == f"checkpoint at {cp_seq}", origins
        assert all(s.halted is None for s in runner.status())
        assert _states(runner) == _states(await _rebuilt(log))

        # Rebuilt, it checkpoints cleanly again: the next start restores every projection.
        await runner.checkpoint()
        again = ProjectionRunner(log, all_projections())
        await again.start()
        assert set(_origins(again).values()) == {f"checkpoint at {runner.seq}"}
        assert _states(again) == _states(runner)

    _run(body)
