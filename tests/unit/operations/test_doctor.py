"""`blazar doctor`'s checks, one fault at a time, each made for real in a temp home: a model byte flipped, a file
deleted or left unrecorded, an event deleted behind the triggers' back, a database page overwritten, a clock behind
the log, a corrupt checkpoint, a stale run/daemon.json, a loose file mode, a bad config.toml, a taken port, and a
real process running an engine binary of the home that nobody owns; and `--fix` recording what it did, once."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import sqlite3
import subprocess
import time
from pathlib import Path

import orjson
import pytest

from blazar import runlock
from blazar.adapters.engines.process import free_port
from blazar.bootstrap import bootstrap
from blazar.clock import FakeClock
from blazar.operations.doctor import checks, machine, store
from blazar.operations.doctor.engine import OPTION_NEEDS, cpu_fit, cpu_flags
from blazar.operations.doctor.fix import apply_fixes
from blazar.operations.doctor.orphans import orphans
from blazar.operations.doctor.report import Check, exit_code
from blazar.store.models import import_model
from tests.support import gguf_factory
from tests.support.blazar_home import configure, home_paths, import_into, read_events
from tests.support.doctor import run_checks

SLEEP = shutil.which("sleep")


def fix(home: Path) -> list[dict]:
    found = list(run_checks(home).values())

    async def go() -> list[dict]:
        app = await bootstrap(paths=home_paths(home), env={}, actor="test:pytest", reconcile_config=False)
        try:
            return [r.to_json() for r in await apply_fixes(app, found)]
        finally:
            await app.close()

    return asyncio.run(go())


@pytest.fixture
def with_model(home: Path, tmp_path: Path) -> Path:
    """A home with one small real GGUF imported (hardlinked from `tmp_path/src`); returns its file in the store."""
    src = tmp_path / "src" / "tiny.gguf"
    src.parent.mkdir()
    gguf_factory.write_plain(src)
    import_into(home, src, "tiny:q8")
    (stored,) = [p for p in (home / "models").rglob("*") if p.is_file()]
    return stored


def statuses(found: dict[str, Check], *ids: str) -> list[str]:
    return [found[i].status for i in ids]


def test_a_healthy_home_passes_the_log_store_and_machine_checks(home: Path, with_model: Path) -> None:
    configure(home, "port", str(free_port()))  # the default port is taken whenever a gateway runs on this machine
    found = run_checks(home)
    healthy = ["log.integrity", "log.seq", "log.triggers", "log.schema", "log.clock", "log.checkpoints",
               "store.integrity", "store.missing", "store.unrecorded", "machine.file_modes", "machine.config",
               "machine.daemon_file", "machine.orphans", "machine.port"]
    assert statuses(found, *healthy) == ["ok"] * len(healthy), [found[i] for i in healthy]
    assert "sha256 and size of 1 file(s): all match" in found["store.integrity"].observation
    assert found["engine.active"].status == "fail" and "blazar engine install" in (found["engine.active"].fix or "")
    assert "engine.smoke" not in found  # nothing to smoke-test without an engine
    assert exit_code(found.values()) == 2


def test_a_flipped_byte_in_a_model_fails_the_store_check_in_full_and_quick(home: Path, with_model: Path) -> None:
    data = bytearray(with_model.read_bytes())
    data[len(data) // 2] ^= 0xFF
    with_model.write_bytes(bytes(data))  # same size: only the hash can tell
    for quick in (False, True):
        check = run_checks(home, quick=quick)["store.integrity"]
        assert check.status == "fail", check
        assert "tiny:q8" in check.observation and "sha256 differs" in check.observation
        assert "blazar rm tiny:q8" in (check.fix or "")
    assert "random sample" in run_checks(home, quick=True)["store.integrity"].observation


def test_quick_hashes_a_random_sample_within_its_budget_and_checks_every_size(
        home: Path, with_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(3):
        src = tmp_path / "src" / f"more{i}.gguf"
        gguf_factory.write_plain(src, seed=i + 1)
        import_into(home, src, f"more:{i}")
    monkeypatch.setattr(store, "QUICK_HASH_BYTES", 1)  # a budget any one file exceeds: one file is hashed
    found = run_checks(home, quick=True)
    assert found["store.integrity"].status == "ok"
    assert found["store.integrity"].observation.startswith("sha256 of 1 of 4 file(s) (--quick: a random sample)")
    assert found["log.integrity"].observation.startswith("PRAGMA quick_check: ok")
    assert run_checks(home)["log.integrity"].observation.startswith("PRAGMA integrity_check: ok")


def test_a_grown_file_is_caught_by_its_size(home: Path, with_model: Path) -> None:
    size = with_model.stat().st_size
    with with_model.open("ab") as fh:
        fh.write(b"\0" * 10)
    check = run_checks(home, quick=True)["store.integrity"]
    assert check.status == "fail" and f"{size + 10} bytes, recorded {size}" in check.observation


def test_a_deleted_model_file_and_an_unrecorded_one(home: Path, with_model: Path) -> None:
    with_model.unlink()
    stray = home / "models" / "stray.gguf"
    stray.write_bytes(b"GGUF")
    (home / "models" / ".partial").mkdir()
    (home / "models" / ".partial" / "pull-in-progress.gguf").write_bytes(b"x")  # a pull's own: never a stray
    found = run_checks(home)
    assert found["store.missing"].status == "fail" and str(with_model) in found["store.missing"].observation
    assert found["store.unrecorded"].status == "warn"
    assert str(stray) in found["store.unrecorded"].observation and "pull-in-progress" not in \
        found["store.unrecorded"].observation
    assert f"blazar import {stray}" in (found["store.unrecorded"].fix or "")


def test_an_event_deleted_behind_the_triggers_back_fails_seq_and_triggers(home: Path, with_model: Path,
                                                                         tmp_path: Path) -> None:
    import_into(home, tmp_path / "src" / "tiny.gguf", "tiny:again")
    db = home_paths(home).db
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT MAX(seq) FROM events").fetchone()[0] >= 2
        conn.execute("DROP TRIGGER events_no_delete")
        conn.execute("DELETE FROM events WHERE seq = 1")
    found = run_checks(home)
    assert found["log.seq"].status == "fail" and "seq 1 is missing" in found["log.seq"].observation
    assert found["log.triggers"].status == "fail" and "events_no_delete" in found["log.triggers"].observation
    assert "blazar restore" in (found["log.seq"].fix or "")
    # A log like that is not opened (opening it would migrate and append): the rest says it was not checked.
    assert found["engine.active"].status == "warn" and "not checked" in found["engine.active"].observation


def test_an_overwritten_database_page_fails_integrity(home: Path, with_model: Path) -> None:
    db = home_paths(home).db
    assert not db.with_name(db.name + "-wal").exists() or db.with_name(db.name + "-wal").stat().st_size == 0
    with db.open("r+b") as fh:
        fh.seek(4096 * 2)
        fh.write(b"\xa5" * 4096 * 2)
    found = run_checks(home)
    assert found["log.integrity"].status == "fail", found["log.integrity"]
    assert "blazar restore" in (found["log.integrity"].fix or "")


def test_a_schema_revision_this_blazar_does_not_know_fails(home: Path, with_model: Path) -> None:
    with sqlite3.connect(home_paths(home).db) as conn:
        conn.execute("UPDATE alembic_version SET version_num = 'f00dfeed'")
    found = run_checks(home)
    assert found["log.schema"].status == "fail" and "f00dfeed" in found["log.schema"].observation
    assert not checks.safe_to_open(list(found.values()))


def test_a_clock_behind_the_last_event_fails(home: Path, tmp_path: Path) -> None:
    src = tmp_path / "m.gguf"
    gguf_factory.write_plain(src)

    async def record_from_the_future() -> None:
        app = await bootstrap(paths=home_paths(home), env={}, actor="test:pytest",
                              clock=FakeClock(start=time.time() + 3600))
        try:
            await import_model(app, src, "future")
        finally:
            await app.close()

    asyncio.run(record_from_the_future())
    check = run_checks(home)["log.clock"]
    assert check.status == "fail" and "before the last event" in check.observation


def test_a_corrupt_checkpoint_warns_and_the_projection_folds_from_the_log(home: Path, with_model: Path) -> None:
    async def checkpoint() -> None:
        app = await bootstrap(paths=home_paths(home), env={}, actor="test:pytest")
        try:
            await app.runner.checkpoint()
        finally:
            await app.close()

    asyncio.run(checkpoint())
    assert run_checks(home)["log.checkpoints"].status == "ok"
    with sqlite3.connect(home_paths(home).db) as conn:
        assert conn.execute("UPDATE checkpoints SET state = '{\"models\": {}}' WHERE name = 'catalog'").rowcount == 1
    check = run_checks(home)["log.checkpoints"]
    assert check.status == "warn" and "catalog: rebuilt: checkpoint corrupt (sha256 mismatch)" in check.observation
    assert run_checks(home)["store.integrity"].status == "ok"  # the catalog folded from the log still knows tiny:q8


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_a_stale_daemon_file_warns_and_fix_removes_it_records_it_once(home: Path, with_model: Path) -> None:
    paths = home_paths(home)
    dead = _dead_pid()
    (paths.run / "daemon.json").write_bytes(orjson.dumps({"pid": dead, "host": "127.0.0.1", "port": 1,
                                                          "started": 0.0}))
    (paths.run / "admin.token").write_text("blz_admin_stale")
    check = run_checks(home)["machine.daemon_file"]
    assert check.status == "warn" and f"pid {dead} is not running" in check.observation
    assert exit_code([check]) == 1

    fixed = fix(home)
    assert [(e["type"], e["data"]["action"], Path(e["data"]["target"]).name) for e in fixed] == [
        ("doctor.fixed", "removed_file", "daemon.json"), ("doctor.fixed", "removed_file", "admin.token")]
    assert all(e["data"]["pid"] == dead and e["data"]["check"] == "machine.daemon_file" for e in fixed)
    assert not (paths.run / "daemon.json").exists() and not (paths.run / "admin.token").exists()
    assert run_checks(home)["machine.daemon_file"].status == "ok"
    assert fix(home) == []  # idempotent: nothing left to do, nothing recorded
    assert len(read_events(home, "doctor.fixed")) == 2


def test_the_daemon_file_of_a_live_daemon_is_left_alone(home: Path, with_model: Path) -> None:
    paths = home_paths(home)
    with runlock.hold(paths.daemon_lock):  # this process plays the daemon: it holds the lock
        (paths.run / "daemon.json").write_bytes(orjson.dumps({"pid": os.getpid(), "host": "127.0.0.1", "port": 1,
                                                              "started": 0.0}))
        seen = machine.see_daemon(paths)
        check = machine.daemon_file(paths, seen)
        assert check.status == "ok" and check.actions == () and f"pid {os.getpid()}" in check.observation
        assert machine.port("127.0.0.1", 1, seen).observation.endswith(f"held by our daemon (pid {os.getpid()})")
    assert (paths.run / "daemon.json").exists()


def test_a_loose_mode_and_a_bad_config_are_named(home: Path, with_model: Path) -> None:
    paths = home_paths(home)
    paths.config_file.write_text('[server]\nport = "not a number"\n')
    paths.config_file.chmod(0o644)
    found = run_checks(home)
    assert found["machine.file_modes"].status == "warn"
    assert f"{paths.config_file} (0644)" in found["machine.file_modes"].observation
    assert found["machine.file_modes"].fix == f"chmod 600 {paths.config_file}"
    assert found["machine.config"].status == "fail" and "port" in found["machine.config"].observation
    paths.run.chmod(0o755)
    assert f"chmod 700 {paths.run}" in (run_checks(home)["machine.file_modes"].fix or "")


def test_a_port_another_program_listens_on_warns(home: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        check = machine.port("127.0.0.1", port, machine.see_daemon(home_paths(home)))
    assert check.status == "warn" and "in use by another program" in check.observation
    assert "blazar config set server.port" in (check.fix or "")


def test_disk_free_against_its_thresholds(home: Path) -> None:
    assert "GiB free of" in machine.disk("home", home).observation
    assert machine.disk("home", home, warn_below=1 << 62).status == "warn"
    failing = machine.disk("home", home / "not" / "yet", warn_below=1 << 62, fail_below=1 << 61)
    assert failing.status == "fail" and f"under {home / 'not' / 'yet'}" in failing.observation


def _fake_engine(home: Path) -> Path:
    """A real executable in the home's engine store (sleep, under llama-server's name): what the orphan check
    identifies children by is their executable's place, so this is one."""
    assert SLEEP is not None
    binary = home_paths(home).engines / "fake-tag" / "llama-server"
    binary.parent.mkdir(parents=True)
    shutil.copy2(SLEEP, binary)
    return binary


def _wait_gone(pid: int) -> bool:
    for _ in range(200):
        if not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "Z":
            return True
        time.sleep(0.05)
    return False


@pytest.mark.skipif(SLEEP is None, reason="no sleep binary")
def test_an_orphan_engine_process_fails_and_fix_stops_it_and_records_it(home: Path, with_model: Path) -> None:
    binary = _fake_engine(home)
    # Started by a shell that exits at once: the process is reparented, as a dead daemon's children are.
    out = subprocess.run(["sh", "-c", f"'{binary}' 300 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True,
                         check=True, timeout=10)
    pid = int(out.stdout.strip())
    try:
        check = run_checks(home)["machine.orphans"]
        assert check.status == "fail" and f"pid {pid} {binary}" in check.observation, check
        assert "is not a Blazar process" in check.observation

        fixed = fix(home)
        assert [(e["data"]["action"], e["data"]["pid"], e["data"]["target"]) for e in fixed] == [
            ("stopped_process", pid, str(binary))]
        assert _wait_gone(pid)
        assert run_checks(home)["machine.orphans"].status == "ok"
        assert fix(home) == []
        assert [e["data"]["pid"] for e in read_events(home, "doctor.fixed")] == [pid]
    finally:
        subprocess.run(["kill", "-9", str(pid)], capture_output=True, check=False)


@pytest.mark.skipif(SLEEP is None, reason="no sleep binary")
def test_an_engine_process_whose_parent_is_our_daemon_is_no_orphan(home: Path, tmp_path: Path) -> None:
    binary = _fake_engine(home)
    proc = subprocess.Popen([str(binary), "300"])
    stranger = tmp_path / "elsewhere" / "llama-server"
    stranger.parent.mkdir()
    shutil.copy2(binary, stranger)
    other = subprocess.Popen([str(stranger), "300"])  # another home's engine: never ours to name
    try:
        owned = orphans(home_paths(home).engines, daemon_pid=os.getpid())  # this process plays the daemon
        assert owned.status == "ok" and "1 engine process(es)" in owned.observation
        orphaned = orphans(home_paths(home).engines, daemon_pid=None)  # no daemon: pytest is not a Blazar process
        assert orphaned.status == "fail" and [a.pid for a in orphaned.actions] == [proc.pid]
    finally:
        for p in (proc, other):
            p.kill()
            p.wait(timeout=10)


def test_build_options_against_the_cpu_flags() -> None:
    flags = cpu_flags()
    portable = ["-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON", "-DGGML_AVX512=OFF"]
    if {"avx", "avx2", "fma", "f16c"} <= flags:
        assert cpu_fit("t", portable, flags).status == "ok"
    lacking = next((opt for opt, flag in OPTION_NEEDS.items() if flag not in flags), None)
    if lacking is not None:  # an option this very CPU cannot run
        check = cpu_fit("t", [*portable, lacking], flags)
        assert check.status == "fail" and lacking in check.observation and "blazar engine build" in (check.fix or "")
    assert cpu_fit("t", ["-DGGML_NATIVE=ON"], frozenset({"avx2"})).status == "warn"
    assert cpu_fit("t", [], flags).status == "ok"
    assert cpu_fit("t", ["-DGGML_AVX512=ON"], frozenset({"avx2"})).status == "fail"


def test_the_exit_code_is_the_worst_status() -> None:
    good = Check("log", "a", "ok", "")
    assert exit_code([good]) == 0
    assert exit_code([good, Check("log", "b", "warn", "")]) == 1
    assert exit_code([Check("log", "c", "fail", ""), good, Check("log", "b", "warn", "")]) == 2


def test_a_projector_is_a_recorded_file_checked_like_a_model(home: Path, with_model: Path, tmp_path: Path) -> None:
    from tests.support.tiny_mmproj import write_tiny_mmproj

    async def go() -> None:
        from blazar.store.projectors import set_projector

        app = await bootstrap(paths=home_paths(home), env={}, actor="test:pytest")
        try:
            await set_projector(app, "tiny:q8", write_tiny_mmproj(tmp_path / "mmproj.gguf", n_embd=64))
        finally:
            await app.close()

    asyncio.run(go())
    found = run_checks(home)
    assert statuses(found, "store.integrity", "store.unrecorded") == ["ok", "ok"]
    assert "sha256 and size of 2 file(s): all match" in found["store.integrity"].observation
    (proj,) = (home / "models" / "mmproj").glob("*.gguf")
    data = bytearray(proj.read_bytes())
    data[-1] ^= 0xFF
    proj.write_bytes(bytes(data))
    found = run_checks(home)
    assert found["store.integrity"].status == "fail" and str(proj) in found["store.integrity"].observation
