"""Reconciliation at daemon start, with the real engine: after the daemon is SIGKILLed with a child running, the next
daemon stops the orphan and records `orphan_stopped`; a child that died with it is recorded `lost`."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from tests.support.blazar_home import read_events
from tests.support.daemon import LOAD_TIMEOUT_S, alive, free_port, healthy, serving, wait_for
from tests.support.homes import record_probe


def _start_with_loaded_model(cli, home: Path, engine_binary: Path, gemma_path: Path):
    cli("engine", "install", "--path", str(engine_binary), timeout=120)
    cli("import", str(gemma_path), "--name", "gemma")
    record_probe(home, engine_binary, gemma_path, "gemma")  # its first load is no probe's (test_template_probe.py)
    return free_port()


def test_a_sigkilled_daemon_leaves_an_orphan_that_the_next_daemon_stops_and_records(
        cli, home: Path, engine_binary: Path, gemma_path: Path) -> None:
    port = _start_with_loaded_model(cli, home, engine_binary, gemma_path)
    with serving(cli, "--port", str(port)) as proc:
        wait_for(lambda: healthy(port), "/health", proc=proc)
        inst = cli("load", "gemma", "--ctx", "1024", "--json", timeout=LOAD_TIMEOUT_S).json()
        pid = cli("ps", "--json").json()["instances"][0]["pid"]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert alive(pid), "the engine child outlives a SIGKILLed daemon (it is in its own session)"
    # Without a daemon, ps shows what the log says: still running.
    assert [r["instance_id"] for r in cli("ps", "--json").json()["instances"]] == [inst["instance_id"]]

    with serving(cli, "--port", str(port)) as proc:
        wait_for(lambda: healthy(port), "/health after restart", proc=proc)
        wait_for(lambda: not alive(pid), "the orphan to be stopped", timeout=30)
        assert cli("ps", "--json").json()["instances"] == []
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    exits = [e for e in read_events(home) if e["type"] == "instance.exited"]
    assert [(e["data"]["instance_id"], e["data"]["reason"]) for e in exits] == [
        (inst["instance_id"], "orphan_stopped")]
    assert not list((home / "run" / "instances").glob("*.pid"))


def test_a_child_that_died_with_the_daemon_is_recorded_lost(
        cli, home: Path, engine_binary: Path, gemma_path: Path) -> None:
    port = _start_with_loaded_model(cli, home, engine_binary, gemma_path)
    with serving(cli, "--port", str(port)) as proc:
        wait_for(lambda: healthy(port), "/health", proc=proc)
        inst = cli("load", "gemma", "--ctx", "1024", "--json", timeout=LOAD_TIMEOUT_S).json()
        pid = cli("ps", "--json").json()["instances"][0]["pid"]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not alive(pid), "the child to die")

    with serving(cli, "--port", str(port)) as proc:
        wait_for(lambda: healthy(port), "/health after restart", proc=proc)
        assert cli("ps", "--json").json()["instances"] == []
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    exits = [e for e in read_events(home) if e["type"] == "instance.exited"]
    assert [(e["data"]["instance_id"], e["data"]["reason"]) for e in exits] == [(inst["instance_id"], "lost")]
