"""A stand-in for NVIDIA's `pynvml` module: the functions Blazar calls, answering for GPUs described as data.

In this process pass a `FakeNvml` where an `nvml` is injectable; in a subprocess put tests/support/fake_pynvml/ first
on PYTHONPATH and describe the GPUs in FAKE_NVML (JSON: {"driver", "cuda", "gpus": [{"name", "cc", "total", "free",
"procs": {pid: bytes}}]}; {"fail": true}: a machine whose driver does not answer)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any


class NVMLError(Exception):
    pass


@dataclass
class FakeGpu:
    name: str = "NVIDIA H100 80GB HBM3"
    cc: tuple[int, int] | None = (9, 0)
    total: int = 80 << 30
    free: int = 79 << 30
    procs: dict[int, int | None] = field(default_factory=dict)


class FakeNvml:
    NVMLError = NVMLError

    def __init__(self, gpus: list[FakeGpu], *, driver: str = "550.54.15", cuda: int = 12040,
                 fail: bool = False) -> None:
        self.gpus, self.driver, self.cuda, self.fail = gpus, driver, cuda, fail
        self.inits = self.shutdowns = 0

    @classmethod
    def from_json(cls, text: str) -> FakeNvml:
        d = json.loads(text)
        gpus = [FakeGpu(name=g.get("name", "NVIDIA H100 80GB HBM3"), cc=tuple(g["cc"]) if g.get("cc") else None,
                        total=int(g["total"]), free=int(g["free"]),
                        procs={int(k): v for k, v in g.get("procs", {}).items()}) for g in d.get("gpus", [])]
        return cls(gpus, driver=d.get("driver", "550.54.15"), cuda=int(d.get("cuda", 12040)),
                   fail=bool(d.get("fail")))

    def nvmlInit(self) -> None:
        if self.fail:
            raise NVMLError("NVML Shared Library Not Found")
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return self.cuda

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return self.gpus[h].name.encode()  # older pynvml returns bytes

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-fake-{h}"

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        g = self.gpus[h]
        return SimpleNamespace(total=g.total, free=g.free, used=g.total - g.free)

    def nvmlDeviceGetCudaComputeCapability(self, h: int) -> tuple[int, int]:
        cc = self.gpus[h].cc
        if cc is None:
            raise NVMLError("Not Supported")
        return cc

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:
        return [SimpleNamespace(pid=pid, usedGpuMemory=b) for pid, b in self.gpus[h].procs.items()]

    def nvmlDeviceGetTotalEnergyConsumption(self, h: int) -> int:
        return 0
