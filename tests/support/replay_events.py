"""Hypothesis strategies for the events of the instance, engine, key and worker lifecycles, over a few ids each so
that random logs start, change and end the same things (tests/property/test_replay.py folds them: the residency,
engines, keys and workers projections, and audit and stats)."""

from __future__ import annotations

from hypothesis import strategies as st

from blazar.events.engines import (
    EngineActivated,
    EngineActivationRefused,
    EngineFile,
    EngineInstalled,
    EngineRemoved,
    EngineSmokeTested,
    EngineVerified,
)
from blazar.events.instances import (
    InstanceEvicted,
    InstanceExited,
    InstanceKeepAliveSet,
    InstanceLoadRefused,
    InstanceReady,
    InstanceStarted,
    InstanceStarting,
    ModelCircuitOpened,
    ModelCircuitReset,
)
from blazar.events.keys import KeyCreated, KeyLimitsChanged, KeyRevoked, KeyRotated
from blazar.events.models import InstanceMemoryMeasured
from blazar.events.nodes import NodeDown
from blazar.events.tuning import Posture
from blazar.events.workers import WorkerStarted, WorkerStopped

_model = st.sampled_from(["qwen", "gemma"])
_iid = st.sampled_from(["i1", "i2", "i3"])
_bytes = st.integers(0, 1 << 40)
_secs = st.floats(0, 1e6, allow_nan=False, allow_infinity=False)
_maybe_secs = st.one_of(st.none(), _secs)


def _start(cls: type[InstanceStarting] | type[InstanceStarted],
           **extra: st.SearchStrategy[object]) -> st.SearchStrategy[object]:
    return st.builds(
        cls, instance_id=_iid, model=_model, engine_tag=st.sampled_from(["b1", "b2"]), port=st.integers(0, 65535),
        argv=st.lists(st.sampled_from(["llama-server", "-c", "4096"]), max_size=3),
        log_path=_iid.map(lambda i: f"instances/{i}.log"), ctx_tokens=st.integers(1, 1 << 17),
        engine_ctx=st.integers(1, 1 << 17), slots=st.integers(1, 8), planned_bytes=_bytes, estimate_bytes=_bytes,
        keep_alive_s=_maybe_secs, pinned=st.booleans(), node=st.sampled_from(["", "a"]),
        workers=st.dictionaries(st.just("10.0.0.2:50052"), st.integers(1, 40), max_size=1),
        posture=st.one_of(st.none(), st.builds(Posture, threads=st.integers(1, 8), flash_attn=st.booleans())),
        profile_seq=st.one_of(st.none(), st.integers(1, 99)), **extra)


instance_event = st.one_of(
    _start(InstanceStarting), _start(InstanceStarted, pid=st.integers(1, 1 << 22)),
    st.builds(InstanceReady, instance_id=_iid, model=_model, load_ms=st.integers(0, 60_000)),
    st.builds(InstanceExited, instance_id=_iid, model=_model,
              reason=st.sampled_from(["stopped", "evicted", "crashed", "load_failed", "lost", "spawn_failed"]),
              exit_code=st.one_of(st.none(), st.integers(-15, 1))),
    st.builds(InstanceEvicted, instance_id=_iid, model=_model, reason=st.sampled_from(["idle", "memory"]),
              for_model=st.one_of(st.none(), _model)),
    st.builds(InstanceKeepAliveSet, instance_id=_iid, model=_model, keep_alive_s=_maybe_secs, pinned=st.booleans()),
    st.builds(InstanceMemoryMeasured, model=_model, instance_id=st.one_of(st.none(), _iid), ctx_tokens=st.just(4096),
              slots=st.just(1), planned_bytes=_bytes, measured_bytes=_bytes),
    st.builds(InstanceLoadRefused, model=_model, reason=st.sampled_from(["does_not_fit", "no_room"]),
              detail=st.text(max_size=8)),
    st.builds(ModelCircuitOpened, model=_model, crashes=st.integers(1, 5), window_s=_secs, open_until=_secs),
    st.builds(ModelCircuitReset, model=_model),
    st.builds(NodeDown, name=st.just("a"), noticed_by=st.just("b")),
)

_tag = st.sampled_from(["e1", "e2", "e3"])
_file = EngineFile(path="llama-server", bytes=10, sha256="ab" * 32)
engine_event = st.one_of(
    st.builds(EngineInstalled, tag=_tag, source_kind=st.just("path"), source=st.just("/opt/llama-server"),
              # an absolute binary: an untrusted install, refused, and so is an activation of its tag
              binary=st.sampled_from(["llama-server", "llama-server", "/tmp/evil"]), files=st.just([_file]),
              version=st.just({"version": "0.6.0"}), manifest=st.just({"flags": []}),
              build_options=st.lists(st.just("GGML_CUDA=ON"), max_size=1)),
    st.builds(EngineSmokeTested, tag=_tag, passed=st.booleans(), duration_ms=st.integers(0, 9999),
              exit_code=st.one_of(st.none(), st.just(-4))),
    st.builds(EngineVerified, tag=_tag, ok=st.booleans(), checked_files=st.integers(0, 3),
              problems=st.lists(st.just("llama-server: missing"), max_size=1)),
    st.builds(EngineActivated, tag=_tag, reason=st.sampled_from(["install", "use", "rollback"])),
    st.builds(EngineActivationRefused, tag=_tag, reason=st.just("smoke_failed"), detail=st.just("SIGILL")),
    st.builds(EngineRemoved, tag=_tag, reason=st.sampled_from(["prune", "user"])),
)

_key = st.sampled_from(["alice", "bob"])
_prefix = st.sampled_from(["aaaaaaaa", "bbbbbbbb", "cccccccc"])
_limit = st.one_of(st.none(), st.integers(1, 1000))
key_event = st.one_of(
    st.builds(KeyCreated, name=_key, prefix=_prefix, salt=st.just("00" * 16), hash=st.just("11" * 32),
              models=st.lists(st.sampled_from(["gemma*", "qwen"]), max_size=2), rpm=_limit, admin=st.booleans(),
              expires_ts=_maybe_secs, cache_group=st.one_of(st.none(), st.just("team"))),
    st.builds(KeyRotated, name=_key, prefix=_prefix, salt=st.just("22" * 16), hash=st.just("33" * 32)),
    st.builds(KeyRevoked, name=_key),
    st.builds(KeyLimitsChanged, name=_key,
              changed=st.fixed_dictionaries({}, optional={"rpm": _limit, "models": st.lists(st.just("q*"), max_size=1),
                                                          "may_prioritize": st.booleans()})),
)

_worker = st.sampled_from(["w1", "w2"])
worker_event = st.one_of(
    st.builds(WorkerStarted, name=_worker, host=st.just("127.0.0.1"), port=st.integers(1, 65535), mem_bytes=_bytes,
              pid=st.integers(1, 1 << 22), engine_tag=_tag),
    st.builds(WorkerStopped, name=_worker, reason=st.sampled_from(["stopped", "crashed", "gave_up"])),
)
