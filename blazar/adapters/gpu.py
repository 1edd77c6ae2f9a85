"""The device probe: NVIDIA GPUs through NVML (pynvml) when it answers, and always the host from /proc/meminfo.

Both sources are injectable (`nvml`, `meminfo_path`) so tests run without a GPU or a Linux /proc.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

from blazar.fit.devices import Device

log = logging.getLogger(__name__)

MEMINFO = Path("/proc/meminfo")


def read_meminfo(path: Path = MEMINFO) -> dict[str, int]:
    """/proc/meminfo as bytes by key (the file counts in kB, i.e. KiB)."""
    out: dict[str, int] = {}
    for line in path.read_text().splitlines():
        key, _, rest = line.partition(":")
        fields = rest.split()
        if fields and fields[0].isdigit():
            out[key.strip()] = int(fields[0]) * (1024 if len(fields) > 1 and fields[1].lower() == "kb" else 1)
    return out


def host_device(path: Path = MEMINFO) -> Device:
    """The host: MemTotal, and MemAvailable as free (older kernels without it: MemFree + Buffers + Cached)."""
    info = read_meminfo(path)
    total = info.get("MemTotal", 0)
    free = info.get("MemAvailable")
    if free is None:
        free = info.get("MemFree", 0) + info.get("Buffers", 0) + info.get("Cached", 0)
    return Device(kind="host", index=0, name="host memory", total_bytes=total, free_bytes=min(free, total))


def _text(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def nvml_devices(nvml: Any) -> list[Device]:
    """Every GPU NVML lists, by NVML index. Raises whatever NVML raises; `probe_devices` decides what that means.

    NOTE: NVML numbers GPUs by PCI bus id; CUDA does too only with CUDA_DEVICE_ORDER=PCI_BUS_ID, which the engine
    driver sets so that "cuda:N" here is device N there.
    """
    nvml.nvmlInit()
    try:
        out = []
        for i in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            mem = nvml.nvmlDeviceGetMemoryInfo(h)
            try:
                uuid: str | None = _text(nvml.nvmlDeviceGetUUID(h))
            except Exception:  # an optional detail; some drivers or fakes lack it
                uuid = None
            out.append(Device(kind="cuda", index=i, name=_text(nvml.nvmlDeviceGetName(h)),
                              total_bytes=int(mem.total), free_bytes=int(mem.free), uuid=uuid))
        return out
    finally:
        nvml.nvmlShutdown()


def probe_devices(*, nvml: Any | None = None, meminfo_path: Path = MEMINFO) -> list[Device]:
    """GPUs (when NVML is importable and answers) followed by the host. No GPU is not an error: it is a host-only
    machine, and the reason is logged at debug level."""
    gpus: list[Device] = []
    try:
        if nvml is None:
            # Imported late: no NVIDIA driver means no GPUs, not an error. The module comes from nvidia-ml-py; a
            # machine that also has the deprecated "pynvml" distribution gets a FutureWarning from its redirect.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                import pynvml
            nvml = pynvml
        gpus = nvml_devices(nvml)
    except ImportError as e:
        log.debug("no NVML module: %s", e)
    except Exception as e:
        nvml_error = getattr(nvml, "NVMLError", None)
        if nvml_error is None or not isinstance(e, nvml_error):
            raise
        log.debug("NVML unavailable: %s", e)
    return [*gpus, host_device(meminfo_path)]
