"""`blazar doctor` end to end, the real CLI in a subprocess against a home with the real engine installed and the
real Gemma imported: all ok (the smoke test and the CPU check included), exit codes 0/1/2 and the --json shape; a
corrupted engine file; and the orphan a SIGKILLed daemon leaves behind, found and stopped by --fix, recorded once."""

from __future__ import annotations

import os
import signal
import sqlite3
from pathlib import Path

import orjson

from tests.conftest import Cli
from tests.support.blazar_home import read_events
from tests.support.daemon import LOAD_TIMEOUT_S, alive, free_port, healthy, serving, wait_for

DOCTOR_TIMEOUT_S = 180


def _home_with_engine(cli: Cli, engine_binary: Path, gemma_path: Path) -> int:
    cli("engine", "install", "--path", str(engine_binary), timeout=120)
    cli("import", str(gemma_path), "--name", "gemma")
    port = free_port()
    cli("config", "set", "server.port", str(port))
    return port


def _doctor(cli: Cli, *args: str) -> tuple[int, dict]:
    res = cli("doctor", "--json", *args, check=False, timeout=DOCTOR_TIMEOUT_S)
    assert res.code in (0, 1, 2), res.stderr
    report = res.json()
    assert report["exit_code"] == res.code
    return res.code, report


def _by_id(report: dict) -> dict[str, dict]:
    return {c["check"]: c for c in report["checks"]}


def _not_disk(report: dict) -> dict[str, str]:
    """Every check's status but disk free, which is this machine's and not the test's to set."""
    return {c["check"]: c["status"] for c in report["checks"] if not c["name"].startswith("disk_")}


def test_a_home_with_the_real_engine_is_healthy_and_a_corrupted_engine_file_fails(
        cli: Cli, home: Path, engine_binary: Path, gemma_path: Path) -> None:
    _home_with_engine(cli, engine_binary, gemma_path)
    code, report = _doctor(cli)
    assert set(_not_disk(report).values()) == {"ok"}, [c for c in report["checks"] if c["status"] != "ok"]
    assert code == {"ok": 0, "warn": 1, "fail": 2}[report["status"]]
    checks = _by_id(report)
    for name in ("engine.active", "engine.files", "engine.cpu", "engine.smoke", "store.integrity", "log.seq",
                 "log.triggers", "log.schema", "log.checkpoints", "machine.orphans", "machine.port", "machine.gpu",
                 "engine.backend"):
        assert set(checks[name]) == {"check", "area", "name", "status", "observation", "fix", "fixable"}
    assert "generated" in checks["engine.smoke"]["observation"]
    assert "avx2" in checks["engine.cpu"]["observation"]
    assert report["fixed"] == []
    assert not list((home / "run").glob("doctor-smoke-*"))  # the smoke test's directory is gone
    events_before = len(read_events(home))

    plain = cli("doctor", check=False, timeout=DOCTOR_TIMEOUT_S)  # piped: plain lines, not a table
    assert plain.code == code
    assert any(line.startswith("ok    engine.smoke") for line in plain.stdout.splitlines()), plain.stdout
    assert len(read_events(home)) == events_before  # without --fix, doctor records nothing

    (tag_dir,) = [p for p in (home / "engines").iterdir() if p.is_dir() and not p.name.startswith(".")]
    binary = tag_dir / "llama-server"
    data = bytearray(binary.read_bytes())
    data[-100] ^= 0xFF  # a byte near the end (a section the loader does not need): the file no longer verifies
    binary.write_bytes(bytes(data))
    code, report = _doctor(cli)
    assert code == 2 and report["status"] == "fail"
    files = _by_id(report)["engine.files"]
    assert files["status"] == "fail" and "sha256 differs" in files["observation"]
    assert "blazar engine rollback" in files["fix"]


def test_a_stale_daemon_file_is_exit_code_1_and_fix_records_it_once(
        cli: Cli, home: Path, engine_binary: Path, gemma_path: Path) -> None:
    _home_with_engine(cli, engine_binary, gemma_path)
    (home / "run" / "daemon.json").write_bytes(orjson.dumps({"pid": 2 ** 22 + 1, "host": "127.0.0.1",
                                                             "port": 1, "started": 0.0}))
    code, report = _doctor(cli)
    statuses = _not_disk(report)
    assert statuses.pop("machine.daemon_file") == "warn" and set(statuses.values()) == {"ok"}
    disk_failing = any(c["status"] == "fail" for c in report["checks"])
    assert code == (2 if disk_failing else 1)  # a warning alone is exit code 1
    stale = _by_id(report)["machine.daemon_file"]
    assert stale["status"] == "warn" and stale["fixable"] and "blazar doctor --fix" in stale["fix"]

    code, report = _doctor(cli, "--fix")
    assert [(f["type"], f["action"], Path(f["target"]).name) for f in report["fixed"]] == [
        ("doctor.fixed", "removed_file", "daemon.json")]
    assert _by_id(report)["machine.daemon_file"]["status"] == "ok"
    assert code == {"ok": 0, "warn": 1, "fail": 2}[report["status"]]
    assert not (home / "run" / "daemon.json").exists()
    _, again = _doctor(cli, "--fix")
    assert again["fixed"] == []
    (recorded,) = read_events(home, "doctor.fixed")
    assert recorded["seq"] == report["fixed"][0]["seq"] and recorded["data"]["pid"] == 2 ** 22 + 1


def test_the_orphan_a_sigkilled_daemon_leaves_is_found_and_fix_stops_it(
        cli: Cli, home: Path, engine_binary: Path, gemma_path: Path) -> None:
    port = _home_with_engine(cli, engine_binary, gemma_path)
    with serving(cli, "--port", str(port)) as proc:
        wait_for(lambda: healthy(port), "/health", proc=proc)
        cli("load", "gemma", "--ctx", "1024", "--json", timeout=LOAD_TIMEOUT_S)
        pid = cli("ps", "--json").json()["instances"][0]["pid"]
        _, live = _doctor(cli)
        checks = _by_id(live)
        assert checks["machine.orphans"]["status"] == "ok", checks["machine.orphans"]
        assert f"the daemon (pid {proc.pid})" in checks["machine.orphans"]["observation"]
        assert checks["machine.port"]["observation"].endswith(f"held by our daemon (pid {proc.pid})")
        assert checks["machine.daemon_file"]["status"] == "ok"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    try:
        assert alive(pid)
        code, report = _doctor(cli)
        checks = _by_id(report)
        assert code == 2 and checks["machine.orphans"]["status"] == "fail"
        assert f"pid {pid} " in checks["machine.orphans"]["observation"] and checks["machine.orphans"]["fixable"]
        assert checks["machine.daemon_file"]["status"] == "warn"

        code, report = _doctor(cli, "--fix")
        done = {(f["action"], f["check"]) for f in report["fixed"]}
        assert ("stopped_process", "machine.orphans") in done and ("removed_file", "machine.daemon_file") in done
        assert not alive(pid)
        checks = _by_id(report)
        assert checks["machine.orphans"]["status"] == "ok" and checks["machine.daemon_file"]["status"] == "ok"
        stopped = [e for e in read_events(home, "doctor.fixed") if e["data"]["action"] == "stopped_process"]
        assert [e["data"]["pid"] for e in stopped] == [pid]
        assert stopped[0]["data"]["target"].startswith(str(home / "engines"))

        _, again = _doctor(cli, "--fix")
        assert again["fixed"] == [] and len(read_events(home, "doctor.fixed")) == len(report["fixed"])
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_fix_does_nothing_to_a_home_whose_log_is_not_safe_to_open(cli: Cli, home: Path) -> None:
    cli("config", "set", "server.port", str(free_port()))
    cli("config", "set", "engine.stop_grace_s", "3")
    with sqlite3.connect(home / "blazar.db") as conn:
        conn.execute("DROP TRIGGER events_no_update")  # the log can no longer prove it was not edited
    stale = home / "run" / "daemon.json"
    stale.write_bytes(orjson.dumps({"pid": 2 ** 22 + 1, "host": "127.0.0.1", "port": 1, "started": 0.0}))
    res = cli("doctor", "--fix", check=False, timeout=DOCTOR_TIMEOUT_S)
    assert res.code == 2 and "nothing done: the log is not safe to open" in res.stderr
    assert "fail  log.triggers" in res.stdout and "events_no_update" in res.stdout
    assert "not checked" in res.stdout
    assert stale.exists() and read_events(home, "doctor.fixed") == []
