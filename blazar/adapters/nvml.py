"""What NVML says about the NVIDIA side of this machine, in one look: the driver and the CUDA version it supports,
and for each GPU its name, compute capability, memory and the processes holding memory on it. Read by `doctor`'s
GPU checks and `scripts/gpu-check`; the fit keeps its own probe (blazar/adapters/gpu.py).

`nvml` is injectable (pynvml's module, or a fake with the same functions) so tests run without a GPU."""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NvmlGpu:
    index: int
    name: str
    compute_capability: tuple[int, int] | None  # (9, 0) for an H100; None when the driver does not say
    total_bytes: int
    free_bytes: int
    process_bytes: dict[int, int] = field(default_factory=dict)  # pid -> bytes it holds (compute processes)

    @property
    def arch(self) -> str | None:
        """The CUDA architecture to compile for, as CMAKE_CUDA_ARCHITECTURES spells it: "90" for 9.0."""
        return cuda_arch(self.compute_capability) if self.compute_capability else None


@dataclass(frozen=True)
class NvmlSnapshot:
    """`available` False: no NVML module or no driver answering (`why` says which): a CPU-only machine."""

    available: bool
    why: str = ""
    driver: str | None = None
    cuda: str | None = None  # the newest CUDA the driver supports, "12.4"
    gpus: tuple[NvmlGpu, ...] = ()


def cuda_arch(cc: tuple[int, int]) -> str:
    """Compute capability (major, minor) to CMake's architecture number: (9, 0) -> "90", (12, 0) -> "120"."""
    major, minor = cc
    if major < 1 or not 0 <= minor <= 9:
        raise ValueError(f"not a compute capability: {major}.{minor}")
    return f"{major}{minor}"


def cuda_version(v: int) -> str:
    """NVML's CUDA driver version integer (1000 * major + 10 * minor) as "major.minor": 12040 -> "12.4"."""
    return f"{v // 1000}.{(v % 1000) // 10}"


def _text(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def _optional(fn: Any, *args: Any) -> Any:
    """A detail some drivers (or an older pynvml) lack: None rather than no report at all."""
    try:
        return fn(*args)
    except Exception as e:  # NVMLError_NotSupported, AttributeError on an old module
        log.debug("NVML detail unavailable: %s", e)
        return None


def _processes(nvml: Any, handle: Any) -> dict[int, int]:
    procs = _optional(nvml.nvmlDeviceGetComputeRunningProcesses, handle) or []
    # usedGpuMemory is None where the driver cannot say (Windows WDDM, some containers)
    return {int(p.pid): int(p.usedGpuMemory) for p in procs if getattr(p, "usedGpuMemory", None) is not None}


def _gpu(nvml: Any, i: int) -> NvmlGpu:
    h = nvml.nvmlDeviceGetHandleByIndex(i)
    mem = nvml.nvmlDeviceGetMemoryInfo(h)
    cc = _optional(nvml.nvmlDeviceGetCudaComputeCapability, h)
    return NvmlGpu(index=i, name=_text(nvml.nvmlDeviceGetName(h)),
                   compute_capability=(int(cc[0]), int(cc[1])) if cc else None,
                   total_bytes=int(mem.total), free_bytes=int(mem.free), process_bytes=_processes(nvml, h))


def _import_nvml() -> Any:
    # Imported late: no NVIDIA driver means no GPUs, not an error (see blazar/adapters/gpu.py for the warning).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        import pynvml
    return pynvml


def read_nvml(nvml: Any | None = None) -> NvmlSnapshot:
    """One look at NVML. Never raises for a machine without NVIDIA: that is a snapshot with `available` False."""
    try:
        nvml = nvml if nvml is not None else _import_nvml()
    except ImportError as e:
        return NvmlSnapshot(False, f"the NVML module (nvidia-ml-py) is not installed: {e}")
    nvml_error = getattr(nvml, "NVMLError", None)
    try:
        nvml.nvmlInit()
    except Exception as e:
        if nvml_error is not None and not isinstance(e, nvml_error):
            raise
        return NvmlSnapshot(False, f"NVML did not start (no NVIDIA driver): {e}")
    try:
        driver = _optional(nvml.nvmlSystemGetDriverVersion)
        cuda = _optional(nvml.nvmlSystemGetCudaDriverVersion_v2)
        gpus = tuple(_gpu(nvml, i) for i in range(nvml.nvmlDeviceGetCount()))
    except Exception as e:
        if nvml_error is not None and not isinstance(e, nvml_error):
            raise
        return NvmlSnapshot(False, f"NVML started but could not list the GPUs: {e}")
    finally:
        nvml.nvmlShutdown()
    return NvmlSnapshot(True, driver=_text(driver) if driver is not None else None,
                        cuda=cuda_version(int(cuda)) if cuda is not None else None, gpus=gpus)
