"""The engine gate's decisions (blazar/tuning/gate_rules.py: which models, in what order, pass or fail) and its shell
(blazar/tuning/gate.py) with a fake measurement over stand-in engines: the event it records, the refusal, --force,
the setting. Against the real llama-server: tests/integration/test_engine_gate.py."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from blazar.config_schema import Engine
from blazar.context import Blazar
from blazar.errors import EngineRefused
from blazar.events.engines import EngineActivated
from blazar.events.instances import InstanceStarted
from blazar.events.models import ModelImported, ModelMetadata
from blazar.events.requests import RequestCompleted, RequestReceived, RequestRejected
from blazar.events.system import ConfigChanged
from blazar.events.tuning import BenchRecorded, Machine, Posture, WorkloadResult
from blazar.store.engines import install_engine
from blazar.tuning.gate import check_engine, gate_selection
from blazar.tuning.gate_rules import Run, compare, decide, schedule, select_models, table
from tests.support.engine_store import events, stand_in

# -- which models ----------------------------------------------------------------------------------------------------

STORE = {"gemma", "qwen", "llama", "phi"}


def test_the_setting_wins_then_pinned_then_the_most_requested() -> None:
    counts = {"qwen": 9, "llama": 30, "phi": 9}
    s = select_models(configured=["phi"], pinned=["gemma"], requests=counts, servable=STORE)
    assert (s.models, s.source) == (("phi",), "setting")
    s = select_models(configured=[], pinned=["gemma", "gemma", "qwen", "llama"], requests=counts, servable=STORE)
    assert (s.models, s.source) == (("gemma", "qwen"), "pinned")  # at most two, each once
    s = select_models(configured=[], pinned=[], requests=counts, servable=STORE)
    assert (s.models, s.source) == (("llama", "phi"), "requests")  # most first; a tie goes by name


def test_models_not_in_the_store_are_skipped_and_said() -> None:
    s = select_models(configured=["gone", "gemma"], pinned=[], requests={}, servable=STORE)
    assert s.models == ("gemma",) and "gone" in s.note
    s = select_models(configured=["gone"], pinned=["whisper"], requests={"old": 5, "qwen": 0}, servable=STORE)
    assert (s.models, s.source) == ((), "none")
    assert "gone" in s.note and "nothing to compare, so the gate passes" in s.note


def test_nothing_pinned_or_requested_selects_none() -> None:
    s = select_models(configured=[], pinned=[], requests={}, servable=STORE)
    assert s == select_models(configured=[], pinned=[], requests={"gemma": 0}, servable=STORE)
    assert s.models == () and s.note.startswith("no model is pinned or has been requested")


def test_the_setting_names_at_most_two_models() -> None:
    assert Engine(engine_gate_models=[" gemma ", ""]).engine_gate_models == ["gemma"]
    with pytest.raises(ValueError, match="at most 2"):
        Engine(engine_gate_models=["a", "b", "c"])


def _import(*names: str) -> list[ModelImported]:
    return [ModelImported(name=n, path=f"{n}.gguf", source="/src", bytes=1, sha256="ab" * 32, linked=True,
                          metadata=ModelMetadata(architecture="gemma3")) for n in names]


def _loaded(iid: str, model: str, *, pinned: bool = False, keep_alive_s: float | None = 300.0) -> InstanceStarted:
    return InstanceStarted(instance_id=iid, model=model, engine_tag="old", pid=4242, port=40001, argv=["x"],
                           log_path=f"instances/{iid}.log", ctx_tokens=512, engine_ctx=512, slots=1,
                           planned_bytes=1, estimate_bytes=1, keep_alive_s=keep_alive_s, pinned=pinned)


async def _requests(app: Blazar, model: str, n: int, *, status: int = 200) -> None:
    for i in range(n):
        trace = f"{model}-{status}-{i}"
        done = (RequestCompleted(trace_id=trace, model=model, duration_ms=1.0) if status == 200 else
                RequestRejected(trace_id=trace, model=model, status=status, reason="queue_full", detail="full"))
        await app.record([RequestReceived(trace_id=trace, dialect="openai", route="/v1/chat/completions",
                                          model=model), done])


async def test_the_selection_reads_loaded_pins_and_completed_requests_from_the_log(app: Blazar) -> None:
    await app.record(_import("gemma", "qwen", "phi", "llama"))
    await _requests(app, "qwen", 3)
    await _requests(app, "phi", 1)
    await _requests(app, "llama", 5, status=429)  # refusals are not completed requests
    s = gate_selection(app)
    assert (s.models, s.source) == (("qwen", "phi"), "requests")
    await app.record([_loaded("i1", "gemma", keep_alive_s=None), _loaded("i2", "phi", pinned=True),
                      _loaded("i3", "llama")])
    s = gate_selection(app)
    assert (s.models, s.source) == (("gemma", "phi"), "pinned")
    await app.record(ConfigChanged(key="engine_gate_models", new=["llama"]))
    assert gate_selection(app).models == ("llama",)


# -- the order and the verdict ---------------------------------------------------------------------------------------


def test_the_builds_alternate_and_each_round_swaps_who_goes_first() -> None:
    assert schedule(3) == ["active", "candidate", "candidate", "active", "active", "candidate"]
    assert schedule(2).count("active") == schedule(2).count("candidate") == 2


def test_compare_takes_each_builds_median_and_names_the_median_run() -> None:
    m = compare("gemma", [Run(100, "a1"), Run(10, "a2"), Run(90, "a3")], [Run(80, "c1"), Run(85, "c2"), Run(5, "c3")])
    assert (m.active_decode_tps, m.candidate_decode_tps, m.ratio) == (90, 80, 0.8889)
    assert (m.active_bench_id, m.candidate_bench_id) == ("a3", "c1")


def test_more_than_the_threshold_slower_fails_and_within_it_passes() -> None:
    slow = compare("gemma", [Run(100)], [Run(94)])
    ok = compare("qwen", [Run(100)], [Run(95.5)])
    faster = compare("phi", [Run(100)], [Run(130)])
    passed, detail = decide([ok, slow, faster], 0.05)
    assert not passed and "gemma decodes 6% slower (94.0 vs 100.0 t/s): more than 5%" in detail
    assert "qwen" not in detail
    assert decide([ok, faster], 0.05) == (True, "within 5% of the active build on qwen, phi")
    assert decide([slow], 0.10)[0] and decide([], 0.05) == (True, "")


def test_the_table_has_each_models_numbers() -> None:
    lines = table([compare("gemma", [Run(52.25)], [Run(21.0)])])
    assert lines[0].split() == ["model", "active", "t/s", "candidate", "t/s", "ratio"]
    assert lines[1].split() == ["gemma", "52.2", "21.0", "0.40"]


# -- the shell, with a fake measurement ------------------------------------------------------------------------------

MACHINE = Machine(fingerprint="f" * 16, cpu="test", cores=2, memory_bytes=1 << 30)


class FakeMeasure:
    """Decode rates by engine tag; records each call (the real one is blazar.tuning.measure)."""

    def __init__(self, rates: dict[str, float]) -> None:
        self.rates = rates
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        self.ids = itertools.count(1)

    async def __call__(self, app: Blazar, model: str, posture: Posture, **kw: Any) -> BenchRecorded:
        tag = kw["engine"].tag
        self.calls.append((model, tag, kw))
        tps = self.rates[tag]
        result = WorkloadResult(workload="chat", concurrency=1, requests=2, prompt_tokens=10, completion_tokens=20,
                                prefill_tps=None, decode_tps_stream=tps, decode_tps_system=tps, ttft_ms_p50=1,
                                ttft_ms_p95=1)
        return BenchRecorded(bench_id=f"b{next(self.ids)}", model=model, posture=posture, engine_tag=tag,
                             machine=MACHINE, ctx=512, results=[result], duration_s=0.1, purpose="gate")


async def _two_engines(app: Blazar, tmp_path: Path, *models: str) -> None:
    for tag in ("old", "new"):
        await install_engine(app, source="path", path=stand_in(tmp_path / tag, "exit 0", note=tag), tag=tag,
                             activate=False)
    await app.record(EngineActivated(tag="old", reason="install"))
    await app.record([ModelImported(name=n, path=f"{n}.gguf", source="/src", bytes=1, sha256="ab" * 32, linked=True,
                                    metadata=ModelMetadata(architecture="gemma3")) for n in models])
    await app.record(ConfigChanged(key="engine_gate_models", new=list(models)))


async def test_a_slower_build_is_refused_with_its_numbers_and_recorded(app: Blazar, tmp_path: Path) -> None:
    await _two_engines(app, tmp_path, "gemma")
    fake = FakeMeasure({"old": 50.0, "new": 30.0})
    with pytest.raises(EngineRefused) as exc:
        await check_engine(app, "new", measure=fake, runs=2)
    assert exc.value.reason == "gate_failed" and exc.value.exit_code == 6
    assert "the active engine stays old" in exc.value.message and "--force" in exc.value.message
    assert ["gemma", "50.0", "30.0", "0.60"] in [line.split() for line in exc.value.message.splitlines()]
    assert [tag for _m, tag, _kw in fake.calls] == ["old", "new", "new", "old"]
    _m, _t, kw = fake.calls[0]
    assert (kw["purpose"], kw["workloads"], kw["concurrency"]) == ("gate", ("chat",), (1,))
    (rec,) = await events(app, "engine.gate_checked")
    ev = rec.event
    assert (ev.candidate_tag, ev.active_tag, ev.passed, ev.forced, ev.threshold) == ("new", "old", False, False, 0.05)
    (m,) = ev.models
    assert (m.model, m.active_decode_tps, m.candidate_decode_tps, m.ratio) == ("gemma", 50.0, 30.0, 0.6)
    assert rec.seq == exc.value.seq


async def test_force_passes_a_failing_build_and_says_so(app: Blazar, tmp_path: Path) -> None:
    await _two_engines(app, tmp_path, "gemma")
    lines: list[str] = []
    seq = await check_engine(app, "new", measure=FakeMeasure({"old": 50.0, "new": 30.0}), runs=1, force=True,
                             progress=lines.append)
    (rec,) = await events(app, "engine.gate_checked")
    assert rec.seq == seq and (rec.event.passed, rec.event.forced) == (False, True)
    assert any("anyway (--force)" in line for line in lines)
    assert any(line.split() == ["gemma", "50.0", "30.0", "0.60"] for line in lines)


async def test_a_build_as_fast_passes_and_the_threshold_is_a_setting(app: Blazar, tmp_path: Path) -> None:
    await _two_engines(app, tmp_path, "gemma", "qwen")
    fake = FakeMeasure({"old": 50.0, "new": 49.0})
    assert await check_engine(app, "new", measure=fake, runs=1) is not None
    assert sorted({m for m, _t, _kw in fake.calls}) == ["gemma", "qwen"]
    await app.record(ConfigChanged(key="engine_gate_threshold", new=0.5))
    assert await check_engine(app, "new", measure=FakeMeasure({"old": 50.0, "new": 30.0}), runs=1) is not None
    verdicts = [(r.event.passed, r.event.threshold) for r in await events(app, "engine.gate_checked")]
    assert verdicts == [(True, 0.05), (True, 0.5)]


async def test_no_models_passes_with_a_note_and_the_gate_can_be_turned_off(app: Blazar, tmp_path: Path) -> None:
    await _two_engines(app, tmp_path)
    fake = FakeMeasure({})
    assert await check_engine(app, "new", measure=fake) is not None and fake.calls == []
    (rec,) = await events(app, "engine.gate_checked")
    assert rec.event.passed and rec.event.models == [] and "nothing to compare" in rec.event.detail
    await app.record(ConfigChanged(key="engine_gate", new=False))
    lines: list[str] = []
    assert await check_engine(app, "new", measure=fake, progress=lines.append) is None
    assert len(await events(app, "engine.gate_checked")) == 1 and "engine_gate = false" in lines[0]


async def test_no_active_engine_means_no_gate(app: Blazar, tmp_path: Path) -> None:
    await install_engine(app, source="path", path=stand_in(tmp_path / "s", "exit 0"), tag="first", activate=False)
    assert await check_engine(app, "first", measure=FakeMeasure({})) is None
    assert await events(app, "engine.gate_checked") == []
    assert app.runner.state("engines").active is None
