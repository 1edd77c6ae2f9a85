"""The memory devices a plan spends: GPUs and host RAM as the probe saw them, and the budget each one offers.

`Device` is data only; `blazar.adapters.gpu.probe_devices()` fills it from NVML and /proc/meminfo.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

MiB = 1 << 20
GiB = 1 << 30

# NOTE: the reserve is what we refuse to plan into, on top of every byte the engine is expected to use.
# Host: max(512 MiB, 5% of RAM): the OS, page cache for the model file and the gateway itself must survive a load.
HOST_RESERVE_MIN_BYTES = 512 * MiB
HOST_RESERVE_FRACTION = 0.05
# GPU: max(256 MiB, 3% of VRAM): allocator fragmentation and another process's late allocations. The CUDA context
# itself is charged separately (blazar.fit.buffers.GPU_ENGINE_FIXED_BYTES), so this stays small.
GPU_RESERVE_MIN_BYTES = 256 * MiB
GPU_RESERVE_FRACTION = 0.03


class Device(BaseModel):
    """One memory pool. `free_bytes` is MemAvailable for the host and NVML's free for a GPU, at probe time."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["cuda", "host", "rpc"]  # rpc: a `blazar worker` (llama.cpp's rpc-server) at `name` (host:port)
    index: int = 0
    name: str
    total_bytes: int
    free_bytes: int
    uuid: str | None = None

    @property
    def key(self) -> str:
        """Stable name used in plans: "host", "cuda:<index>" or "rpc:<index>"."""
        return "host" if self.kind == "host" else f"{self.kind}:{self.index}"


def reserve_bytes(device: Device) -> int:
    """Bytes kept back on `device` whatever the plan."""
    if device.kind == "host":
        return max(HOST_RESERVE_MIN_BYTES, int(device.total_bytes * HOST_RESERVE_FRACTION))
    if device.kind == "rpc":
        return 0  # a worker offers what its --mem says it may use: its host kept its own margin
    return max(GPU_RESERVE_MIN_BYTES, int(device.total_bytes * GPU_RESERVE_FRACTION))


def budget_bytes(device: Device) -> int:
    """What a plan may use on `device`: free memory minus the reserve (never negative)."""
    return max(0, device.free_bytes - reserve_bytes(device))


def host_of(devices: list[Device]) -> Device:
    """The host device; a list without one gets a zero-sized host so every plan still has somewhere to put it."""
    for d in devices:
        if d.kind == "host":
            return d
    return Device(kind="host", name="host (not probed)", total_bytes=0, free_bytes=0)


def gpus_of(devices: list[Device]) -> list[Device]:
    """The devices layers are offloaded to, in llama.cpp's order: RPC workers first (as --rpc names them; llama.cpp
    puts them "at the front of the list to minimize network transfers"), then local GPUs."""
    return sorted((d for d in devices if d.kind != "host"), key=lambda d: (d.kind != "rpc", d.index))


def rpc_of(devices: list[Device]) -> list[Device]:
    return [d for d in gpus_of(devices) if d.kind == "rpc"]
