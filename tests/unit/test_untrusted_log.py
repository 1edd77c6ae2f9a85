"""A log that names paths outside the home, folded and acted on: the projections make no usable entry of such an
event (kept under `refused`), and the handlers check again on disk, right before they remove, open or run anything,
so a symlink inside the home that leads out is refused too. Outside files must survive; outside programs must never
run (a stand-in that would leave a marker)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from blazar.context import Blazar
from blazar.errors import EngineVerifyFailed, ModelNotFound, OutsideHome, SessionNotFound
from blazar.events import Event
from blazar.events.engines import EngineActivated, EngineFile, EngineInstalled
from blazar.events.instances import InstanceStarting
from blazar.events.models import ModelImported, ShardFile
from blazar.events.sessions import SessionSaved
from blazar.instances.kv_bank import KvBank
from blazar.instances.reconcile import reconcile
from blazar.instances.supervisor import Supervisor
from blazar.operations.config import set_value
from blazar.projections import CatalogProjection, EnginesProjection, fold
from blazar.projections.catalog import stored
from blazar.projections.engines import refusals
from blazar.projections.sessions import SessionsProjection, bank_entries
from blazar.serving.session_commands import remove_session
from blazar.store import engine_verify
from blazar.store.engine_verify import spawn_problems, verify_for_spawn
from blazar.store.engines import active_engine, install_engine
from blazar.store.models import import_model, remove_model, slot_dir
from tests.support.engine_store import stand_in
from tests.support.events import recs
from tests.support.gguf_factory import write_plain
from tests.support.kv_bank import IDENT, FakeSlotsEngine, instance

SHA = "ab" * 32



def folded(projection: Any, *events: Event) -> Any:
    return fold(projection, recs(*events))


def imported(name: str, path: str, shards: list[str] | None = None) -> ModelImported:
    from blazar.events.models import ModelMetadata

    return ModelImported(name=name, path=path, source="/src", bytes=1, sha256=SHA, linked=True,
                         metadata=ModelMetadata(architecture="llama"),
                         shards=[ShardFile(path=p, bytes=1, sha256=SHA) for p in shards or []])


def installed(tag: str, binary: str = "llama-server") -> EngineInstalled:
    return EngineInstalled(tag=tag, source_kind="path", source="/src", binary=binary,
                           files=[EngineFile(path=binary, bytes=1, sha256=SHA)], version={}, manifest={})


def saved(session: str, file: str, nbytes: int = 100) -> SessionSaved:
    return SessionSaved(session=session, model="gemma", instance_id="i1", slot_id=0, file=file, bytes=nbytes,
                        tokens=10, duration_ms=1.0, identity=IDENT, reason="stopped")


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory outside the home, with a file that must survive everything below."""
    d = tmp_path / "outside"
    d.mkdir()
    (d / "precious.txt").write_text("keep me")
    return d


# -- the projections ----------------------------------------------------------------------------------------------


def test_an_import_naming_a_file_outside_the_store_is_no_model_and_is_kept_as_refused() -> None:
    state = folded(CatalogProjection(), imported("gemma", "gemma.gguf"), imported("gemma", "/home/me/precious.txt"),
                   imported("victim", "../../precious.txt"),
                   imported("split", "/tmp/x/a.gguf", shards=["/tmp/x/a.gguf", "/tmp/x/b.gguf"]),
                   imported("flat", "a.gguf", shards=["a.gguf", "b.gguf"]))
    assert set(state.models) == {"gemma"}
    assert state.models["gemma"].file == "gemma.gguf"  # the legitimate import stays as it was
    assert [(r.seq, r.type) for r in state.refused] == [
        (2, "model.imported"), (3, "model.imported"), (4, "model.imported"), (5, "model.imported")]
    assert state.refused[0].paths == ("path '/home/me/precious.txt' is absolute",)
    assert stored(state, "victim") is None


def test_an_engine_installed_outside_its_directory_is_never_installed_nor_activated() -> None:
    state = folded(EnginesProjection(), installed("good"), EngineActivated(tag="good", reason="install"),
                   installed("evil", binary="/tmp/outside/evil.sh"), EngineActivated(tag="evil", reason="use"))
    assert set(state.engines) == {"good"}
    assert state.active == "good" and state.history == ["good"]
    assert [(r.seq, r.type) for r in refusals(state)] == [(3, "engine.installed"), (4, "engine.activated")]
    assert "binary '/tmp/outside/evil.sh' is absolute" in refusals(state)[0].paths


def test_a_save_naming_a_file_outside_the_bank_enters_no_bank_and_counts_nowhere() -> None:
    state = folded(SessionsProjection(), saved("ok", "slots/gemma/a.bin"), saved("evil", "/home/me/precious.txt"),
                   saved("evil2", "slots/../../precious.txt"))
    assert [e.session for e in bank_entries(state)] == ["ok"] and state.bank_bytes == 100
    assert set(state.sessions) == {"ok"}
    assert [r.seq for r in state.refused] == [2, 3]


# -- the handlers, with events appended straight to the log ---------------------------------------------------------


async def test_rm_of_an_appended_model_outside_the_store_touches_nothing(app: Blazar, outside: Path) -> None:
    target = outside / "precious.txt"
    await app.record(imported("victim", str(target)))
    await app.record(imported("climber", "../../outside/precious.txt"))
    (outside / "shards").mkdir()
    (outside / "shards" / "a.gguf").write_text("part")
    await app.record(imported("split", str(outside / "shards" / "a.gguf"), shards=[str(outside / "shards" / "a.gguf")]))
    for name in ("victim", "climber", "split"):
        with pytest.raises(ModelNotFound):
            await remove_model(app, name)
    assert target.read_text() == "keep me" and (outside / "shards" / "a.gguf").exists()
    assert [r async for r in app.log.read(types=["model.removed"])] == []


async def test_rm_of_a_model_whose_store_file_leads_out_by_a_symlink_removes_nothing(
        app: Blazar, outside: Path, tmp_path: Path) -> None:
    write_plain(tmp_path / "tiny.gguf")
    await import_model(app, tmp_path / "tiny.gguf", "tiny")
    store_file = app.paths.models / "tiny.gguf"
    store_file.unlink()
    os.symlink(outside / "precious.txt", store_file)
    with pytest.raises(OutsideHome, match=r"model.imported \(seq \d+\) of tiny names .*precious.txt"):
        await remove_model(app, "tiny")
    assert (outside / "precious.txt").read_text() == "keep me" and store_file.is_symlink()
    assert [r async for r in app.log.read(types=["model.removed"])] == []


async def test_rm_of_a_split_model_whose_directory_leads_out_removes_nothing(
        app: Blazar, outside: Path, tmp_path: Path) -> None:
    from tests.support.gguf_factory import write_split

    (tmp_path / "src").mkdir()
    parts, _ = write_split(tmp_path / "src" / "big.gguf")
    await import_model(app, parts, "big")
    shard_dir = app.paths.models / "big"
    moved = outside / "big"
    shutil.move(shard_dir, moved)
    os.symlink(moved, shard_dir)
    with pytest.raises(OutsideHome):
        await remove_model(app, "big")
    assert sorted(p.name for p in moved.iterdir()) == sorted(p.name for p in parts)


async def test_session_rm_and_the_bank_trim_never_touch_a_file_outside_the_bank(
        app: Blazar, outside: Path) -> None:
    target = outside / "precious.txt"
    await app.record(saved("evil", str(target), nbytes=50 << 20))
    with pytest.raises(SessionNotFound):
        await remove_session(app, "evil")
    # A recorded save whose file is a symlink out of the bank: the trim drops the entry, the file it leads to stays;
    # `session rm` refuses it whole.
    engine = FakeSlotsEngine(slot_dir(app.paths.data_dir, "gemma"), size=900 << 10)
    bank = KvBank(app, engine)  # type: ignore[arg-type]
    for i, name in enumerate(("a", "b")):
        await bank.place(instance(f"i{i}"), 0, name)
        await bank.save_instance(instance(f"i{i}"), "evicted")
    a, b = bank_entries(app.runner.state("sessions"))
    for entry in (a, b):
        path = app.paths.data_dir / entry.file
        path.unlink()
        os.symlink(target, path)
    with pytest.raises(OutsideHome, match=rf"session.saved \(seq {b.seq}\) of session b"):
        await remove_session(app, "b")
    await set_value(app, "sessions.session_bank_mib", "1")
    dropped = await bank.enforce_bound()
    assert [r.event.session for r in dropped] == ["a"]  # type: ignore[attr-defined]
    assert target.read_text() == "keep me"
    # And a restore of it runs cold, naming why, without asking the engine to read it.
    bank.forget("i1")
    got = await bank.place(instance("i9"), 0, "b")
    assert got.kv == "cold" and "not trusted" in got.reason
    assert [c[1] for c in engine.calls] == ["save", "save"]


async def test_reconcile_reads_no_log_and_removes_no_pid_file_outside_the_home(app: Blazar, outside: Path) -> None:
    (outside / "victim.pid").write_text("1 2\n")
    (outside / "secret.log").write_text("the secret\n")
    iid = f"../../../{outside.name}/victim"
    await app.record(InstanceStarting(instance_id=iid, model="m", engine_tag="b1", port=40009, argv=["x"],
                                      log_path=str(outside / "secret.log"), ctx_tokens=1, engine_ctx=1, slots=1,
                                      planned_bytes=1, estimate_bytes=1))
    assert await reconcile(app) == [iid]
    (exited,) = [r async for r in app.log.read(types=["instance.exited"])]
    assert exited.event.log_tail == []  # type: ignore[attr-defined]
    assert (outside / "victim.pid").exists()


# -- the engine, before each spawn --------------------------------------------------------------------------------


@pytest.fixture
async def engine_home(app: Blazar, tmp_path: Path) -> tuple[Blazar, Path]:
    """A stand-in engine installed and activated (by an appended event: it would fail the smoke gate), whose every
    run leaves a marker; a tiny model imported."""
    marker = tmp_path / "ran"
    (tmp_path / "src").mkdir()
    binary = stand_in(tmp_path / "src" / "llama-server", f"touch {marker}")
    tag = await install_engine(app, source="path", path=binary, tag="standin", activate=False)
    await app.record(EngineActivated(tag=tag, reason="use"))
    write_plain(tmp_path / "tiny.gguf")
    await import_model(app, tmp_path / "tiny.gguf", "tiny")
    return app, marker


async def test_an_engine_changed_after_install_is_refused_at_load_and_the_refusal_recorded(
        engine_home: tuple[Blazar, Path]) -> None:
    app, marker = engine_home
    copy = app.paths.engines / "standin" / "llama-server"
    st = copy.stat()
    with copy.open("a") as fh:
        fh.write("# one more line\n")
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns))  # the old mtime back: the size and ctime still tell
    sup = Supervisor(app)
    with pytest.raises(EngineVerifyFailed, match="llama-server"):
        await sup.load("tiny")
    (refused,) = [r async for r in app.log.read(types=["instance.load_refused"])]
    assert refused.event.reason == "engine_unverified"  # type: ignore[attr-defined]
    assert refused.event.observations["engine"] == "standin"  # type: ignore[attr-defined]
    assert [r async for r in app.log.read(types=["instance.starting"])] == []
    assert not marker.exists()


async def test_an_engine_directory_that_leads_out_of_the_home_is_refused_at_load(
        engine_home: tuple[Blazar, Path], tmp_path: Path) -> None:
    app, marker = engine_home
    root = app.paths.engines / "standin"
    moved = tmp_path / "elsewhere"
    shutil.move(root, moved)
    os.symlink(moved, root)  # byte for byte the installed engine, but no longer inside the home
    with pytest.raises(EngineVerifyFailed, match="outside"):
        active_engine(app)
    with pytest.raises(EngineVerifyFailed):
        await Supervisor(app).load("tiny")
    (refused,) = [r async for r in app.log.read(types=["instance.load_refused"])]
    assert refused.event.reason == "engine_unverified"  # type: ignore[attr-defined]
    assert not marker.exists()


@pytest.fixture
def one_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, list[EngineFile], list[Path]]:
    """engines/e1 with one 1000-byte file and its record; every hash the check makes is listed."""
    import hashlib

    engines = tmp_path / "engines"
    (engines / "e1").mkdir(parents=True)
    (engines / "e1" / "llama-server").write_bytes(b"x" * 1000)
    files = [EngineFile(path="llama-server", bytes=1000, sha256=hashlib.sha256(b"x" * 1000).hexdigest())]
    hashed: list[Path] = []
    real = engine_verify._sha256
    monkeypatch.setattr(engine_verify, "_sha256", lambda p: hashed.append(p) or real(p))
    return engines, files, hashed


def test_the_check_before_spawn_hashes_a_file_again_only_when_its_stat_changed(
        one_engine: tuple[Path, list[EngineFile], list[Path]], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    engines, files, hashed = one_engine
    binary = engines / "e1" / "llama-server"
    monkeypatch.setattr(engine_verify, "_now_ns", lambda: binary.stat().st_ctime_ns + 3600 * 10**9)  # an hour on
    for _ in range(3):
        verify_for_spawn(engines, "e1", files)
    assert hashed == [binary]  # once, then the cached verdict
    with binary.open("ab") as fh:
        fh.write(b"y")
    assert spawn_problems(engines, "e1", files) == ["llama-server: 1001 bytes, expected 1000"]
    replaced = engines / "e1" / ".new"
    replaced.write_bytes(b"z" * 1000)
    os.replace(replaced, binary)  # same size, another inode
    assert spawn_problems(engines, "e1", files) == ["llama-server: sha256 differs from the install record"]
    assert spawn_problems(engines, "e1", files) == ["llama-server: sha256 differs from the install record"]
    assert len(hashed) == 2  # the failure is cached too: a request storm does not hash it each time
    binary.unlink()
    os.symlink(tmp_path / "evil", binary)
    assert "outside" in spawn_problems(engines, "e1", files)[0]


def test_a_file_changed_within_the_clocks_tick_is_hashed_at_every_check(
        one_engine: tuple[Path, list[EngineFile], list[Path]]) -> None:
    """Racily clean (as git calls it): a file whose times are this recent is never trusted by its stat alone, so
    a same-size change with its mtime set back is still seen."""
    engines, files, hashed = one_engine
    binary = engines / "e1" / "llama-server"
    verify_for_spawn(engines, "e1", files)
    st = binary.stat()
    with binary.open("r+b") as fh:
        fh.write(b"y")
    os.utime(binary, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert binary.stat().st_size == 1000 and binary.stat().st_mtime_ns == st.st_mtime_ns
    assert spawn_problems(engines, "e1", files) == ["llama-server: sha256 differs from the install record"]
    assert len(hashed) == 2


# -- doctor ----------------------------------------------------------------------------------------------------------


async def test_doctor_names_the_events_it_would_not_trust(app: Blazar, outside: Path) -> None:
    from blazar.operations.doctor import trust

    assert trust.untrusted_paths(app).status == "ok"
    recs = await app.record([imported("victim", str(outside / "precious.txt")), installed("evil", "/tmp/evil.sh"),
                             EngineActivated(tag="evil", reason="use"), saved("s", "/tmp/x.bin")])
    check = trust.untrusted_paths(app)
    assert check.status == "fail" and check.fix is not None and f"before seq {recs[0].seq}" in check.fix
    for r in recs:
        assert f"seq {r.seq} {r.type}" in check.observation


async def test_doctor_leaves_a_young_unrecorded_save_alone_while_a_daemon_runs(app: Blazar) -> None:
    import time

    from blazar import runlock
    from blazar.operations.doctor import trust

    leftover = slot_dir(app.paths.data_dir, "gemma") / "ab.bin"
    leftover.parent.mkdir(parents=True)
    leftover.write_bytes(b"k" * 10)
    check = trust.kv_bank(app)
    assert check.status == "warn" and [a.path for a in check.actions] == [str(leftover)]
    with runlock.hold(app.paths.daemon_lock):  # a live daemon: a save may be writing this very file
        assert trust.kv_bank(app).status == "ok"
        old = time.time() - 3600
        os.utime(leftover, (old, old))
        assert trust.kv_bank(app).status == "warn"
