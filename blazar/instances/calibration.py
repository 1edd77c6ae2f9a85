"""Calibration after a load: read the buffer sizes llama-server logged, and record them beside the plan's estimate
as `instance.memory_measured` (which the calibration projection folds into the next plan's correction).
"""

from __future__ import annotations

import re

from blazar.context import Blazar
from blazar.events.base import Recorded
from blazar.events.models import InstanceMemoryMeasured
from blazar.fit.buffers import GPU_ENGINE_FIXED_BYTES, HOST_ENGINE_FIXED_BYTES

MiB = 1 << 20

# The allocation lines llama.cpp prints, whatever prefix (timestamp, level, function) the log format adds:
#   load_tensors:   CPU_Mapped model buffer size =   241.41 MiB      (llama-model.cpp, load_tensors)
#   llama_kv_cache:        CPU KV buffer size =    18.00 MiB         (llama-kv-cache.cpp, constructor)
#   llama_memory_recurrent:   CPU RS buffer size = ...               (llama-memory-recurrent.cpp)
#   llama_context:  CPU  output buffer size =     1.00 MiB           (llama-context.cpp, constructor)
#   sched_reserve:        CPU compute buffer size =   514.25 MiB     (llama-context.cpp, sched_reserve)
# and the LoRA and DSV4 state buffers. "compute buffer size of/is ..." (debug checks) do not match.
_BUFFER = re.compile(
    r"(?P<buf>\S+)\s+(?P<kind>model|KV|RS|compute|output|LoRA|DSV4 \S+ state) buffer size\s*=\s*"
    r"(?P<mib>\d+(?:\.\d+)?)\s*MiB"
)
# llama-server logs this once per (re)load of the main model (server-context.cpp, load_model): what came before
# belongs to an earlier load in the same log.
_NEW_LOAD = re.compile(r"load_model: loading model")

# Buffer types that live in host memory: the CPU backend's (CPU, CPU_Mapped, CPU_REPACK, ...), pinned host buffers
# of a GPU backend (CUDA_Host), and CPU-side accelerators.
_HOST_NAMES = frozenset({"AMX", "BLAS", "KLEIDIAI"})


def parse_engine_buffers(log_text: str) -> dict[str, int]:
    """Bytes per buffer from the last load in `log_text`: {"CPU KV buffer": ..., "CPU_Mapped model buffer": ...}.

    Lines naming the same buffer add up (a sliding-window model logs two "KV buffer" lines, one per cache). The log
    prints MiB with two decimals, so each value is exact to +-5 KiB.
    """
    out: dict[str, int] = {}
    for line in log_text.splitlines():
        if _NEW_LOAD.search(line):
            out = {}
            continue
        m = _BUFFER.search(line)
        if m:
            key = f"{m['buf']} {m['kind']} buffer"
            out[key] = out.get(key, 0) + round(float(m["mib"]) * MiB)
    return out


def is_host_buffer(key: str) -> bool:
    name = key.split(" ", 1)[0]
    return name.upper().startswith("CPU") or name.endswith("_Host") or name.upper() in _HOST_NAMES


def measured_bytes(buffers: dict[str, int], rss_bytes: int | None) -> int:
    """What the engine really holds, comparable with a plan's total.

    Device side: the GPU buffers plus the per-GPU fixed footprint the plan also charges (no log line reports the
    CUDA context). Host side: the host buffers plus the host baseline, or the process RSS when that is larger (RSS
    sees what no buffer line does; it also counts mapped model pages, so it never makes the host side smaller).
    """
    host = sum(v for k, v in buffers.items() if is_host_buffer(k))
    gpu = sum(v for k, v in buffers.items() if not is_host_buffer(k))
    gpus = {k.split(" ", 1)[0] for k in buffers if not is_host_buffer(k)}
    host_side = host + HOST_ENGINE_FIXED_BYTES
    if rss_bytes is not None:
        host_side = max(host_side, rss_bytes)
    return host_side + gpu + GPU_ENGINE_FIXED_BYTES * len(gpus)


async def record_measurement(
    app: Blazar,
    *,
    model: str,
    ctx_tokens: int,
    slots: int,
    cache_type_k: str,
    cache_type_v: str,
    planned_bytes: int,
    log_text: str,
    rss_bytes: int | None,
    instance_id: str | None = None,
) -> Recorded:
    """Append `instance.memory_measured` for a load the planner priced at `planned_bytes`.

    `planned_bytes` must be the plan's estimate before calibration (`FitPlan.estimate_bytes`): the difference then
    stays a property of the model and the machine, instead of chasing the correction it produced last time.

    Raises ValueError when the log holds no buffer line: recording a made-up measurement would skew every later
    plan of the model.
    """
    buffers = parse_engine_buffers(log_text)
    if not buffers:
        raise ValueError("the engine log has no 'buffer size =' lines to measure")
    event = InstanceMemoryMeasured(
        model=model, instance_id=instance_id, ctx_tokens=ctx_tokens, slots=slots, cache_type_k=cache_type_k,
        cache_type_v=cache_type_v, planned_bytes=planned_bytes, measured_bytes=measured_bytes(buffers, rss_bytes),
        buffers=buffers, rss_bytes=rss_bytes,
    )
    (rec,) = await app.record(event)
    return rec
