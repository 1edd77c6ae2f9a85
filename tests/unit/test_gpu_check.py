"""scripts/gpu-check's CPU-only parts (bench/gpu_check.py): the architecture it builds for (from a fake NVML), the
5% comparison of the fit's plan with NVML's measure, reading the real JSON shapes of `blazar fit`, `bench`, `tune`
and the overhead bench into rows, the markdown table, and the step runner's deadline (a fake clock, fake steps);
then the script itself in a subprocess: no GPU is exit 2, and --dry-run on a fake H100 names the commands."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from blazar.adapters.gguf_inspect import inspect_gguf
from blazar.adapters.nvml import read_nvml
from blazar.events.tuning import CandidateVerdict, Posture, WorkloadResult
from blazar.fit import Device, FitRequest, plan
from tests.support import gguf_factory
from tests.support.fake_nvml import FakeGpu, FakeNvml

REPO = Path(__file__).resolve().parents[2]
GIB, MIB = 1 << 30, 1 << 20


def _load(name: str) -> ModuleType:
    """A bench script as a module; the bench/ directory it puts first on sys.path is taken off again (its scripts'
    names, fit and log among them, must not shadow anything this process imports later)."""
    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    path = list(sys.path)
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path[:] = path
    return mod


gc = _load("gpu_check")


def test_the_architecture_comes_from_the_gpus_nvml_sees() -> None:
    assert gc.target_arch(read_nvml(FakeNvml([FakeGpu()]))) == "90"
    assert gc.target_arch(read_nvml(FakeNvml([FakeGpu(), FakeGpu(name="NVIDIA L4", cc=(8, 9))]))) == "89,90"
    assert gc.target_arch(read_nvml(FakeNvml([FakeGpu(cc=None)]))) is None


def test_plan_against_measure_within_five_percent() -> None:
    assert gc.Comparison(1000 * MIB, 1049 * MIB).within and gc.Comparison(1000 * MIB, 951 * MIB).within
    over = gc.Comparison(1000 * MIB, 1060 * MIB)
    assert not over.within and over.row().status == "FAIL" and over.row().value == "+6.0%"
    assert "planned 1,000 MiB on the GPU, NVML measured 1,060 MiB" in over.row().detail
    assert not gc.Comparison(0, 5).within  # nothing planned is no plan to hold to


def test_the_fit_json_read_for_gpu_bytes_and_full_offload(tmp_path: Path) -> None:
    gguf_factory.write_plain(tmp_path / "m.gguf")
    meta = inspect_gguf(tmp_path / "m.gguf")
    h100 = Device(kind="cuda", index=0, name="NVIDIA H100", total_bytes=80 * GIB, free_bytes=79 * GIB)
    host = Device(kind="host", name="host memory", total_bytes=64 * GIB, free_bytes=60 * GIB)
    p = plan(meta, [h100, host], FitRequest(ctx=1024, slots=1))
    as_json = json.loads(p.model_dump_json())  # what `blazar fit --json` prints
    cuda = sum(u.total_bytes for u in p.devices if u.key == "cuda:0")
    assert cuda > 0 and gc.plan_gpu_bytes(as_json) == cuda and gc.fully_offloaded(as_json)
    partial = json.loads(plan(meta, [h100, host], FitRequest(ctx=1024, slots=1, gpu_layers=1)).model_dump_json())
    assert not gc.fully_offloaded(partial)
    assert gc.gpu_layers_in(["llama-server", "-m", "x", "-ngl", "4", "--port", "1"]) == 4
    assert gc.gpu_layers_in(["llama-server", "--gpu-layers", "all"]) is None and gc.gpu_layers_in([]) is None


def test_bench_and_tune_json_become_rows() -> None:
    r = WorkloadResult(workload="chat", concurrency=8, requests=8, prompt_tokens=100, completion_tokens=1024,
                       prefill_tps=9000.0, decode_tps_stream=310.5, decode_tps_system=2100.0, ttft_ms_p50=12.0,
                       ttft_ms_p95=20.0)
    (row,) = gc.bench_rows({"results": [r.model_dump(mode="json")]})
    assert (row.step, row.value) == ("bench chat C=8", "2,100.0 t/s") and "TTFT p50 12.0 ms" in row.detail
    base = CandidateVerdict(posture=Posture(), outcome="baseline", decode_tps={"chat": 300.0}, ratio={"chat": 1.0})
    fa_off = CandidateVerdict(posture=Posture(flash_attn=False), outcome="rejected", decode_tps={"chat": 270.0},
                              ratio={"chat": 0.9})
    q8 = CandidateVerdict(posture=Posture(cache_type_k="q8_0", cache_type_v="q8_0", flash_attn=True),
                          outcome="adopted", decode_tps={"chat": 330.0}, ratio={"chat": 1.1})
    pruned = CandidateVerdict(posture=Posture(spec_type="ngram-simple"), outcome="pruned")
    tune = {"winner_label": "kv=q8_0/q8_0 fa=on", "rule": "the fastest that passed its guard",
            "candidates": [v.model_dump(mode="json") for v in (base, fa_off, q8, pruned)]}
    (row,) = gc.tune_rows(tune)
    assert row.status == "pass" and row.value == "kv=q8_0/q8_0 fa=on"
    assert "2 of 3 candidate(s) measured; best cache_type_k=q8_0" in row.detail and "1.10x" in row.detail
    assert gc.tune_rows({**tune, "candidates": [tune["candidates"][0]]})[0].status == "FAIL"


def test_the_overhead_summary_becomes_one_row_per_concurrency() -> None:
    ov = _load("overhead")
    rounds = []
    for c in (1, 8):
        for lane, wall in (("direct", 1.0), ("gateway", 1.005)):
            streams = [ov.Stream(start=0.0, first=0.01, last=0.5, end=0.5, tokens=128) for _ in range(c)]
            rounds.append(ov.Round(lane=lane, concurrency=c, wall_s=wall, streams=streams))
    summary = ov.summarize_engine(rounds, [1, 8], 128, ["direct", "gateway"])
    rows = gc.overhead_rows({"engine": {"summary": summary}})
    assert [r.step for r in rows] == ["overhead C=1", "overhead C=8"]
    assert rows[0].value == "0.995x" and rows[0].status == "pass" and "direct 128.0 t/s" in rows[0].detail


def test_the_table_is_markdown_with_pipes_escaped() -> None:
    text = gc.render([gc.Row("a|b", "pass", "1", "x\ny")], ["title"])
    assert text.splitlines() == ["title", "", "| step | result | value | detail |", "|---|---|---|---|",
                                 "| a\\|b | pass | 1 | x y |"]


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_the_runner_gives_each_step_what_is_left_and_stops_at_the_deadline() -> None:
    clock, limits = Clock(), []

    def taking(seconds: float):
        def run(limit: float) -> list:
            limits.append(limit)
            clock.t += seconds
            return [gc.Row("s", "pass")]
        return run

    steps = [gc.Step("a", 100, taking(50)), gc.Step("b", 500, taking(530)), gc.Step("c", 60, taking(1))]
    rows = gc.Runner(600, clock=clock).run(steps)
    assert limits == [100, 500, 20]  # each its own timeout, c only the 20 s the deadline leaves
    assert gc.exit_code(rows) == 0

    clock.t, limits[:] = 0.0, []
    steps = [gc.Step("a", 100, taking(50)), gc.Step("b", 600, taking(547)), gc.Step("c", 60, taking(1)),
             gc.Step("d", 60, taking(1))]
    rows = gc.Runner(600, clock=clock).run(steps)
    assert limits == [100, 550]  # 3 s left: c is not started
    assert rows[2:] == [gc.Row("c", "not run", "", "the 600 s deadline was reached"),
                        gc.Row("d", "not run", "", "the 600 s deadline was reached")]
    assert gc.exit_code(rows) == 1


def test_a_failed_or_timed_out_step_stops_the_ones_after_it() -> None:
    def boom(limit: float) -> list:
        raise subprocess.TimeoutExpired("blazar", limit)

    rows = gc.Runner(600, clock=Clock()).run([gc.Step("a", 30, boom), gc.Step("b", 30, lambda _: [])])
    assert rows == [gc.Row("a", "FAIL", "", "timed out after 30 s"), gc.Row("b", "not run", "", "after a failed")]
    rows = gc.Runner(600, clock=Clock()).run([gc.Step("a", 30, lambda _: [gc.Row("a", "FAIL")]),
                                             gc.Step("b", 30, lambda _: [gc.Row("b", "pass")])])
    assert rows[-1].status == "not run"
    rows = gc.Runner(600, clock=Clock()).run([gc.Step("a", 30, lambda _: 1 / 0)])
    assert rows[0].status == "FAIL" and "ZeroDivisionError" in rows[0].detail


def _script(tmp_path: Path, *args: str, fake: dict | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HOME": str(tmp_path), "TMPDIR": str(tmp_path)}
    if fake is not None:
        env["FAKE_NVML"] = json.dumps(fake)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests" / "support" / "fake_pynvml"), str(REPO)])
    return subprocess.run([str(REPO / "scripts" / "gpu-check"), *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60)


def test_the_script_needs_a_gpu_and_dry_run_names_what_it_would_run(tmp_path: Path) -> None:
    res = _script(tmp_path, fake={"fail": True})
    assert res.returncode == 2 and "gpu-check: no NVIDIA GPU here" in res.stderr and res.stdout == ""
    h100 = {"driver": "550.54.15", "cuda": 12040, "gpus": [{"cc": [9, 0], "total": 80 * GIB, "free": 79 * GIB}]}
    res = _script(tmp_path, "--dry-run", fake=h100)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "| GPU | pass | 90 | NVIDIA H100 80GB HBM3 (sm 9.0, 80 GiB); driver 550.54.15, CUDA 12.4 |" in out
    assert "engine build --cuda --cuda-arch 90 --json" in out
    assert "tune gemma --only spec,kv --budget 150" in out and "--concurrency 1,8" in out
    assert "deadline 600 s; plan vs NVML within ±5%" in out
    assert list(tmp_path.glob("blazar-gpu-check-*")) == []  # its temporary home is gone
