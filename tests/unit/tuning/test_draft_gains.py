"""The gain `blazar drafts` shows for a draft: its latest measurement over the defaults' measured before it on the
same engine build, machine and context; postures that change more than speculation, or with no baseline, say
nothing."""

from __future__ import annotations

from blazar.events.tuning import BenchRecorded, Machine, Posture, WorkloadResult
from blazar.projections import ProfilesProjection, fold
from blazar.projections.profiles import benches
from blazar.tuning.drafts import last_gains
from tests.support.events import rec

MACHINE = Machine(fingerprint="f" * 16, cpu="cpu", cores=2, memory_bytes=1 << 30)


def _bench(bench_id: str, posture: Posture, tps: dict[str, float], *, tag: str = "build-1",
           ctx: int = 4096) -> BenchRecorded:
    results = [WorkloadResult(workload=w, concurrency=1, requests=1, prompt_tokens=10, completion_tokens=20,
                              prefill_tps=100.0, decode_tps_stream=x, decode_tps_system=x, ttft_ms_p50=5.0,
                              ttft_ms_p95=6.0) for w, x in tps.items()]
    return BenchRecorded(bench_id=bench_id, model="big", posture=posture, engine_tag=tag, machine=MACHINE, ctx=ctx,
                         results=results, duration_s=1.0, purpose="tune")


def _draft(name: str, **more: object) -> Posture:
    return Posture(spec_type="draft-simple", draft_model=name, **more)


def _gains(*events: BenchRecorded) -> dict[str, tuple[float, str]]:
    state = fold(ProfilesProjection(), [rec(i, e) for i, e in enumerate(events, 1)])
    return {name: (round(g.ratio, 3), g.bench_id) for name, g in last_gains(benches(state, "big")).items()}


def test_gain_is_the_mean_ratio_to_the_defaults_measured_before_it() -> None:
    got = _gains(_bench("base", Posture(), {"chat": 50.0, "code": 40.0}),
                 _bench("d1", _draft("small"), {"chat": 60.0, "code": 60.0}))
    assert got == {"small": (1.35, "d1")}  # (1.2 + 1.5) / 2


def test_the_latest_measurement_wins_against_its_own_baseline() -> None:
    got = _gains(_bench("base1", Posture(), {"code": 50.0}), _bench("d1", _draft("small"), {"code": 100.0}),
                 _bench("base2", Posture(), {"code": 80.0}), _bench("d2", _draft("small"), {"code": 40.0}))
    assert got == {"small": (0.5, "d2")}


def test_no_gain_without_a_comparable_baseline_or_with_other_levers() -> None:
    got = _gains(_bench("base", Posture(), {"code": 50.0}, tag="build-0"),  # another engine build
                 _bench("d1", _draft("small"), {"code": 60.0}),
                 _bench("base-ctx", Posture(), {"code": 50.0}, ctx=2048),  # another context
                 _bench("d2", _draft("other"), {"code": 60.0}),
                 _bench("base", Posture(), {"code": 50.0}),
                 _bench("d3", _draft("mixed", threads=1), {"code": 90.0}),  # measured with another lever
                 _bench("ngram", Posture(spec_type="ngram-simple"), {"code": 90.0}))  # no draft model
    assert got == {}
