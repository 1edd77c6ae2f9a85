"""The arithmetic and parsing under `blazar bench`: /metrics text, energy counters (RAPL with a wrap, NVML), the
machine's fingerprint, the shipped workloads' shapes, percentiles, a round's summary, and bad input. Timings of a
real engine are the integration test's (tests/integration/test_bench.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import typer

from blazar.adapters.energy import EnergyMeter, Nvml, Rapl, Reading
from blazar.adapters.machine import cpu_model, fingerprint, this_machine
from blazar.cli.bench_cmds import parse_concurrency, parse_workloads
from blazar.errors import ModelNotFound, WrongModelKind
from blazar.events.models import ModelImported, ModelMetadata
from blazar.projections import CatalogProjection, fold
from blazar.tuning.child import _failure, parse_metrics, resolve_model
from blazar.tuning.measure import DRAFTED, Outcome, check_concurrency, plan_rounds, summarise
from blazar.tuning.stats import mean, percentile, rate
from blazar.tuning.workloads import WORKLOADS, workload
from tests.support.events import rec

# -- /metrics -------------------------------------------------------------------------------------------------------

METRICS = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 49
llamacpp:tokens_predicted_seconds_total 0.670363
llamacpp:spec_decode_num_draft_tokens_total 20
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 1
llamacpp:requests_processing 0
llamacpp:odd_value NaNish

llamacpp:big 1.5e3
"""


def test_metrics_text_parses_to_series_values_with_labels_kept_and_odd_lines_skipped() -> None:
    got = parse_metrics(METRICS)
    assert got["llamacpp:prompt_tokens_total"] == 49.0
    assert got["llamacpp:tokens_predicted_seconds_total"] == pytest.approx(0.670363)
    assert got['llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"}'] == 1.0
    assert got["llamacpp:big"] == 1500.0
    assert "llamacpp:odd_value" not in got
    assert not any(k.startswith("#") for k in got)


# -- energy ---------------------------------------------------------------------------------------------------------


def _zone(root: Path, name: str, energy: int, max_range: int) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "energy_uj").write_text(f"{energy}\n")
    (d / "max_energy_range_uj").write_text(f"{max_range}\n")
    return d


def test_rapl_sums_packages_not_their_subzones_and_undoes_a_counter_wrap(tmp_path: Path) -> None:
    p0 = _zone(tmp_path, "intel-rapl:0", 1_000_000, 10_000_000)
    _zone(tmp_path, "intel-rapl:0:0", 500, 10_000_000)  # the package's core: already in its count
    p1 = _zone(tmp_path, "intel-rapl:1", 9_500_000, 10_000_000)
    rapl = Rapl(tmp_path)
    assert [z.name for z in rapl.zones] == ["intel-rapl:0", "intel-rapl:1"]
    before = rapl.read()
    (p0 / "energy_uj").write_text("3000000\n")  # +2 J
    (p1 / "energy_uj").write_text("500000\n")  # wrapped: +0.5 J to the top, +0.5 J after
    after = rapl.read()
    assert rapl.joules(before, after) == pytest.approx(3.0)


def test_rapl_unreadable_or_absent_measures_nothing_and_says_why(tmp_path: Path) -> None:
    absent = Rapl(tmp_path / "none")
    assert absent.zones == [] and "no " in (absent.why_not or "")
    d = tmp_path / "intel-rapl:0"
    d.mkdir()
    (d / "max_energy_range_uj").write_text("100\n")  # energy_uj missing: as if root-only
    unreadable = Rapl(tmp_path)
    assert unreadable.zones == [] and "energy_uj" in (unreadable.why_not or "")
    meter = EnergyMeter(rapl=unreadable, nvml=Nvml(_FakeNvml(count=0)))
    assert meter.joules(meter.read(), meter.read()) is None
    assert meter.describe().startswith("not reported here")


class _FakeNvml:
    def __init__(self, count: int, fail: bool = False) -> None:
        self.count, self.fail, self.mj = count, fail, 1000

    def nvmlInit(self) -> None:
        if self.fail:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlDeviceGetCount(self) -> int:
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetTotalEnergyConsumption(self, h: int) -> int:
        return self.mj + h


def test_nvml_energy_is_the_sum_of_each_gpus_millijoule_counter(tmp_path: Path) -> None:
    fake = _FakeNvml(count=2)
    meter = EnergyMeter(rapl=Rapl(tmp_path / "none"), nvml=Nvml(fake))
    before = meter.read()
    fake.mj += 2500  # 2.5 J per GPU
    after = meter.read()
    assert meter.joules(before, after) == pytest.approx(5.0)
    assert meter.describe() == "NVML (2 GPUs)"
    broken = Nvml(_FakeNvml(count=1, fail=True))
    assert broken.gpus == [] and "NVML Shared Library" in (broken.why_not or "")


def test_energy_meter_adds_cpu_packages_and_gpus(tmp_path: Path) -> None:
    p0 = _zone(tmp_path, "intel-rapl:0", 0, 10**9)
    fake = _FakeNvml(count=1)
    meter = EnergyMeter(rapl=Rapl(tmp_path), nvml=Nvml(fake))
    before = meter.read()
    (p0 / "energy_uj").write_text("4000000\n")  # 4 J of CPU package
    fake.mj += 1000  # 1 J of GPU
    assert meter.joules(before, meter.read()) == pytest.approx(5.0)
    assert meter.describe() == "RAPL (1 package) + NVML (1 GPU)"
    assert meter.joules(Reading(), Reading()) is None  # nothing read either time


# -- the machine ----------------------------------------------------------------------------------------------------


def test_machine_fingerprint_is_stable_and_changes_with_any_field(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Test CPU 9000\n\nprocessor\t: 1\nmodel name\t: Test CPU 9000\n")
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       1024 kB\nMemAvailable:    512 kB\n")
    m = this_machine(cpuinfo=cpuinfo, meminfo=meminfo, cores=lambda: 2, gpus=lambda: ["GPU A"])
    assert (m.cpu, m.cores, m.memory_bytes, m.gpus) == ("Test CPU 9000", 2, 1024 * 1024, ["GPU A"])
    assert m.fingerprint == fingerprint("Test CPU 9000", 2, 1024 * 1024, ["GPU A"])
    assert len(m.fingerprint) == 16 and int(m.fingerprint, 16) >= 0
    others = {fingerprint("Test CPU 9000", 4, 1024 * 1024, ["GPU A"]), fingerprint("Other", 2, 1024 * 1024, ["GPU A"]),
              fingerprint("Test CPU 9000", 2, 2048 * 1024, ["GPU A"]), fingerprint("Test CPU 9000", 2, 1024 * 1024, [])}
    assert m.fingerprint not in others and len(others) == 4


def test_cpu_model_falls_back_to_arms_lines_and_unknown(tmp_path: Path) -> None:
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nCPU part\t: 0xd0c\nHardware\t: Board X\n")
    assert cpu_model(arm) == "Board X"
    assert cpu_model(tmp_path / "missing") == "unknown"


# -- workloads ------------------------------------------------------------------------------------------------------


def test_the_shipped_workloads_are_fixed_greedy_streamed_requests_of_their_shapes() -> None:
    assert WORKLOADS == ("chat", "code", "long")
    chat, code, long = (workload(w) for w in WORKLOADS)
    for w in (chat, code, long):
        assert len(w.requests) >= 2
        for r in w.requests:
            body = r.body(model="m")
            assert body["stream"] is True and body["temperature"] == 0.0 and body["cache_prompt"] is False
            assert r.body(model="m", max_tokens=4)["max_tokens"] == min(4, r.max_tokens)
            assert r.body(model="m", max_tokens=10_000)["max_tokens"] == r.max_tokens  # a cap, never a raise
    assert all(r.path == "/v1/chat/completions" and r.messages[-1][0] == "user" for r in chat.requests)
    assert any(len(r.messages) > 1 for r in chat.requests)  # multi-turn
    for r in code.requests:  # the file, then the edited file's first lines: the continuation is the file again
        assert r.path == "/v1/completions" and r.prompt is not None
        before, _, after = r.prompt.partition("(after:")
        assert 60 <= before.count("\n") <= 110 and "class Inventory" in before
        head = after.split("```python\n", 1)[1]
        assert head.strip() and head.strip() in before
    for r in long.requests:
        assert r.prompt is not None and r.prompt.endswith("Answer:") and r.max_tokens <= 32
        assert len(r.prompt) > 10 * max(len(c) for q in chat.requests for _, c in q.messages)
    assert workload("code").requests == code.requests  # deterministic: built once, the same every time
    with pytest.raises(ValueError, match="unknown workload"):
        workload("poetry")


# -- arithmetic -----------------------------------------------------------------------------------------------------


def test_percentiles_interpolate_between_ranks() -> None:
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([10], 95) == 10
    assert percentile([4, 1, 3, 2], 0) == 1 and percentile([4, 1, 3, 2], 100) == 4
    assert percentile(list(range(1, 21)), 95) == pytest.approx(19.05)
    assert percentile([5, 1], 95) >= percentile([5, 1], 50)
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1], 101)
    assert mean([]) is None and mean([1, 2]) == 1.5
    assert rate(10, 0) is None and rate(10, 2) == 5


def _out(ttft: float, predicted_n: int = 10, predicted_ms: float = 500.0) -> Outcome:
    return Outcome(ttft_ms=ttft, prompt_tokens=100, completion_tokens=predicted_n, prompt_n=100, prompt_ms=200.0,
                   predicted_n=predicted_n, predicted_ms=predicted_ms)


def test_a_rounds_summary_from_engine_timings_wall_time_and_metric_deltas() -> None:
    outs = [_out(100), _out(300, predicted_n=20, predicted_ms=500.0), _out(200, predicted_n=1, predicted_ms=1.0)]
    r = summarise("code", 2, outs, wall_s=2.0, before={DRAFTED: 10.0}, after={DRAFTED: 50.0,
                  "llamacpp:spec_decode_num_accepted_tokens_total": 30.0}, energy_j=None, speculative=True)
    assert (r.requests, r.prompt_tokens, r.completion_tokens) == (3, 300, 31)
    assert r.prefill_tps == pytest.approx(500.0)  # 300 tokens over 0.6 s of prompt processing
    assert r.decode_tps_stream == pytest.approx(30.0)  # (20 + 40) / 2: the one-token request has no decode phase
    assert r.decode_tps_system == pytest.approx(15.5)  # 31 tokens over 2 s of wall time
    assert r.ttft_ms_p50 == 200 and r.ttft_ms_p95 == pytest.approx(290) and r.ttft_ms_p95 >= r.ttft_ms_p50
    assert (r.draft_tokens, r.accepted_tokens) == (40, 30)
    plain = summarise("chat", 1, outs[:1], wall_s=1.0, before={}, after={DRAFTED: 0.0}, energy_j=2.0,
                      speculative=False)
    assert plain.draft_tokens is None and plain.energy_j == 2.0 and plain.tokens_per_joule == 5.0


def test_rounds_cycle_a_workloads_requests_until_every_stream_has_one() -> None:
    rounds = plan_rounds(["chat", "long"], (1, 4), requests=1)
    assert [(w, c, len(r)) for w, c, r in rounds] == [("chat", 1, 1), ("chat", 4, 4), ("long", 1, 1), ("long", 4, 4)]
    full = plan_rounds(["code"], (2,))
    assert len(full[0][2]) == len(workload("code").requests)
    assert check_concurrency([1, 4, 1]) == (1, 4)
    for bad in ([], [0], [65]):
        with pytest.raises(ValueError):
            check_concurrency(bad)


def test_cli_options_refuse_bad_concurrency_and_workloads() -> None:
    assert parse_concurrency("1,4") == (1, 4)
    assert parse_workloads("all") == WORKLOADS and parse_workloads("code,chat") == ("code", "chat")
    for bad in ("0", "1,x", "", "1;2", "100"):
        with pytest.raises(typer.BadParameter):
            parse_concurrency(bad)
    for bad in ("poetry", "", "chat,poetry"):
        with pytest.raises(typer.BadParameter):
            parse_workloads(bad)


# -- the child ------------------------------------------------------------------------------------------------------


def _app(*events: ModelImported) -> Any:
    state = fold(CatalogProjection(), [rec(i + 1, e) for i, e in enumerate(events)])
    return SimpleNamespace(runner=SimpleNamespace(state=lambda name: state))


def test_only_llama_server_models_in_the_store_are_measured() -> None:
    gguf = ModelImported(name="gemma", path="gemma.gguf", source="/src/g.gguf", bytes=1, sha256="ab" * 32,
                         linked=True, metadata=ModelMetadata(architecture="gemma3"))
    whisper = ModelImported(name="whisper-base", path="whisper-base/model.bin", source="/src/w", bytes=1,
                            sha256="cd" * 32, linked=True, kind="whisper",
                            metadata=ModelMetadata(architecture="whisper"))
    app = _app(gguf, whisper)
    assert resolve_model(app, "gemma").name == "gemma"
    with pytest.raises(WrongModelKind, match="whisper model"):
        resolve_model(app, "whisper-base")
    with pytest.raises(ModelNotFound):
        resolve_model(app, "nope")


def test_a_failed_childs_message_keeps_the_engines_reason_not_the_debuggers_backtrace(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_text("I load_model: loading model 'm.gguf'\n"
                   "llama-context.cpp:2275: GGML_ASSERT(n_outputs_max <= cparams.n_outputs_max) failed\n"
                   "[New LWP 27984]\nUsing host libthread_db library \"/lib/libthread_db.so.1\".\n"
                   "0x00007ff59a8f1c17 in __GI___wait4 (pid=27995) at wait4.c:30\n30\twait4.c: No such file.\n"
                   "#0  0x000055d5 in ggml_abort ()\n#1  0x000055d6 in llama_server ()\n"
                   "[Inferior 1 (process 27982) detached]\n")
    msg = _failure("gemma was killed by SIGABRT while loading", log)
    assert "GGML_ASSERT" in msg and "loading model" in msg
    assert "#0" not in msg and "LWP" not in msg and "wait4" not in msg
    assert _failure("x", tmp_path / "absent").endswith("(the engine wrote nothing)")
