"""The residency projection, fed instance events: what is loaded, in which state, with what memory and keep-alive;
per model the crashes, circuit, loads, evictions and refusals; and its query helpers."""

from __future__ import annotations

from blazar.clock import FakeClock
from blazar.events import Recorded
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
from blazar.events.log import EventLog
from blazar.events.models import InstanceMemoryMeasured
from blazar.events.tuning import Posture
from blazar.projections import ResidencyProjection, all_projections, fold
from blazar.projections.residency import (
    CRASHES_KEPT,
    Circuit,
    Eviction,
    LastExit,
    LastRefusal,
    ModelRecord,
    ResidencyState,
    ResidentInstance,
    circuit,
    crashes_within,
    engine_tags_in_use,
    instance,
    instances,
    instances_of,
    ps_rows,
)
from blazar.projections.runner import ProjectionRunner
from tests.support.events import rec
from tests.support.states import state_bytes, through_checkpoint

MiB = 1 << 20


def started(iid: str, model: str = "qwen", tag: str = "b1", **overrides: object) -> InstanceStarted:
    fields: dict[str, object] = {
        "instance_id": iid, "model": model, "engine_tag": tag, "pid": 4242, "port": 40001,
        "argv": ["llama-server", "-m", f"/m/{model}.gguf"], "log_path": f"instances/{iid}.log", "ctx_tokens": 4096,
        "engine_ctx": 8192, "slots": 2, "planned_bytes": 500 * MiB, "estimate_bytes": 480 * MiB,
        "keep_alive_s": 300.0,
    }
    return InstanceStarted(**(fields | overrides))


def exited(iid: str, reason: str, model: str = "qwen", code: int | None = None) -> InstanceExited:
    return InstanceExited(instance_id=iid, model=model, reason=reason, exit_code=code)  # type: ignore[arg-type]


def measured(model: str, instance_id: str | None, nbytes: int) -> InstanceMemoryMeasured:
    return InstanceMemoryMeasured(model=model, instance_id=instance_id, ctx_tokens=4096, slots=2,
                                  planned_bytes=480 * MiB, measured_bytes=nbytes)


def test_a_start_adds_a_starting_instance_with_its_shape_and_counts_the_load() -> None:
    state = fold(ResidencyProjection(), [rec(1, started("i1", cache_type_k="q8_0", gpu_layers=99, pinned=True))])
    assert state == ResidencyState(
        instances={"i1": ResidentInstance(
            instance_id="i1", model="qwen", engine_tag="b1", pid=4242, port=40001,
            argv=("llama-server", "-m", "/m/qwen.gguf"), log_path="instances/i1.log", ctx_tokens=4096, slots=2,
            gpu_layers=99, planned_bytes=500 * MiB, measured_bytes=None, keep_alive_s=300.0, pinned=True,
            state="starting", started_ts=1001.0, ready_ts=None, started_seq=1, engine_ctx=8192,
            cache_type_k="q8_0", cache_type_v="f16", flash_attn=False, estimate_bytes=480 * MiB)},
        models={"qwen": ModelRecord(loads=1)},
    )
    assert engine_tags_in_use(state) == {"b1"}


def test_ready_records_when_and_how_long_the_load_took() -> None:
    state = fold(ResidencyProjection(), [rec(1, started("i1")),
                                         rec(2, InstanceReady(instance_id="i1", model="qwen", load_ms=1234))])
    inst = state.instances["i1"]
    assert (inst.state, inst.ready_ts, inst.load_ms) == ("ready", 1002.0, 1234)


def test_an_eviction_marks_the_instance_stopping_and_its_exit_removes_it() -> None:
    p = ResidencyProjection()
    state = fold(p, [
        rec(1, started("i1")),
        rec(2, InstanceReady(instance_id="i1", model="qwen", load_ms=900)),
        rec(3, InstanceEvicted(instance_id="i1", model="qwen", reason="memory", for_model="llama",
                               bytes_freed=500 * MiB)),
    ])
    inst = state.instances["i1"]
    assert inst.state == "stopping"
    assert inst.eviction == Eviction(reason="memory", for_model="llama", seq=3)
    assert state.models["qwen"].evictions == 1
    state = fold(p, [rec(4, exited("i1", "evicted", code=0))], state)
    assert state.instances == {} and engine_tags_in_use(state) == set()
    assert state.models["qwen"].last_exit == LastExit(reason="evicted", exit_code=0, ts=1004.0, instance_id="i1")
    assert state.models["qwen"].crashes == []


def test_ready_after_the_eviction_decision_keeps_it_stopping() -> None:
    state = fold(ResidencyProjection(), [
        rec(1, started("i1")),
        rec(2, InstanceEvicted(instance_id="i1", model="qwen", reason="reshape")),
        rec(3, InstanceReady(instance_id="i1", model="qwen", load_ms=700)),
    ])
    inst = state.instances["i1"]
    assert inst.state == "stopping" and inst.load_ms == 700


def test_crash_like_exits_are_remembered_newest_last_and_capped() -> None:
    p = ResidencyProjection()
    events = [rec(1, started("i0"))]
    reasons = ["crashed", "load_failed", "load_timeout", "stopped", "lost", "shutdown"]
    for n, reason in enumerate(reasons, start=2):
        events.append(rec(n, exited(f"i{n}", reason, code=-9)))
    state = fold(p, events)
    assert state.models["qwen"].crashes == [1002.0, 1003.0, 1004.0]  # only the process's own failures
    state = fold(p, [rec(100 + n, exited(f"x{n}", "crashed")) for n in range(CRASHES_KEPT + 5)], state)
    crashes = state.models["qwen"].crashes
    assert len(crashes) == CRASHES_KEPT and crashes[-1] == 1100.0 + CRASHES_KEPT + 4
    assert "i0" in state.instances  # exits of other instances leave it alone


def test_engine_tags_in_use_are_those_of_the_live_instances() -> None:
    p = ResidencyProjection()
    state = fold(p, [rec(1, started("a", tag="b1")), rec(2, started("b", model="gemma", tag="b1")),
                     rec(3, started("c", model="llama", tag="b2"))])
    assert engine_tags_in_use(state) == {"b1", "b2"}
    state = fold(p, [rec(4, exited("a", "stopped")), rec(5, exited("c", "crashed", model="llama"))], state)
    assert engine_tags_in_use(state) == {"b1"}


def test_keep_alive_and_pin_changes_apply_to_a_known_instance_only() -> None:
    p = ResidencyProjection()
    state = fold(p, [
        rec(1, started("i1")),
        rec(2, InstanceKeepAliveSet(instance_id="i1", model="qwen", keep_alive_s=None, pinned=True)),
        rec(3, InstanceKeepAliveSet(instance_id="ghost", model="qwen", keep_alive_s=5.0)),
    ])
    inst = state.instances["i1"]
    assert (inst.keep_alive_s, inst.pinned) == (None, True)
    assert set(state.instances) == {"i1"}


def test_a_measurement_for_a_known_instance_sets_measured_bytes_and_others_are_ignored() -> None:
    p = ResidencyProjection()
    state = fold(p, [rec(1, started("i1")), rec(2, measured("qwen", None, 900 * MiB)),
                     rec(3, measured("qwen", "gone", 900 * MiB))])
    assert state.instances["i1"].measured_bytes is None
    assert _resident_bytes(state, "i1") == 500 * MiB
    state = fold(p, [rec(4, measured("qwen", "i1", 520 * MiB))], state)
    assert state.instances["i1"].measured_bytes == 520 * MiB
    assert _resident_bytes(state, "i1") == 520 * MiB
    state = fold(p, [rec(5, measured("qwen", "i1", 100 * MiB))], state)
    assert _resident_bytes(state, "i1") == 500 * MiB  # the plan, when the engine used less


def _resident_bytes(state: ResidencyState, instance_id: str) -> int:
    inst = instance(state, instance_id)
    assert inst is not None
    return inst.resident_bytes


def test_refusals_are_counted_per_model_with_the_last_reason() -> None:
    state = fold(ResidencyProjection(), [
        rec(1, InstanceLoadRefused(model="big", reason="does_not_fit", detail="needs 90 GiB")),
        rec(2, InstanceLoadRefused(model="big", reason="no_room", detail="all busy")),
        rec(3, InstanceLoadRefused(model="tiny", reason="no_engine", detail="blazar engine install")),
    ])
    assert state.models["big"].refusals == 2
    assert state.models["big"].last_refusal == LastRefusal(reason="no_room", detail="all busy", ts=1002.0, seq=2)
    assert state.models["tiny"].refusals == 1
    assert state.instances == {}


def test_a_circuit_opens_until_its_time_and_a_reset_closes_it_and_forgives_the_crashes() -> None:
    p = ResidencyProjection()
    state = fold(p, [
        rec(1, exited("a", "crashed"), ts=100.0),
        rec(2, exited("b", "crashed"), ts=110.0),
        rec(3, exited("c", "load_failed"), ts=120.0),
        rec(4, ModelCircuitOpened(model="qwen", crashes=3, window_s=60.0, open_until=420.0, last_exit_code=-6),
            ts=120.0),
    ])
    assert state.models["qwen"].circuit == Circuit(model="qwen", open_until=420.0, crashes=3, seq=4)
    typed = state
    assert circuit(typed, "qwen", 419.9) == Circuit(model="qwen", open_until=420.0, crashes=3, seq=4)
    assert circuit(typed, "qwen", 420.0) is None  # expired by itself
    assert circuit(typed, "never-loaded", 0.0) is None
    assert crashes_within(typed, "qwen", 120.0, 60.0) == 3
    assert crashes_within(typed, "qwen", 165.0, 60.0) == 2  # the one at 100 is out of the window
    assert crashes_within(typed, "never-loaded", 120.0, 60.0) == 0
    typed = fold(p, [rec(5, ModelCircuitReset(model="qwen"), ts=130.0)], state)
    assert circuit(typed, "qwen", 130.0) is None
    assert crashes_within(typed, "qwen", 130.0, 60.0) == 0


def test_instances_and_instances_of_list_them_in_start_order() -> None:
    state = fold(ResidencyProjection(), [
        rec(1, started("z", model="qwen")), rec(2, started("a", model="gemma")), rec(3, started("m", model="qwen")),
        rec(4, exited("a", "stopped", model="gemma")), rec(5, started("b", model="gemma")),
    ])
    assert [i.instance_id for i in instances(state)] == ["z", "m", "b"]
    assert [i.instance_id for i in instances_of(state, "qwen")] == ["z", "m"]
    assert instances_of(state, "llama") == []


def test_the_projection_ignores_unknown_instances_without_failing() -> None:
    state = fold(ResidencyProjection(), [
        rec(1, InstanceReady(instance_id="ghost", model="qwen", load_ms=1)),
        rec(2, InstanceEvicted(instance_id="ghost", model="qwen", reason="idle")),
        rec(3, exited("ghost", "lost")),
    ])
    last_exit = state.models["qwen"].last_exit
    assert state.instances == {} and last_exit is not None and last_exit.reason == "lost"


def _history() -> list[Recorded]:
    return [
        rec(1, started("i1")),
        rec(2, InstanceReady(instance_id="i1", model="qwen", load_ms=800)),
        rec(3, measured("qwen", "i1", 510 * MiB)),
        rec(4, started("i2", model="gemma", tag="b2", keep_alive_s=None)),
        rec(5, exited("i2", "load_failed", model="gemma", code=-4)),
        rec(6, InstanceLoadRefused(model="gemma", reason="circuit_open", detail="open")),
        rec(7, ModelCircuitOpened(model="gemma", crashes=1, window_s=60.0, open_until=2000.0)),
        rec(8, InstanceKeepAliveSet(instance_id="i1", model="qwen", keep_alive_s=60.0, pinned=False)),
        rec(9, InstanceEvicted(instance_id="i1", model="qwen", reason="idle", idle_s=61.0)),
        rec(10, exited("i1", "evicted", code=0)),
        rec(11, ModelCircuitReset(model="gemma")),
        rec(12, started("i3", model="gemma", tag="b2")),
    ]


def test_replay_equals_incremental_folding_through_json_checkpoints() -> None:
    p = ResidencyProjection()
    events = _history()
    full = fold(p, events)
    state = p.initial()
    for r in events:
        # Each step resumes from what a checkpoint stores: the state's JSON, loaded back.
        state = fold(p, [r], through_checkpoint(p, state))
    assert state_bytes(p, state) == state_bytes(p, full)
    assert set(full.instances) == {"i3"} and engine_tags_in_use(full) == {"b2"}
    assert full.models["qwen"].loads == 1 and full.models["gemma"].loads == 2


def test_residency_is_among_all_projections() -> None:
    assert "residency" in [p.name for p in all_projections()]


async def test_runner_resumes_residency_from_a_checkpoint_to_the_same_state(log: EventLog, clock: FakeClock) -> None:
    events = [r.event for r in _history()]
    for ev in events[:6]:
        clock.advance(1.0)
        await log.append(ev, actor="daemon")
    first = ProjectionRunner(log, [ResidencyProjection()])
    await first.start()
    await first.checkpoint()
    for ev in events[6:]:
        clock.advance(1.0)
        await log.append(ev, actor="daemon")
    resumed = ProjectionRunner(log, [ResidencyProjection()])
    await resumed.start()
    assert resumed.status()[0].origin == "checkpoint at 6" and resumed.folded_at_start == 6
    rebuilt = ProjectionRunner(log, [ResidencyProjection()])
    await rebuilt.start(use_checkpoints=False)
    assert resumed.state_bytes("residency") == rebuilt.state_bytes("residency")
    assert set(rebuilt.state("residency").instances) == {"i3"}


def starting(iid: str, model: str = "qwen", tag: str = "b1") -> InstanceStarting:
    fields = started(iid, model, tag).model_dump(exclude={"pid"})
    return InstanceStarting(**fields)


def test_the_intent_opens_the_instance_without_a_pid_and_the_spawn_fills_it_in() -> None:
    state = fold(ResidencyProjection(), [rec(1, starting("a1"))])
    inst = state.instances["a1"]
    assert inst.pid is None and inst.state == "starting" and inst.planned_bytes == 500 * MiB
    assert engine_tags_in_use(state) == {"b1"} and state.models["qwen"].loads == 1
    state = fold(ResidencyProjection(), [rec(1, starting("a1")), rec(2, started("a1"))])
    inst = state.instances["a1"]
    assert inst.pid == 4242 and inst.started_seq == 1 and inst.spawned_seq == 2
    # The spawn is the same load: counted once.
    assert list(state.instances) == ["a1"] and state.models["qwen"].loads == 1


def test_an_intent_whose_spawn_failed_is_closed_by_its_exit_and_is_not_a_crash() -> None:
    state = fold(ResidencyProjection(), [rec(1, starting("a1")), rec(2, exited("a1", "spawn_failed"))])
    last_exit = state.models["qwen"].last_exit
    assert state.instances == {} and state.models["qwen"].crashes == []
    assert last_exit is not None and last_exit.reason == "spawn_failed"


def test_a_log_from_before_the_intent_event_still_folds_from_started_alone() -> None:
    state = fold(ResidencyProjection(), [rec(1, started("a1"))])
    assert state.instances["a1"].pid == 4242 and state.models["qwen"].loads == 1


def test_an_instance_keeps_the_posture_it_runs_and_the_profile_that_chose_it() -> None:
    tuned = Posture(spec_type="ngram-simple", cache_type_k="q8_0", cache_type_v="q8_0", flash_attn=True, threads=1)
    state = fold(ResidencyProjection(), [
        rec(1, started("i1", posture=tuned, profile_seq=7)),
        rec(2, started("i2", model="other", profile_stale_seq=9))])
    one, two = sorted(instances(state), key=lambda i: i.instance_id)
    assert (one.posture, one.profile_seq, one.profile_stale_seq) == (tuned, 7, None)
    assert (two.posture, two.profile_seq, two.profile_stale_seq) == (None, None, 9)
    rows = {r.instance_id: r for r in ps_rows(state, now=1100.0)}
    assert rows["i1"].posture_label == "spec=ngram-simple kv=q8_0/q8_0 fa=on t=1"
    assert rows["i1"].to_json()["posture_fields"] == {"spec_type": "ngram-simple", "cache_type_k": "q8_0",
                                                      "cache_type_v": "q8_0", "flash_attn": True, "threads": 1}
    assert rows["i2"].to_json()["posture"] == "defaults" and rows["i2"].to_json()["profile_stale_seq"] == 9
