"""`blazar doctor`'s GPU checks (blazar/operations/doctor/gpu.py, gpu_backend.py): what NVML sees, whether the active
engine's backend fits the GPUs (a CPU-only build on a CUDA machine warns naming `blazar engine build --cuda`), and
the pinned/preloaded models' plans against free VRAM; each decision on data, then the whole check on a real home
with a fake NVML, and the real engine's own --list-devices read."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from blazar.adapters.nvml import NvmlSnapshot, read_nvml
from blazar.bootstrap import bootstrap
from blazar.operations.doctor import gpu
from blazar.operations.doctor.gpu_backend import (
    Backend,
    from_build_options,
    from_device_list,
    list_devices,
    runs_on,
)
from blazar.operations.doctor.report import Check
from tests.support import gguf_factory
from tests.support.blazar_home import configure, home_paths, import_into
from tests.support.fake_nvml import FakeGpu, FakeNvml

GIB = 1 << 30
CPU_OPTIONS = ["-DCMAKE_BUILD_TYPE=Release", "-DGGML_AVX2=ON"]


def snap(*gpus: FakeGpu) -> NvmlSnapshot:
    return read_nvml(FakeNvml(list(gpus)))


NONE = read_nvml(FakeNvml([], fail=True))


def test_nvml_present_names_driver_cuda_and_each_gpu_and_absent_is_cpu_only() -> None:
    c = gpu.nvml_check(snap(FakeGpu(free=70 * GIB)))
    assert c.status == "ok" and c.id == "machine.gpu"
    assert "driver 550.54.15, CUDA 12.4" in c.observation
    assert "cuda:0 NVIDIA H100 80GB HBM3 (sm 9.0, 70.0 GiB free of 80.0 GiB)" in c.observation
    c = gpu.nvml_check(NONE)
    assert c.status == "ok" and c.observation.startswith("no NVIDIA GPU / NVML not present: CPU only")


def test_a_cpu_only_build_on_a_cuda_machine_warns_naming_the_cuda_build() -> None:
    cpu = from_build_options(CPU_OPTIONS)
    assert cpu is not None and not cpu.cuda
    c = gpu.backend_fit("build-x", cpu, snap(FakeGpu()))
    assert c.status == "warn" and c.id == "engine.backend" and "CPU-only" in c.observation
    assert c.fix is not None and c.fix.startswith("blazar engine build --cuda")
    assert gpu.backend_fit("build-x", cpu, NONE).status == "ok"  # no GPU: the CPU build is what this machine uses


def test_a_cuda_build_fits_the_gpus_its_architectures_run_on() -> None:
    for_h100 = from_build_options([*CPU_OPTIONS, "-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=90"])
    assert for_h100 == Backend(True, "built with -DGGML_CUDA=ON for CUDA architecture(s) 90", ("90",))
    assert gpu.backend_fit("b", for_h100, snap(FakeGpu())).status == "ok"
    c = gpu.backend_fit("b", for_h100, snap(FakeGpu(name="NVIDIA L4", cc=(8, 9))))
    assert c.status == "warn" and c.fix == "blazar engine build --cuda --cuda-arch 89"
    default = from_build_options([*CPU_OPTIONS, "-DGGML_CUDA=ON"])  # llama.cpp's own list: trusted to cover it
    assert default is not None and default.archs == () and gpu.backend_fit("b", default, snap(FakeGpu())).status == "ok"
    assert from_build_options([]) is None  # installed, not built here: ask the binary


def test_which_architectures_run_on_which_gpu() -> None:
    assert runs_on(["90"], (9, 0)) and runs_on(["80"], (9, 0))  # PTX in a plain arch is JIT-compiled for later GPUs
    assert runs_on(["86-real"], (8, 9)) and not runs_on(["86-real"], (9, 0))  # SASS: same major only
    assert not runs_on(["90"], (8, 9)) and not runs_on(["90-virtual"], (8, 9))
    assert runs_on(["120a"], (12, 0)) and not runs_on(["120a"], (12, 1))
    assert not runs_on(["bogus"], (9, 0))


def test_the_device_list_tells_a_cuda_build_from_a_cpu_one() -> None:
    cuda = ("ggml_cuda_init: found 1 CUDA devices:\nAvailable devices:\n"
            "  CUDA0: NVIDIA H100 80GB HBM3 (81079 MiB, 80500 MiB free)\n")
    assert from_device_list(cuda).cuda
    assert not from_device_list("Available devices:\n  (none)\n").cuda
    vulkan = from_device_list("Available devices:\n  Vulkan0: AMD Radeon (8192 MiB, 8000 MiB free)\n")
    assert not vulkan.cuda and "Vulkan" in vulkan.evidence


def test_the_real_engine_lists_no_cuda_device(engine_binary: Path) -> None:
    text = asyncio.run(list_devices(engine_binary, {}))
    assert "Available devices:" in text and not from_device_list(text).cuda


def _home(home: Path, tmp_path: Path, *models: str) -> None:
    src = tmp_path / "src" / "tiny.gguf"
    src.parent.mkdir()
    gguf_factory.write_plain(src)
    for m in models:
        import_into(home, src, m)


def _checks(home: Path, nvml: FakeNvml) -> dict[str, Check]:
    async def go() -> list[Check]:
        app = await bootstrap(paths=home_paths(home), env={}, actor="test:pytest", reconcile_config=False)
        try:
            return await gpu.gpu_checks(app, lambda: read_nvml(nvml))
        finally:
            await app.close()

    return {c.id: c for c in asyncio.run(go())}


def test_preloaded_models_against_free_vram(home: Path, tmp_path: Path) -> None:
    _home(home, tmp_path, "tiny:a", "tiny:b")
    found = _checks(home, FakeNvml([FakeGpu()]))
    assert found["machine.vram"].status == "ok" and "no pinned or preloaded model" in found["machine.vram"].observation
    assert "engine.backend" not in found  # no engine: engine.active says so
    configure(home, "engine.preload", "tiny:a,tiny:b,gone:model")
    roomy = _checks(home, FakeNvml([FakeGpu(free=70 * GIB)]))["machine.vram"]
    assert roomy.status == "warn" and "gone:model: no model named 'gone:model'" in roomy.observation  # named
    configure(home, "engine.preload", "tiny:a,tiny:b")
    roomy = _checks(home, FakeNvml([FakeGpu(free=70 * GIB)]))["machine.vram"]
    assert roomy.status == "ok" and re.search(r"pinned/preloaded tiny:a, tiny:b at \d+ ctx x 1 slot\(s\): cuda:0 "
                                              r"needs [\d.]+ GiB of 67.6 GiB free", roomy.observation), roomy
    full = _checks(home, FakeNvml([FakeGpu(free=1 * GIB)]))["machine.vram"]  # less than the 2.4 GiB reserve
    assert full.status == "warn" and "cuda:0 NVIDIA H100 80GB HBM3:" in full.observation
    assert "tiny:a" in full.observation and "tiny:b" in full.observation and "engine.preload" in (full.fix or "")


def test_without_nvidia_there_is_no_vram_check(home: Path, tmp_path: Path) -> None:
    _home(home, tmp_path, "tiny:a")
    configure(home, "engine.preload", "tiny:a")
    found = _checks(home, FakeNvml([], fail=True))
    assert set(found) == {"machine.gpu"} and found["machine.gpu"].status == "ok"


@pytest.mark.parametrize("held", [0, 3 * GIB])
def test_what_their_own_instances_hold_counts_as_free_for_them(held: int) -> None:
    s = snap(FakeGpu(free=2 * GIB))
    plan_bytes = 2 * GIB

    class Plan:
        devices = [type("U", (), {"key": "cuda:0", "total_bytes": plan_bytes})()]
        gpu_layers = offloadable_layers = 4

    need = gpu.Need("m", Plan())  # type: ignore[arg-type]
    c = gpu.vram_fit([need], s, {0: held}, "4096 ctx x 1 slot(s)")
    assert c.status == ("warn" if held == 0 else "ok"), c.observation
