"""The device probe: NVML through an injected module, the host from an injected meminfo, and the fallbacks."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from blazar.adapters.gpu import probe_devices
from blazar.fit.devices import Device, budget_bytes, reserve_bytes

MEMINFO = """MemTotal:       32768000 kB
MemFree:         1000000 kB
MemAvailable:   20000000 kB
Buffers:          100000 kB
Cached:          9000000 kB
HugePages_Total:       0
"""


class FakeNvmlError(Exception):
    pass


class FakeNvml:
    NVMLError = FakeNvmlError

    def __init__(self, gpus: list[tuple[str, int, int]], fail_init: bool = False) -> None:
        self.gpus, self.fail_init, self.shutdowns = gpus, fail_init, 0

    def nvmlInit(self) -> None:
        if self.fail_init:
            raise FakeNvmlError("Driver Not Loaded")

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return self.gpus[h][0].encode()

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-{h:04d}"

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(total=self.gpus[h][1], free=self.gpus[h][2], used=self.gpus[h][1] - self.gpus[h][2])


@pytest.fixture
def meminfo(tmp_path: Path) -> Path:
    p = tmp_path / "meminfo"
    p.write_text(MEMINFO)
    return p


def test_probe_lists_gpus_then_the_host(meminfo: Path) -> None:
    nvml = FakeNvml([("NVIDIA H200", 141 << 30, 140 << 30), ("NVIDIA L4", 24 << 30, 20 << 30)])
    devs = probe_devices(nvml=nvml, meminfo_path=meminfo)
    assert [d.key for d in devs] == ["cuda:0", "cuda:1", "host"]
    assert devs[0] == Device(kind="cuda", index=0, name="NVIDIA H200", total_bytes=141 << 30, free_bytes=140 << 30,
                             uuid="GPU-0000")
    assert devs[2].total_bytes == 32768000 * 1024 and devs[2].free_bytes == 20000000 * 1024
    assert nvml.shutdowns == 1


def test_nvml_error_falls_back_to_host_only(meminfo: Path) -> None:
    devs = probe_devices(nvml=FakeNvml([], fail_init=True), meminfo_path=meminfo)
    assert [d.kind for d in devs] == ["host"]


def test_missing_pynvml_falls_back_to_host_only(meminfo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    assert [d.kind for d in probe_devices(meminfo_path=meminfo)] == ["host"]


def test_old_kernel_without_memavailable_uses_free_buffers_cached(tmp_path: Path) -> None:
    p = tmp_path / "meminfo"
    p.write_text("\n".join(line for line in MEMINFO.splitlines() if not line.startswith("MemAvailable")))
    (h,) = probe_devices(nvml=FakeNvml([], fail_init=True), meminfo_path=p)
    assert h.free_bytes == (1000000 + 100000 + 9000000) * 1024


def test_budgets_keep_a_reserve() -> None:
    small = Device(kind="host", name="h", total_bytes=8 << 30, free_bytes=6 << 30)
    large = Device(kind="host", name="h", total_bytes=256 << 30, free_bytes=200 << 30)
    card = Device(kind="cuda", name="g", total_bytes=80 << 30, free_bytes=80 << 30)
    assert reserve_bytes(small) == 512 << 20 and budget_bytes(small) == (6 << 30) - (512 << 20)
    assert reserve_bytes(large) == int((256 << 30) * 0.05)
    assert reserve_bytes(card) == int((80 << 30) * 0.03)
    assert budget_bytes(Device(kind="cuda", name="g", total_bytes=1 << 30, free_bytes=100 << 20)) == 0
