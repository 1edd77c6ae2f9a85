"""NVML in one look (blazar/adapters/nvml.py): the driver, CUDA as major.minor, each GPU's compute capability,
memory and processes; and a machine without NVIDIA as a snapshot that says why, never an exception."""

from __future__ import annotations

import sys

import pytest

from blazar.adapters.nvml import cuda_arch, cuda_version, read_nvml
from tests.support.fake_nvml import FakeGpu, FakeNvml


def test_a_gpu_machine_reports_driver_cuda_and_each_gpu() -> None:
    fake = FakeNvml([FakeGpu(procs={4242: 700 << 20, 4343: None}),
                     FakeGpu(name="NVIDIA L4", cc=(8, 9), total=24 << 30, free=20 << 30)], cuda=12040)
    snap = read_nvml(fake)
    assert snap.available and snap.driver == "550.54.15" and snap.cuda == "12.4"
    h100, l4 = snap.gpus
    assert (h100.name, h100.compute_capability, h100.arch, h100.free_bytes) == ("NVIDIA H100 80GB HBM3", (9, 0), "90",
                                                                               79 << 30)
    assert h100.process_bytes == {4242: 700 << 20}  # a process whose usage the driver cannot say is left out
    assert (l4.index, l4.arch, l4.total_bytes) == (1, "89", 24 << 30)
    assert fake.inits == fake.shutdowns == 1


def test_a_gpu_without_a_compute_capability_is_still_listed() -> None:
    (g,) = read_nvml(FakeNvml([FakeGpu(cc=None)])).gpus
    assert g.compute_capability is None and g.arch is None


def test_no_driver_and_no_module_are_a_cpu_only_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    snap = read_nvml(FakeNvml([], fail=True))
    assert not snap.available and "no NVIDIA driver" in snap.why and snap.gpus == ()
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    snap = read_nvml()
    assert not snap.available and "nvidia-ml-py" in snap.why


def test_an_unexpected_error_is_not_taken_for_a_missing_driver() -> None:
    class Broken(FakeNvml):
        def nvmlDeviceGetCount(self) -> int:
            raise RuntimeError("a bug, not a machine without NVIDIA")

    with pytest.raises(RuntimeError):
        read_nvml(Broken([]))


def test_versions_and_architectures_as_cmake_and_people_spell_them() -> None:
    assert cuda_version(12040) == "12.4" and cuda_version(11080) == "11.8" and cuda_version(13000) == "13.0"
    assert cuda_arch((9, 0)) == "90" and cuda_arch((8, 6)) == "86" and cuda_arch((12, 0)) == "120"
    with pytest.raises(ValueError):
        cuda_arch((0, 0))
