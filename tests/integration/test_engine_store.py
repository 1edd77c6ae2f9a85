"""The engine store's handlers against the real llama-server (engine_binary): install from a path with the probe and
smoke gates, the smoke gate refusing a build that dies of SIGILL, verify after corruption, use, rollback, prune.
Against stand-ins only: tests/unit/store/test_engine_handlers.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from blazar.adapters.engines.package import RPC_SERVER
from blazar.context import Blazar
from blazar.errors import EngineError, EngineNotFound, EngineRefused, EngineVerifyFailed
from blazar.store.engines import (
    active_engine,
    install_engine,
    prune_engines,
    rollback_engine,
    use_engine,
    verify_engine,
)
from tests.support.engine_store import engines_state, events, size_and_sha256, stand_in, types


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


async def test_active_engine_says_when_its_binary_was_deleted(app: Blazar, engine_binary: Path) -> None:
    tag = await install_engine(app, source="path", path=engine_binary)
    (app.paths.engines / tag / engine_binary.name).unlink()
    with pytest.raises(EngineError, match="blazar engine verify"):
        active_engine(app)


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
    refusal = state.engines[bad].refused
    assert state.active == good and active_engine(app).tag == good
    assert refusal is not None and refusal.reason == "smoke_failed"  # installed, listed, never active


async def test_verify_names_a_corrupted_file_and_use_then_refuses_it(app: Blazar, engine_binary: Path,
                                                                    real_copy: Path) -> None:
    a = await install_engine(app, source="path", path=engine_binary)
    b = await install_engine(app, source="path", path=real_copy)
    assert engines_state(app).active == b
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
    assert engines_state(app).active == b
    assert [r.event.tag for r in await events(app, "engine.smoke_tested")] == [a, b]  # no smoke test after a bad verify


async def test_use_switches_engines_and_rollback_reactivates_the_previous(app: Blazar, engine_binary: Path,
                                                                         real_copy: Path) -> None:
    a = await install_engine(app, source="path", path=engine_binary)
    b = await install_engine(app, source="path", path=real_copy, activate=False)
    assert engines_state(app).active == a
    await use_engine(app, b)
    assert engines_state(app).active == b

    assert await rollback_engine(app) == a
    assert active_engine(app).tag == a
    last = (await events(app, "engine.activated"))[-1]
    assert (last.event.tag, last.event.previous, last.event.reason) == (a, b, "rollback")
    with pytest.raises(EngineNotFound, match="no previous engine"):
        await rollback_engine(app)
    with pytest.raises(EngineNotFound, match="nope"):
        await use_engine(app, "nope")


async def test_prune_removes_old_engines_but_never_the_active_one_and_rollback_still_works(
        app: Blazar, engine_binary: Path, real_copy: Path, tmp_path: Path) -> None:
    old = await install_engine(app, source="path", path=stand_in(tmp_path / "old", "exit 0"), activate=False)
    a = await install_engine(app, source="path", path=engine_binary)
    b = await install_engine(app, source="path", path=real_copy)
    leftover = app.paths.engines / ".staging-999999999-dead"  # an install that died mid-copy
    leftover.mkdir()

    assert await prune_engines(app) == [old]
    assert sorted(engines_state(app).engines) == sorted([a, b])
    assert sorted(p.name for p in app.paths.engines.iterdir()) == sorted([a, b])
    (removed,) = await events(app, "engine.removed")
    assert (removed.event.tag, removed.event.reason, removed.event.freed_bytes) == (old, "prune",
                                                                                  (tmp_path / "old").stat().st_size)
    assert await rollback_engine(app) == a

    assert await prune_engines(app, keep_previous=False) == [b]
    assert engines_state(app).active == a and sorted(engines_state(app).engines) == [a]
    assert await prune_engines(app, keep_previous=False) == []
    assert active_engine(app).binary.is_file()
