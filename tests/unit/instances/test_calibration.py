"""Calibration: parsing llama-server's buffer lines, recording a measurement, and folding it into a correction."""

from __future__ import annotations

import pytest

from blazar.context import Blazar
from blazar.events import Recorded
from blazar.events.models import InstanceMemoryMeasured
from blazar.fit.buffers import GPU_ENGINE_FIXED_BYTES, HOST_ENGINE_FIXED_BYTES
from blazar.instances.calibration import measured_bytes, parse_engine_buffers, record_measurement
from blazar.projections import CalibrationProjection, fold
from blazar.projections.calibration import RECENT_PER_MODEL, correction_for
from tests.support.events import rec

MiB = 1 << 20

# Lines as llama-server (build 11434) printed them for gemma-3-270m, -c 8192 -np 4 --kv-unified, CPU.
CPU_LOG = """\
0.00.004.787 I srv    load_model: loading model '/models/gemma.gguf'
0.00.805.389 I load_tensors:          AMX model buffer size =   213.91 MiB
0.00.805.416 I load_tensors:   CPU_Mapped model buffer size =   235.16 MiB
0.00.889.900 I llama_context: n_ctx                 = 8192
0.00.889.943 I llama_context:        CPU  output buffer size =     4.00 MiB
0.00.890.100 I llama_kv_cache_iswa: creating non-SWA KV cache, size = 8192 cells
0.00.890.132 I llama_kv_cache:        CPU KV buffer size =    24.00 MiB
0.00.890.200 I llama_kv_cache: size =   24.00 MiB (  8192 cells,   3 layers,  4/1 seqs), K (f16):   12.00 MiB
0.00.900.312 I llama_kv_cache:        CPU KV buffer size =    37.50 MiB
0.00.917.615 I sched_reserve:        CPU compute buffer size =    28.78 MiB
"""

# A CUDA load in the same formats (buffer names are ggml_backend_buffer_name / ggml_backend_buft_name).
GPU_LOG = """\
srv    load_model: loading model '/models/llama.gguf'
load_tensors: offloading output layer to GPU
load_tensors:        CUDA0 model buffer size =  4403.49 MiB
load_tensors:   CPU_Mapped model buffer size =   281.81 MiB
llama_context:  CUDA_Host  output buffer size =     0.49 MiB
llama_kv_cache:      CUDA0 KV buffer size =  1024.00 MiB
sched_reserve:      CUDA0 compute buffer size =   304.00 MiB
sched_reserve:  CUDA_Host compute buffer size =    24.01 MiB
llama_context: CUDA0 compute buffer size of 304.0000 MiB, does not match expectation of 300.0000 MiB
"""


def test_parse_cpu_log_sums_both_kv_caches() -> None:
    assert parse_engine_buffers(CPU_LOG) == {
        "AMX model buffer": round(213.91 * MiB),
        "CPU_Mapped model buffer": round(235.16 * MiB),
        "CPU output buffer": 4 * MiB,
        "CPU KV buffer": round(61.5 * MiB),
        "CPU compute buffer": round(28.78 * MiB),
    }


def test_parse_gpu_log_keeps_devices_apart_and_ignores_debug_checks() -> None:
    b = parse_engine_buffers(GPU_LOG)
    assert b["CUDA0 KV buffer"] == 1024 * MiB
    assert b["CUDA0 compute buffer"] == 304 * MiB
    assert b["CUDA_Host compute buffer"] == round(24.01 * MiB)
    assert b["CUDA_Host output buffer"] == round(0.49 * MiB)
    assert len(b) == 6


def test_parse_keeps_only_the_last_load_in_the_log() -> None:
    assert parse_engine_buffers(CPU_LOG + GPU_LOG) == parse_engine_buffers(GPU_LOG)
    assert parse_engine_buffers("no buffers here\n") == {}


def test_measured_bytes_adds_baselines_and_prefers_a_larger_rss() -> None:
    cpu = parse_engine_buffers(CPU_LOG)
    assert measured_bytes(cpu, None) == sum(cpu.values()) + HOST_ENGINE_FIXED_BYTES
    assert measured_bytes(cpu, 10 << 30) == 10 << 30
    gpu = parse_engine_buffers(GPU_LOG)
    host = round((281.81 + 0.49 + 24.01) * MiB)
    assert measured_bytes(gpu, None) == (sum(gpu.values()) - host) + GPU_ENGINE_FIXED_BYTES + host \
        + HOST_ENGINE_FIXED_BYTES


def _measured(seq: int, model: str, ctx: int, slots: int, diff: int, ck: str = "f16") -> Recorded:
    return rec(seq, InstanceMemoryMeasured(model=model, ctx_tokens=ctx, slots=slots, cache_type_k=ck,
                                            cache_type_v=ck, planned_bytes=1000, measured_bytes=1000 + diff))


def test_correction_is_latest_for_the_shape_else_median_of_recent() -> None:
    state = fold(CalibrationProjection(), [
        _measured(1, "m", 4096, 1, 100),
        _measured(2, "m", 8192, 1, 300),
        _measured(3, "m", 4096, 1, 50),
        _measured(4, "other", 4096, 1, -7),
        _measured(5, "m", 4096, 2, 900, ck="q8_0"),
    ])
    assert correction_for(state, "m", 4096, 1, "f16", "f16") == 50  # the latest at this shape
    assert correction_for(state, "m", 4096, 2, "q8_0", "q8_0") == 900
    assert correction_for(state, "m", 16384, 1, "f16", "f16") == 300  # median_high of 100, 300, 50, 900
    assert correction_for(state, "other", 4096, 1, "f16", "f16") == -7
    assert correction_for(state, "never-measured", 4096, 1, "f16", "f16") == 0
    assert state.measurements == 5 and state.last_seq == 5


def test_projection_keeps_only_the_latest_few_per_model() -> None:
    state = fold(CalibrationProjection(), [_measured(i, "m", 1024 * i, 1, i) for i in range(1, 20)])
    recent = state.models["m"]
    assert len(recent) == RECENT_PER_MODEL and recent[-1].seq == 19
    assert correction_for(state, "m", 1024, 1, "f16", "f16") != 1  # that shape has aged out


async def test_record_measurement_appends_the_event_and_updates_the_correction(app: Blazar) -> None:
    rec = await record_measurement(
        app, model="gemma", ctx_tokens=8192, slots=4, cache_type_k="f16", cache_type_v="f16",
        planned_bytes=400 * MiB, log_text=CPU_LOG, rss_bytes=None,
    )
    ev = rec.event
    assert isinstance(ev, InstanceMemoryMeasured) and rec.stream == "model:gemma"
    assert ev.buffers == parse_engine_buffers(CPU_LOG)
    assert ev.measured_bytes == measured_bytes(ev.buffers, None)
    state = app.runner.state("calibration")
    assert correction_for(state, "gemma", 8192, 4, "f16", "f16") == ev.measured_bytes - 400 * MiB


async def test_record_measurement_refuses_a_log_without_buffer_lines(app: Blazar) -> None:
    with pytest.raises(ValueError, match="buffer size"):
        await record_measurement(app, model="gemma", ctx_tokens=8192, slots=1, cache_type_k="f16",
                                 cache_type_v="f16", planned_bytes=1, log_text="crashed\n", rss_bytes=None)
