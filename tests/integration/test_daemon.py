"""The real `blazar serve` in a subprocess (no engine needed): it listens, says where in run/daemon.json, refuses a
second daemon and a taken port with distinct exit codes, and stops cleanly on SIGTERM and SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import time
from pathlib import Path

import httpx2
import pytest

from blazar.adapters.engines.tiny_model import write_tiny_model as write_tiny_gguf
from blazar.bootstrap import bootstrap, build_services
from blazar.daemon import PortInUse, serve
from blazar.daemon_file import read_daemon_file
from blazar.errors import DaemonRunning, NoEngine
from blazar.events.instances import ModelCircuitOpened
from blazar.instances.supervisor import LoadFailed, ModelNotLoaded
from blazar.operations.config import set_value
from blazar.paths import Paths
from tests.support.daemon import WAIT_S, free_port, healthy, serving, wait_for


def daemon_json(home: Path) -> Path:
    return home / "run" / "daemon.json"


def stop_pid(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)


def test_serve_listens_writes_daemon_json_and_sigterm_stops_it_cleanly(cli, home: Path) -> None:
    port = free_port()
    with serving(cli, "--port", str(port)) as proc:
        info = json.loads(wait_for(lambda: daemon_json(home).exists() and daemon_json(home).read_text(),
                                   "daemon.json", proc=proc))
        assert info["pid"] == proc.pid
        assert (info["host"], info["port"]) == ("127.0.0.1", port)
        wait_for(lambda: healthy(port), "/health", proc=proc)
        r = httpx2.get(f"http://127.0.0.1:{port}/health", trust_env=False)
        assert r.json() == {"status": "ok"}

        ps = cli("ps", "--json").json()
        assert ps["daemon"] == {"pid": proc.pid, "url": f"http://127.0.0.1:{port}"}
        assert ps["instances"] == []

        # The CLI maps the daemon's error codes back to the exit codes it would use itself.
        res = cli("stop", "nosuch", check=False)
        assert res.code == ModelNotLoaded.exit_code
        assert "not loaded" in res.stderr
        res = cli("load", "nosuch", check=False)
        assert res.code == 2
        assert "no model named 'nosuch'" in res.stderr

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=WAIT_S) == 0
    assert not daemon_json(home).exists()
    assert not healthy(port)


def test_sigint_stops_it_cleanly_too(cli, home: Path) -> None:
    port = free_port()
    with serving(cli, "--port", str(port)) as proc:
        wait_for(lambda: healthy(port), "/health", proc=proc)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=WAIT_S) == 0
        assert "stopped" in proc.stderr.read()
    assert not daemon_json(home).exists()


def test_a_second_daemon_on_the_same_home_exits_daemon_running(cli, home: Path) -> None:
    port = free_port()
    with serving(cli, "--port", str(port)) as proc:
        wait_for(lambda: healthy(port), "/health", proc=proc)
        res = cli("serve", "--port", str(free_port()), check=False, timeout=WAIT_S)
        assert res.code == DaemonRunning.exit_code
        assert f"pid {proc.pid}" in res.stderr
        assert "already running" in res.stderr
        # The refused one touched nothing: the first still serves, and its daemon.json is intact.
        assert healthy(port)
        assert json.loads(daemon_json(home).read_text())["pid"] == proc.pid
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=WAIT_S) == 0


def test_a_taken_port_exits_with_the_port_in_use_code_and_says_so(cli, home: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        res = cli("serve", "--port", str(port), check=False, timeout=WAIT_S)
    assert res.code == PortInUse.exit_code == 8
    assert f"127.0.0.1:{port} is already in use" in res.stderr
    assert "--port" in res.stderr
    assert not daemon_json(home).exists()


def test_load_starts_a_daemon_in_the_background_when_none_runs(cli, home: Path) -> None:
    port = free_port()
    cli("config", "set", "server.port", str(port))
    try:
        res = cli("load", "nosuch", check=False, timeout=WAIT_S + 30)
        assert "starting one in the background" in res.stderr
        assert f"daemon started on http://127.0.0.1:{port}" in res.stderr
        assert res.code == 2  # the daemon answered: model_not_found
        assert healthy(port)
        assert (home / "log" / "daemon.log").exists()
        # A second command finds it rather than starting another.
        res = cli("ps")
        assert "starting" not in res.stderr
        assert "nothing is loaded" in res.stdout
        # The daemon sees what other processes record after it started: an import makes the model known to it
        # (with no engine installed, the load now stops at the engine, not at the name).
        write_tiny_gguf(home.parent / "tiny.gguf")
        cli("import", str(home.parent / "tiny.gguf"), "--name", "late")
        res = cli("load", "late", check=False, timeout=WAIT_S)
        assert res.code == NoEngine.exit_code and "blazar engine" in res.stderr
    finally:
        info = daemon_json(home)
        if info.exists():
            stop_pid(json.loads(info.read_text())["pid"])
    assert not healthy(port)


def test_without_a_daemon_ps_reads_the_log_and_stop_says_nothing_is_loaded(cli) -> None:
    res = cli("ps")
    assert "nothing is loaded: the daemon is not running" in res.stdout
    assert cli("ps", "--json").json() == {"daemon": None, "instances": [], "circuits": {}}
    res = cli("stop", "gemma", check=False)
    assert res.code == ModelNotLoaded.exit_code
    assert "no daemon is running" in res.stderr


@pytest.mark.parametrize("args", [("load", "m", "--keep-alive", "5x")])
def test_a_bad_keep_alive_is_refused_before_any_daemon_starts(cli, home: Path, args: tuple[str, ...]) -> None:
    res = cli(*args, check=False)
    assert res.code == 2
    assert "not a duration" in res.stderr
    assert not daemon_json(home).exists()


def _open_circuit(home: Path, model: str) -> None:
    """What the supervisor records after repeated crashes, written straight into `home`'s log."""
    async def go() -> None:
        app = await bootstrap(paths=Paths.from_env({"BLAZAR_HOME": str(home)}), actor="test:pytest")
        try:
            await app.record(ModelCircuitOpened(model=model, crashes=3, window_s=60,
                                                 open_until=app.clock.now() + 3600, last_exit_code=-4))
        finally:
            await app.close()

    asyncio.run(go())


def test_ps_reset_closes_an_open_circuit_with_and_without_a_daemon(cli, home: Path) -> None:
    _open_circuit(home, "m1")
    res = cli("ps")
    assert "m1: loads refused after repeated crashes" in res.stdout
    assert "blazar ps --reset m1" in res.stdout
    assert cli("ps", "--reset", "m1", "--json").json() == {"model": "m1", "reset": True}
    assert cli("ps", "--reset", "m1", "--json").json() == {"model": "m1", "reset": False}
    assert cli("ps", "--json").json()["circuits"] == {}

    _open_circuit(home, "m2")
    port = free_port()
    with serving(cli, "--port", str(port)) as proc:
        wait_for(lambda: healthy(port), "/health", proc=proc)
        assert list(cli("ps", "--json").json()["circuits"]) == ["m2"]
        assert "circuit closed" in cli("ps", "--reset", "m2").stdout
        assert cli("ps", "--json").json()["circuits"] == {}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=WAIT_S) == 0


def test_load_ps_stop_through_the_daemon_with_the_real_engine(cli, home: Path, engine_binary: Path,
                                                               gemma_path: Path) -> None:
    cli("engine", "install", "--path", str(engine_binary), timeout=120)
    cli("import", str(gemma_path), "--name", "gemma")
    port = free_port()
    with serving(cli, "--port", str(port)) as proc:
        wait_for(lambda: healthy(port), "/health", proc=proc)
        inst = cli("load", "gemma", "--keep-alive", "10m", "--ctx", "1024", "--json", timeout=240).json()
        assert inst["model"] == "gemma" and inst["ctx_tokens"] == 1024
        engine = httpx2.get(f"http://127.0.0.1:{inst['port']}/health", timeout=5, trust_env=False)
        assert engine.status_code == 200

        rows = cli("ps", "--json").json()["instances"]
        assert [(r["model"], r["state"], r["port"], r["keep_alive_s"]) for r in rows] == [
            ("gemma", "ready", inst["port"], 600.0)]
        table = cli("ps").stdout
        # ten minutes from the load, less the moments since: rounded either way
        assert "EXPIRES" in table and "gemma" in table and re.search(r"\bin (10m|9m(\d+s)?)\s", table), table
        pid = rows[0]["pid"]

        # Loading again reuses the instance; --pin pins it.
        again = cli("load", "gemma", "--pin", "--json").json()
        assert again["instance_id"] == inst["instance_id"]
        assert cli("ps", "--json").json()["instances"][0]["pinned"] is True

        assert cli("stop", "gemma", "--json").json() == {"model": "gemma", "stopped": [inst["instance_id"]]}
        assert cli("ps", "--json").json()["instances"] == []
        wait_for(lambda: not Path(f"/proc/{pid}").exists(), "the engine to exit", timeout=15)

        # SIGTERM with an instance loaded stops the engine too.
        inst = cli("load", "gemma", "--ctx", "1024", "--json", timeout=240).json()
        pid = cli("ps", "--json").json()["instances"][0]["pid"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=WAIT_S) == 0
    assert not Path(f"/proc/{pid}").exists()
    assert cli("ps", "--json").json()["instances"] == []


class _StuckSupervisor:
    """A load that only ends when the supervisor closes (an engine that never turns healthy)."""

    def __init__(self, app) -> None:
        self.closed = asyncio.Event()
        self.started = False
        self.close_calls = 0

    async def start(self) -> None:
        self.started = True

    async def load(self, model, *, keep_alive=None, pinned=None, ctx=None, session=False):
        await self.closed.wait()
        raise LoadFailed(f"{model} exited (shutdown)")

    async def stop(self, model):
        return []

    async def reset(self, model):
        return False

    def ps(self):
        return []

    async def close(self) -> None:
        self.close_calls += 1
        self.closed.set()


async def test_sigterm_with_a_load_in_flight_stops_the_engines_after_the_grace(app) -> None:
    """In process: granian drains requests in flight; a load stuck past stop_grace_s is ended by closing the
    supervisor, so the daemon still exits, with 0, and the client gets its error."""
    await set_value(app, "engine.stop_grace_s", "0.5")
    port = free_port()
    made: list[_StuckSupervisor] = []

    def factory(a):
        made.append(_StuckSupervisor(a))
        return made[0]

    services = build_services(app, supervisor=factory(app))
    daemon = asyncio.create_task(serve(app, services, host="127.0.0.1", port=port))
    async with httpx2.AsyncClient(trust_env=False) as client:
        for _ in range(200):
            if read_daemon_file(app.paths) is not None:
                break
            await asyncio.sleep(0.05)
        assert read_daemon_file(app.paths).port == port
        load = asyncio.create_task(client.post(f"http://127.0.0.1:{port}/api/blazar/load", json={"model": "m"},
                                               timeout=WAIT_S))
        await asyncio.sleep(0.3)
        assert not load.done()
        os.kill(os.getpid(), signal.SIGTERM)  # the daemon's loop handler takes it, not pytest
        assert await asyncio.wait_for(daemon, WAIT_S) == 0
        r = await asyncio.wait_for(load, WAIT_S)
    assert r.status_code == 502
    assert r.json()["error"]["code"] == "load_failed"
    assert made[0].started and made[0].close_calls >= 1
    assert read_daemon_file(app.paths) is None
