"""The profiles projection fed events: benchmarks in log order, the adopted profile (the latest adoption wins, a
reset clears it), a profile stale on another engine build or machine, and a node's runner folding its own node's."""

from __future__ import annotations

import pytest

from blazar.context import Blazar
from blazar.errors import ModelNotFound
from blazar.events.log import EventLog
from blazar.events.models import ModelImported, ModelMetadata
from blazar.events.tuning import BenchRecorded, Machine, Posture, ProfileAdopted, ProfileReset, WorkloadResult
from blazar.instances.posture_choice import PostureChoice, choose_posture
from blazar.instances.spawn import draft_file
from blazar.projections import ProfilesProjection, all_projections, fold
from blazar.projections.profiles import bench, benches, last_reset, profile, stale_reason
from blazar.projections.runner import ProjectionRunner
from tests.support.events import rec
from tests.support.states import through_checkpoint

MACHINE = Machine(fingerprint="f" * 16, cpu="cpu", cores=2, memory_bytes=1 << 30)
NGRAM = Posture(spec_type="ngram-simple", cache_type_k="q8_0", cache_type_v="q8_0", flash_attn=True, threads=1)


def bench_ev(model: str, bench_id: str, posture: Posture = Posture(), node: str = "") -> BenchRecorded:
    result = WorkloadResult(workload="code", concurrency=1, requests=2, prompt_tokens=10, completion_tokens=20,
                            prefill_tps=100.0, decode_tps_stream=50.0, decode_tps_system=50.0, ttft_ms_p50=5.0,
                            ttft_ms_p95=6.0)
    return BenchRecorded(bench_id=bench_id, model=model, posture=posture, engine_tag="build-1", machine=MACHINE,
                         ctx=2048, results=[result], duration_s=1.0, node=node)


def adopted(model: str, posture: Posture = NGRAM, tag: str = "build-1", node: str = "") -> ProfileAdopted:
    return ProfileAdopted(model=model, posture=posture, engine_tag=tag, machine=MACHINE, rule="fastest by 10%",
                          bench_id="b2", node=node)


def test_nothing_recorded_means_no_profile_and_no_benches() -> None:
    state = fold(ProfilesProjection(), [])
    assert profile(state, "m") is None and benches(state, "m") == [] and last_reset(state, "m") is None


def test_benches_are_kept_in_log_order_and_found_by_id() -> None:
    state = fold(ProfilesProjection(), [
        rec(1, bench_ev("m", "b1")), rec(2, bench_ev("other", "x")), rec(3, bench_ev("m", "b2", NGRAM))])
    got = benches(state, "m")
    assert [(b.seq, b.bench.bench_id) for b in got] == [(1, "b1"), (3, "b2")]
    assert got[1].bench.posture == NGRAM and got[1].ts == 1003.0
    assert got[1].bench.results[0].decode_tps_stream == 50.0
    found = bench(state, "m", "b2")
    assert found is not None and found.seq == 3
    assert bench(state, "m", "x") is None  # another model's
    assert through_checkpoint(ProfilesProjection(), state) == state


def test_the_latest_adoption_is_the_profile_and_a_reset_clears_it() -> None:
    p = ProfilesProjection()
    state = fold(p, [rec(1, adopted("m", Posture(threads=2))), rec(2, adopted("m"))])
    got = profile(state, "m")
    assert got is not None
    assert (got.posture, got.engine_tag, got.seq, got.rule, got.bench_id, got.candidates) == (
        NGRAM, "build-1", 2, "fastest by 10%", "b2", 0)
    assert got.machine == MACHINE and got.ts == 1002.0
    assert profile(state, "other") is None
    state = fold(p, [rec(3, ProfileReset(model="m", reason="tune --reset"))], state)
    assert profile(state, "m") is None
    reset = last_reset(state, "m")
    assert reset is not None and (reset.seq, reset.reason) == (3, "tune --reset")
    state = fold(p, [rec(4, adopted("m", Posture(threads=3)))], state)  # adopted again after the reset
    again = profile(state, "m")
    assert again is not None and again.posture.threads == 3 and again.seq == 4
    assert through_checkpoint(p, state) == state


def test_a_profile_applies_only_on_its_engine_build_and_machine() -> None:
    got = profile(fold(ProfilesProjection(), [rec(1, adopted("m"))]), "m")
    assert got is not None
    assert stale_reason(got, "build-1") is None
    assert stale_reason(got, "build-1", MACHINE.fingerprint) is None
    assert stale_reason(got, "build-2") == "measured on engine build-1, active is build-2"
    assert stale_reason(got, None) == "measured on engine build-1, active is none"
    assert stale_reason(got, "build-1", "0" * 16) == f"measured on machine {'f' * 16}, this is {'0' * 16}"


async def test_a_nodes_runner_folds_only_its_own_nodes_profiles(log: EventLog) -> None:
    await log.append([adopted("mine", node="a"), adopted("theirs", node="b"), bench_ev("theirs", "bx", node="b"),
                      adopted("old")], actor="test")
    runner = ProjectionRunner(log, all_projections(), node="a")
    await runner.start()
    state = runner.state("profiles")
    assert profile(state, "mine") is not None and profile(state, "old") is not None
    assert profile(state, "theirs") is None and benches(state, "theirs") == []


def test_a_load_takes_the_adopted_posture_only_on_its_engine_build() -> None:
    state = fold(ProfilesProjection(), [rec(1, adopted("m")), rec(2, adopted("d", Posture()))])
    assert choose_posture(profile(state, "m"), "build-1") == PostureChoice(posture=NGRAM, profile_seq=1)
    assert choose_posture(profile(state, "m"), "build-2") == PostureChoice(
        stale_seq=1, stale="measured on engine build-1, active is build-2")
    assert choose_posture(profile(state, "none"), "build-1") == PostureChoice()
    # The defaults adopted: a plain load, with the profile that chose it named.
    assert choose_posture(profile(state, "d"), "build-1") == PostureChoice(profile_seq=2)


async def test_a_postures_draft_model_is_resolved_from_the_store_and_confined_to_it(app: Blazar) -> None:
    await app.record(ModelImported(name="small", path="small.gguf", source="/x", bytes=1, sha256="0" * 64,
                                   linked=True, metadata=ModelMetadata(architecture="gemma3", name="small")))
    await app.runner.catch_up()
    draft = Posture(spec_type="draft-simple", draft_model="small", spec_n_max=4)
    assert draft_file(app, "big", PostureChoice(posture=draft, profile_seq=3)) == app.paths.models / "small.gguf"
    assert draft_file(app, "big", PostureChoice(posture=NGRAM, profile_seq=3)) is None  # self-speculation
    assert draft_file(app, "big", PostureChoice()) is None
    gone = draft.model_copy(update={"draft_model": "removed"})
    with pytest.raises(ModelNotFound, match=r"draft model 'removed' of big's profile.adopted \(seq 3\) is not in"):
        draft_file(app, "big", PostureChoice(posture=gone, profile_seq=3))
