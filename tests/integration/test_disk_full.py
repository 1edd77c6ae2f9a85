"""A full disk under the home, for real (a tmpfs of a few MiB filled to the last byte: tests/support/small_disk.py):
every CLI command ends in one line naming the disk, exit code 12, no traceback; `doctor` says "disk full", not "log
damaged", and never advises a restore, with or without the daemon; the daemon keeps serving a loaded model, holds the
request events it cannot write, says so on `/ready` (503, the `log` check) while `/health` stays 200, and writes
every one of them once there is room again."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest

from blazar.adapters.engines.tiny_model import write_tiny_model
from tests.conftest import Cli, CliResult
from tests.support import cli_zygote
from tests.support.daemon import free_port, healthy, start_serve, wait_for
from tests.support.small_disk import fill, free, small_disk

DISK_FULL_EXIT = 12


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    with small_disk(tmp_path / "disk", 64) as d:  # room for the engine (about 18 MB), the tiny model and the log
        yield d


def assert_one_line_naming_the_disk(res: CliResult, disk: Path) -> None:
    assert res.code == DISK_FULL_EXIT, (res.code, res.stdout, res.stderr)
    assert "Traceback" not in res.stderr
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith("error: no space left on the disk holding ")
    assert f"on the filesystem mounted at {disk}" in line and "B free of" in line and "needs at least" in line


def events_of(cli: Cli, type_: str) -> list[dict[str, Any]]:
    return cli("events", "--type", type_, "--json").json_lines()


def checks_of(res: CliResult) -> dict[str, dict[str, Any]]:
    return {c["check"]: c for c in json.loads(res.stdout)["checks"]}


def assert_no_restore_advised(checks: dict[str, dict[str, Any]]) -> None:
    advised = [c["check"] for c in checks.values() if "blazar restore" in (c["fix"] or "")]
    assert advised == []


def test_every_command_on_a_full_disk_ends_in_one_line_and_the_log_is_intact(disk: Path) -> None:
    cli = Cli(disk / "home")
    cli("config", "set", "server.port", "11500")
    filler = fill(disk)
    for args in (["list"], ["config", "set", "server.port", "11501"], ["snapshot"], ["keys", "create", "app"]):
        assert_one_line_naming_the_disk(cli(*args, check=False), disk)
    # doctor: the disk is full, the log is intact (read as it stands on disk), and no restore is advised.
    res = cli("doctor", "--json", check=False)
    assert res.code == 2 and "Traceback" not in res.stderr
    checks = checks_of(res)
    assert checks["log.integrity"]["status"] == "warn" and "the log is intact" in checks["log.integrity"]["observation"]
    assert "do not restore" in checks["log.integrity"]["fix"]
    assert checks["machine.disk_home"]["status"] == "fail"
    assert "full" in checks["engine.active"]["observation"]
    assert_no_restore_advised(checks)
    # Space again: the same commands work, and nothing the full disk met was half-written.
    free(disk)
    assert filler.exists() is False
    cli("config", "set", "server.port", "11501")
    assert [e["data"]["new"] for e in events_of(cli, "config.changed")] == [11500, 11501]
    assert not list((disk / "home").glob(".config.toml.*.tmp"))
    assert checks_of(cli("doctor", "--json", check=False))["log.integrity"]["status"] == "ok"


@dataclass
class Daemon:
    cli: Cli
    port: int
    proc: subprocess.Popen[bytes] | cli_zygote.Process
    stderr: Path

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def ready(self) -> httpx2.Response:
        return httpx2.get(f"{self.base}/ready", trust_env=False, timeout=60)

    def chat(self) -> str:
        client = openai.OpenAI(base_url=f"{self.base}/v1", api_key="x", max_retries=0, timeout=60)
        raw = client.chat.completions.with_raw_response.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
        assert raw.parse().choices[0].message.content is not None
        return raw.headers["x-blazar-trace-id"]


@pytest.fixture
def daemon(disk: Path, tmp_path: Path, engine_binary: Path) -> Iterator[Daemon]:
    """The real daemon with the real engine, its home on the small disk (its stderr is not)."""
    cli = Cli(disk / "home")
    cli("engine", "install", "--path", str(engine_binary), timeout=120)
    tiny = write_tiny_model(tmp_path / "tiny.gguf")
    cli("import", str(tiny), "--name", "tiny")
    cli("import", str(tiny), "--name", "spare")  # never loaded before the disk fills
    port = free_port()
    stderr = tmp_path / "daemon.stderr"
    proc = start_serve(cli.home, "--port", str(port), log=stderr, env=cli.env)
    d = Daemon(cli, port, proc, stderr)
    try:
        try:
            wait_for(lambda: healthy(port), "/health", proc=proc)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{stderr.read_text(errors='replace')[-8000:]}") from None
        yield d
    finally:
        if (disk / "filler").exists():
            free(disk)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def test_the_daemon_on_a_full_disk_is_degraded_on_ready_and_loses_no_request_event(daemon: Daemon, disk: Path) -> None:
    wait_for(lambda: daemon.ready().status_code == 200, "/ready before the disk fills", timeout=120)
    assert daemon.ready().json()["checks"]["log"] == {"ok": True, "pending": 0, "dropped": 0, "max_pending": 200000}
    traces = [daemon.chat()]  # the model is loaded before the disk fills
    fill(disk)
    traces += [daemon.chat() for _ in range(3)]  # served: only their events wait

    def degraded() -> dict[str, Any] | None:
        r = daemon.ready()
        return r.json() if r.status_code == 503 and not r.json()["checks"]["log"]["ok"] else None

    body = wait_for(degraded, "/ready to report the events held in memory")
    log_check = body["checks"]["log"]
    assert body["status"] == "not_ready" and log_check["reason"] == "disk_full" and log_check["pending"] > 0
    assert f"on the filesystem mounted at {disk}" in log_check["detail"] and log_check["dropped"] == 0
    assert httpx2.get(f"{daemon.base}/health", trust_env=False).status_code == 200  # a liveness probe: still up

    # doctor with the daemon running: no crash, "disk full" and an intact log, no restore advised.
    res = daemon.cli("doctor", "--json", check=False)
    assert res.code == 2 and "Traceback" not in res.stderr, res.stderr
    checks = checks_of(res)
    assert checks["log.integrity"]["status"] == "ok" and checks["machine.disk_home"]["status"] == "fail"
    assert checks["engine.smoke"]["status"] == "warn" and "full" in checks["engine.smoke"]["observation"]
    assert_no_restore_advised(checks)
    # A load needs the disk (its events, the engine's key file): 507 disk_full, in the caller's dialect.
    load = httpx2.post(f"{daemon.base}/api/blazar/load", json={"model": "spare"}, trust_env=False, timeout=60)
    assert load.status_code == 507 and load.json()["error"]["code"] == "disk_full"
    assert f"on the filesystem mounted at {disk}" in load.json()["error"]["message"]
    with pytest.raises(openai.APIStatusError) as refused:
        openai.OpenAI(base_url=f"{daemon.base}/v1", api_key="x", max_retries=0, timeout=60).chat.completions.create(
            model="spare", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert refused.value.status_code == 507 and "no space left on the disk" in refused.value.message
    # The commands that write: config.toml, a snapshot, an event appended while the daemon holds the log.
    for args in (["config", "set", "server.port", "11501"], ["snapshot"], ["keys", "create", "app"]):
        assert_one_line_naming_the_disk(daemon.cli(*args, check=False), disk)

    free(disk)
    wait_for(lambda: daemon.ready().status_code == 200, "/ready once there is room again", timeout=120)
    assert daemon.ready().json()["checks"]["log"]["pending"] == 0
    completed = {e["trace_id"] for e in events_of(daemon.cli, "request.completed")}
    assert set(traces) <= completed  # every request's events reached the log
    httpx2.post(f"{daemon.base}/api/blazar/load", json={"model": "spare"}, trust_env=False,
                timeout=120).raise_for_status()  # with room again, the load refused before works

    # Stopping while the disk is full again: the writer gives up after its bounded retries, and says what it lost.
    fill(disk)
    daemon.chat()
    wait_for(degraded, "the next events to be held")
    daemon.proc.send_signal(signal.SIGTERM)
    assert daemon.proc.wait(timeout=60) == 0
    assert "request event(s) the log could not take" in daemon.stderr.read_text()

