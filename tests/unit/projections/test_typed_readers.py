"""The projections' typed readers, fed events: what handlers and the api read instead of the state's dicts
(residency instances, circuits and ps rows; catalog models and aliases; installed and active engines; keys; a key's
usage; known traces; config overrides)."""

from __future__ import annotations

from blazar.events.engines import EngineActivated, EngineFile, EngineInstalled, EngineRemoved
from blazar.events.instances import (
    InstanceExited,
    InstanceReady,
    InstanceStarted,
    InstanceStarting,
    ModelCircuitOpened,
    ModelCircuitReset,
)
from blazar.events.keys import KeyCreated, KeyLimitsChanged, KeyRevoked, KeyRotated
from blazar.events.models import InstanceMemoryMeasured, ModelAliased, ModelImported, ModelMetadata, ShardFile
from blazar.events.requests import RequestCompleted, RequestReceived, RequestRejected
from blazar.events.system import ConfigChanged
from blazar.projections import (
    CatalogProjection,
    ConfigProjection,
    EnginesProjection,
    KeysProjection,
    MetricsProjection,
    ResidencyProjection,
    TracesProjection,
    catalog,
    config,
    engines,
    fold,
    keys,
    metrics,
    residency,
    traces,
)
from blazar.projections.metrics import DAY_S
from tests.support.events import rec, recs

MiB = 1 << 20
META = ModelMetadata(architecture="llama", parameter_count=90_560, file_type="Q8_0", block_count=3)


# -- residency -----------------------------------------------------------------------------------------------------

def _facts(iid: str, model: str = "qwen", tag: str = "b1", **overrides: object) -> dict[str, object]:
    return {
        "instance_id": iid, "model": model, "engine_tag": tag, "port": 40001,
        "argv": ["llama-server", "--port", "40001"], "log_path": f"instances/{iid}.log", "ctx_tokens": 4096,
        "engine_ctx": 8192, "slots": 2, "planned_bytes": 500 * MiB, "estimate_bytes": 480 * MiB,
        "keep_alive_s": 300.0, "gpu_layers": 99,
    } | overrides


def started(iid: str, **overrides: object) -> InstanceStarted:
    return InstanceStarted(pid=4242, **_facts(iid, **overrides))  # type: ignore[arg-type]


def test_instances_are_typed_oldest_first_with_the_intent_before_its_pid() -> None:
    state = fold(ResidencyProjection(), recs(
        started("i1"), InstanceStarting(**_facts("i2", model="gemma", tag="b2")),  # type: ignore[arg-type]
        InstanceReady(instance_id="i1", model="qwen", load_ms=800),
        InstanceMemoryMeasured(model="qwen", instance_id="i1", ctx_tokens=4096, slots=2, planned_bytes=480 * MiB,
                               measured_bytes=600 * MiB)))
    got = residency.instances(state)
    assert [i.instance_id for i in got] == ["i1", "i2"]
    first = got[0]
    assert (first.model, first.pid, first.port, first.state, first.gpu_layers) == ("qwen", 4242, 40001, "ready", 99)
    assert first.argv == ("llama-server", "--port", "40001") and first.log_path == "instances/i1.log"
    assert (first.started_ts, first.ready_ts, first.started_seq) == (1001.0, 1003.0, 1)
    assert first.measured_bytes == 600 * MiB and first.resident_bytes == 600 * MiB
    assert residency.instance(state, "i2") == got[1] and got[1].pid is None and got[1].state == "starting"
    assert residency.instance(state, "nope") is None
    assert [i.instance_id for i in residency.instances_of(state, "gemma")] == ["i2"]


def test_engine_tags_in_use_follow_the_instances_until_they_exit() -> None:
    state = fold(ResidencyProjection(), recs(started("i1", tag="b1"), started("i2", tag="b2"),
                                             started("i3", tag="b1"), InstanceExited(instance_id="i2", model="qwen",
                                                                                     reason="stopped")))
    assert residency.engine_tags_in_use(state) == {"b1"}
    assert residency.engine_tags_in_use(fold(ResidencyProjection(), [])) == set()


def test_a_typed_circuit_and_the_open_circuits_until_expiry_or_reset() -> None:
    state = fold(ResidencyProjection(), recs(
        ModelCircuitOpened(model="qwen", crashes=3, window_s=60.0, open_until=2000.0),
        ModelCircuitOpened(model="gemma", crashes=2, window_s=60.0, open_until=3000.0),
        ModelCircuitReset(model="gemma")))
    assert residency.circuit(state, "qwen", 1999.0) == residency.Circuit("qwen", 2000.0, 3, 1)
    assert residency.circuit(state, "qwen", 2000.0) is None
    assert residency.circuit(state, "gemma", 1000.0) is None and residency.circuit(state, "x", 0.0) is None
    assert residency.open_circuits(state, now=1500.0) == {"qwen": 2000.0}
    assert residency.open_circuits(state, now=2500.0) == {}


def test_ps_rows_lay_live_figures_over_the_log_and_count_idleness_and_expiry() -> None:
    state = fold(ResidencyProjection(), recs(
        started("i1", model="zeta"), started("i2", model="alpha", pinned=True),
        InstanceReady(instance_id="i1", model="zeta", load_ms=5), InstanceReady(instance_id="i2", model="alpha",
                                                                                load_ms=5),
        started("i3", model="zeta", keep_alive_s=None),
        ModelCircuitOpened(model="zeta", crashes=3, window_s=60.0, open_until=1500.0)))
    rows = residency.ps_rows(state, now=1100.0, live={"i1": {"in_flight": 0, "last_used": 1050.0}})
    assert [(r.model, r.instance_id) for r in rows] == [("alpha", "i2"), ("zeta", "i1"), ("zeta", "i3")]
    alpha, z1, z3 = rows
    assert alpha.pinned is True and alpha.expires_at is None and alpha.idle_s == 1100.0 - 1004.0
    assert z1.idle_s == 50.0 and z1.expires_at == 1350.0 and z1.circuit_open_until == 1500.0
    assert z3.state == "starting" and z3.idle_s is None and z3.expires_at is None
    assert alpha.circuit_open_until is None
    busy = residency.ps_rows(state, now=1100.0, live={"i1": {"in_flight": 2, "last_used": 1050.0}})
    assert busy[1].in_flight == 2 and busy[1].idle_s is None and busy[1].expires_at is None
    # The JSON `blazar ps --json` and GET /api/blazar/ps give: every field, by its name.
    assert z1.to_json() == {
        "model": "zeta", "instance_id": "i1", "state": "ready", "pid": 4242, "port": 40001, "ctx_tokens": 4096,
        "slots": 2, "planned_bytes": 500 * MiB, "measured_bytes": None, "idle_s": 50.0, "expires_at": 1350.0,
        "keep_alive_s": 300.0, "pinned": False, "engine_tag": "b1", "in_flight": 0, "started_ts": 1001.0,
        "circuit_open_until": 1500.0, "workers": {}, "node": "", "kind": "llama-server", "posture": "defaults",
        "posture_fields": None, "profile_seq": None, "profile_stale_seq": None}


# -- catalog -------------------------------------------------------------------------------------------------------

def imported(name: str, **overrides: object) -> ModelImported:
    fields: dict[str, object] = {"name": name, "path": f"{name.replace(':', '--')}.gguf", "source": f"hub:{name}",
                                 "bytes": 100, "sha256": "ab" * 32, "linked": True, "metadata": META}
    return ModelImported(**(fields | overrides))  # type: ignore[arg-type]


def test_catalog_models_are_typed_sorted_by_name_and_aliases_name_their_model() -> None:
    shards = [ShardFile(path="big/big-00001-of-00002.gguf", bytes=60, sha256="01" * 32),
              ShardFile(path="big/big-00002-of-00002.gguf", bytes=40, sha256="02" * 32)]
    state = fold(CatalogProjection(), recs(
        imported("tiny:q8"), imported("big", path=shards[0].path, shards=shards),
        ModelAliased(alias="small", target="tiny:q8")))
    got = catalog.models(state)
    assert [m.name for m in got] == ["big", "tiny:q8"]
    big, tiny = got
    assert big.files == ("big/big-00001-of-00002.gguf", "big/big-00002-of-00002.gguf")
    assert tiny.files == ("tiny--q8.gguf",) and tiny.source == "hub:tiny:q8" and tiny.added_ts == 1001.0
    assert tiny.metadata == META and tiny.sha256 == "ab" * 32 and tiny.bytes == 100
    assert catalog.stored(state, "small") == tiny
    assert catalog.aliases(state) == {"small": "tiny:q8"}
    assert catalog.alias_target(state, "small") == "tiny:q8" and catalog.alias_target(state, "tiny:q8") is None
    assert catalog.is_model(state, "tiny:q8") and not catalog.is_model(state, "small")
    assert not catalog.is_model(state, "tiny")  # `tiny:latest` is what `tiny` resolves to, and there is none


# -- engines -------------------------------------------------------------------------------------------------------

FILES = [EngineFile(path="llama-server", bytes=10, sha256="ab" * 32),
         EngineFile(path="libx.so.0", bytes=0, sha256="", link_to="libx.so.0.1")]


def installed(tag: str) -> EngineInstalled:
    return EngineInstalled(tag=tag, source_kind="path", source=f"/opt/{tag}", binary="llama-server", files=FILES,
                           version={"version": "0.6.0"}, manifest={"flags": []})


def test_installed_and_active_engines_are_typed_and_a_removal_leaves_none_active() -> None:
    state = fold(EnginesProjection(), recs(installed("a"), installed("b"), EngineActivated(tag="a", reason="install")))
    a = engines.installed(state, "a")
    assert a is not None and a.tag == "a" and a.binary == "llama-server" and a.files == tuple(FILES)
    assert (a.source_kind, a.source, a.installed_seq) == ("path", "/opt/a", 1)
    assert a.version == {"version": "0.6.0"} and a.manifest == {"flags": []}
    assert state.active == "a" and engines.active(state) == a
    assert engines.installed(state, "nope") is None and engines.tags(state) == ["a", "b"]
    gone = fold(EnginesProjection(), [rec(4, EngineRemoved(tag="a", reason="prune"))], state)
    assert gone.active is None and engines.active(gone) is None and engines.tags(gone) == ["b"]


# -- keys ----------------------------------------------------------------------------------------------------------

def key_created(name: str, prefix: str, **kw: object) -> KeyCreated:
    return KeyCreated(name=name, prefix=prefix, salt="00" * 16, hash="11" * 32, **kw)  # type: ignore[arg-type]


def test_keys_are_typed_and_only_live_ones_are_found_by_prefix() -> None:
    state = fold(KeysProjection(), recs(
        key_created("alice", "aaaaaaaa", models=["gemma*"], rpm=5, expires_ts=9999.0),
        key_created("bob", "bbbbbbbb", admin=True), KeyRevoked(name="bob"),
        KeyLimitsChanged(name="alice", changed={"tpm": 100, "models": ["q*", "gemma*"]}),
        KeyRotated(name="alice", prefix="cccccccc", salt="22" * 16, hash="33" * 32)))
    alice = keys.key(state, "alice")
    assert alice is not None and alice.models == ("q*", "gemma*") and (alice.rpm, alice.tpm) == (5, 100)
    assert (alice.prefix, alice.salt, alice.hash) == ("cccccccc", "22" * 16, "33" * 32)
    assert alice.expires_ts == 9999.0 and not alice.admin and not alice.revoked and alice.created_ts == 1001.0
    bob = keys.key(state, "bob")
    assert bob is not None and bob.revoked and bob.admin
    assert keys.live_by_prefix(state, "cccccccc") == alice
    assert keys.live_by_prefix(state, "aaaaaaaa") is None  # rotated away
    assert keys.live_by_prefix(state, "bbbbbbbb") is None  # revoked
    assert keys.prefixes_in_use(state) == {"cccccccc"} and keys.key(state, "carol") is None


# -- metrics -------------------------------------------------------------------------------------------------------

def test_a_keys_usage_counts_its_ended_requests_of_the_latest_utc_day() -> None:
    day = 20_000
    t0 = day * DAY_S + 10.0
    events = [
        rec(1, RequestReceived(trace_id="t1", dialect="openai", route="/v1/chat/completions", model="m"), ts=t0,
            actor="key:alice"),
        rec(2, RequestCompleted(trace_id="t1", model="m", duration_ms=5.0, prompt_tokens=10, completion_tokens=5),
            ts=t0 + 1, actor="key:alice"),
        rec(3, RequestRejected(trace_id="t2", model="m", status=429, reason="rate_limit_exceeded",
                               detail="rpm"), ts=t0 + 2,
            actor="key:alice"),
    ]
    state = fold(MetricsProjection(), events)
    assert metrics.key_usage(state, "alice") == metrics.KeyUsage(day=day, requests_today=2, tokens_today=15)
    assert metrics.key_usage(state, "bob") is None
    assert metrics.tokens_on(state, "alice", day) == 15 and metrics.tokens_on(state, "alice", day + 1) == 0
    later = fold(MetricsProjection(), [rec(4, RequestCompleted(trace_id="t3", model="m", duration_ms=1.0,
                                                               prompt_tokens=1), ts=t0 + DAY_S, actor="key:alice")],
                 state)
    assert metrics.key_usage(later, "alice") == metrics.KeyUsage(day=day + 1, requests_today=1, tokens_today=1)


# -- traces and config ---------------------------------------------------------------------------------------------

def test_a_trace_is_known_once_received_and_the_latest_failure_is_named() -> None:
    state = fold(TracesProjection(), recs(
        RequestReceived(trace_id="t1", dialect="openai", route="/v1/models", model="m"),
        RequestRejected(trace_id="t2", model="m", status=404, reason="model_not_found", detail="no such model")))
    assert traces.known(state, "t1") and traces.known(state, "t2") and not traces.known(state, "t3")
    assert state.last_failed == "t2"
    assert fold(TracesProjection(), []).last_failed is None


def test_config_overrides_are_a_copy_of_what_the_log_set_and_unset() -> None:
    state = fold(ConfigProjection(), recs(ConfigChanged(key="ctx", new=8192), ConfigChanged(key="slots", new=2),
                                          ConfigChanged(key="slots", old=2, new=None)))
    got = config.overrides(state)
    assert got == {"fit.ctx": 8192}
    got["fit.ctx"] = 1
    assert config.overrides(state) == {"fit.ctx": 8192}
