"""The supervisor against the real llama-server and the real Gemma 3 270M: load, ready, stop; idle eviction;
max_loaded_models and memory-pressure victims; a SIGKILLed child is recorded and recovered; stand-in programs
for a hung load and a crash loop that opens the circuit."""

from __future__ import annotations

import asyncio
import os
import signal
import stat
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2
import pytest

from blazar.adapters.engines.llama_server import probe
from blazar.context import Blazar
from blazar.errors import ModelInUse
from blazar.instances.supervisor import CircuitOpen, DoesNotFit, LoadFailed, ModelNotLoaded, Supervisor
from blazar.operations.config import set_value
from blazar.store.engines import ActiveEngine, install_engine
from blazar.store.models import import_model, remove_model
from tests.support.homes import record_probe_in

FIXTURES = Path(__file__).parent.parent / "fixtures" / "llama_server"
MiB = 1 << 20


async def _read(app: Blazar, **filters) -> list:
    return [r async for r in app.log.read(**filters)]


@pytest.fixture
async def sup(app: Blazar, engine_binary: Path, gemma_path: Path) -> AsyncIterator[Supervisor]:
    await install_engine(app, source="path", path=engine_binary)
    for name in ("gemma-a", "gemma-b", "gemma-c"):
        await import_model(app, gemma_path, name)
    # One file, probed once as a first load would (tests/integration/test_template_probe.py is about that load).
    await record_probe_in(app, engine_binary, gemma_path, "gemma-a")
    await set_value(app, "fit.ctx", "1024")
    await set_value(app, "fit.slots", "1")
    await set_value(app, "engine.stop_grace_s", "5")
    s = Supervisor(app)
    await s.start()
    try:
        yield s
    finally:
        await s.close()


async def test_load_ready_stop_records_each_step_and_the_child_serves(app: Blazar, sup: Supervisor) -> None:
    inst = await sup.load("gemma-a")
    async with httpx2.AsyncClient(timeout=30) as client:
        r = await client.get(f"{inst.base_url}/health")
        assert r.status_code == 200
        # The child's port is locked with its own key: without it 401, with it the child serves.
        r = await client.post(f"{inst.base_url}/completion", json={"prompt": "The sky is", "n_predict": 4})
        assert r.status_code == 401
        r = await client.post(f"{inst.base_url}/completion", json={"prompt": "The sky is", "n_predict": 4},
                              headers={"Authorization": f"Bearer {inst.api_key}"})
        assert r.status_code == 200 and r.json()["tokens_predicted"] > 0
    await sup.drain()  # the memory measurement is recorded after the load returns
    (row,) = sup.ps()
    assert row["model"] == "gemma-a" and row["state"] == "ready" and row["port"] == inst.port
    assert row["ctx_tokens"] == 1024 and row["slots"] == 1
    assert row["measured_bytes"] and row["measured_bytes"] > 100 * MiB  # calibration recorded after the load
    pid = row["pid"]
    assert await sup.stop("gemma-a") == [inst.instance_id]
    assert sup.ps() == []
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    (started,) = await _read(app, types=["instance.started"])
    argv = started.event.argv
    assert argv[argv.index("-c") + 1] == "1024" and argv[argv.index("-np") + 1] == "1"
    assert "--metrics" in argv and "--slots" in argv and "--slot-save-path" in argv
    assert started.event.planned_bytes > 0 and started.event.log_path.startswith("instances/")
    got = [r.type for r in await _read(app, stream=f"instance:{inst.instance_id}")]
    assert got == ["instance.starting", "instance.started", "instance.ready", "instance.exited"]
    exited = (await _read(app, types=["instance.exited"]))[-1]
    assert exited.event.reason == "stopped" and exited.event.log_tail
    measured = await _read(app, types=["instance.memory_measured"])
    assert measured and measured[-1].event.instance_id == inst.instance_id
    with pytest.raises(ModelNotLoaded):
        await sup.stop("gemma-a")


async def test_a_second_load_reuses_the_ready_instance(app: Blazar, sup: Supervisor) -> None:
    a = await sup.load("gemma-a")
    b = await sup.ensure(sup.resolve("gemma-a"))
    assert a.instance_id == b.instance_id
    assert len(await _read(app, types=["instance.started"])) == 1


async def test_idle_eviction_fires_when_keep_alive_runs_out(app: Blazar, sup: Supervisor, clock) -> None:
    await sup.load("gemma-a", keep_alive=30.0)
    await sup.load("gemma-b", keep_alive=None)  # forever
    clock.advance(31)
    await sup.reap_once()
    assert [r["model"] for r in sup.ps()] == ["gemma-b"]
    (ev,) = await _read(app, types=["instance.evicted"])
    assert ev.event.model == "gemma-a" and ev.event.reason == "idle" and ev.event.idle_s >= 30
    exited = (await _read(app, types=["instance.exited"]))[-1]
    assert exited.event.reason == "evicted" and exited.cause == ev.seq


async def test_max_loaded_models_evicts_the_least_recently_used(app: Blazar, sup: Supervisor, clock) -> None:
    await set_value(app, "fit.max_loaded_models", "2")
    await sup.load("gemma-a")
    clock.advance(5)
    await sup.load("gemma-b")
    clock.advance(5)
    await sup.ensure(sup.resolve("gemma-a"))  # a is used again: b is now the idlest
    clock.advance(5)
    await sup.load("gemma-c")
    assert sorted(r["model"] for r in sup.ps()) == ["gemma-a", "gemma-c"]
    (ev,) = await _read(app, types=["instance.evicted"])
    assert ev.event.model == "gemma-b" and ev.event.reason == "max_loaded_models"
    assert ev.event.for_model == "gemma-c" and ev.event.observations["max_loaded_models"] == 2


async def test_memory_pressure_evicts_only_as_many_as_needed(app: Blazar, sup: Supervisor, clock) -> None:
    inst = await sup.load("gemma-a")
    await sup.drain()
    (row,) = sup.ps()
    one = max(row["planned_bytes"], row["measured_bytes"] or 0)
    # Room for one instance and a half: the second load must evict the first, and only it.
    await set_value(app, "fit.memory_limit_mib", str(int(one * 1.5) // MiB))
    clock.advance(10)
    await sup.load("gemma-b")
    assert [r["model"] for r in sup.ps()] == ["gemma-b"]
    (ev,) = await _read(app, types=["instance.evicted"])
    assert ev.event.instance_id == inst.instance_id and ev.event.reason == "memory"
    assert ev.event.observations["need_bytes"] > 0


async def test_a_load_that_cannot_fit_even_after_evictions_is_refused(app: Blazar, sup: Supervisor) -> None:
    await set_value(app, "fit.memory_limit_mib", "16")
    with pytest.raises(DoesNotFit):
        await sup.load("gemma-a", ctx=1024)
    (ev,) = await _read(app, types=["instance.load_refused"])
    assert ev.event.reason == "does_not_fit"
    assert sup.ps() == []


async def test_a_sigkilled_child_is_recorded_as_crashed_and_restarted_on_next_need(
        app: Blazar, sup: Supervisor) -> None:
    inst = await sup.load("gemma-a")
    pid = sup.ps()[0]["pid"]
    os.kill(pid, signal.SIGKILL)
    for _ in range(200):
        if not sup.ps():
            break
        await asyncio.sleep(0.05)
    exited = (await _read(app, types=["instance.exited"]))[-1]
    assert exited.event.reason == "crashed" and exited.event.exit_code == -signal.SIGKILL
    again = await sup.ensure(sup.resolve("gemma-a"))
    assert again.instance_id != inst.instance_id and sup.ps()[0]["state"] == "ready"


def _stand_in(tmp: Path, name: str, body: str) -> Path:
    """A program that answers --version/--help like llama-server and does `body` otherwise."""
    path = tmp / name
    path.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import sys, pathlib
        if "--version" in sys.argv:
            print(pathlib.Path({str(FIXTURES / 'version.txt')!r}).read_text()); sys.exit(0)
        if "--help" in sys.argv:
            print(pathlib.Path({str(FIXTURES / 'help.txt')!r}).read_text()); sys.exit(0)
        """) + textwrap.dedent(body))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _engine_of(binary: Path) -> ActiveEngine:
    version, caps = probe(binary)
    return ActiveEngine(tag="stand-in", binary=binary, caps=caps, version=version)


HANGS = """\
import http.server
port = int(sys.argv[sys.argv.index("--port") + 1])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(503); self.end_headers(); self.wfile.write(b'{"error":"loading"}')
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""

CRASHES = """\
print("loading model... failed: out of cheese", flush=True)
sys.exit(3)
"""


async def test_a_hung_load_times_out_kills_the_child_and_is_recorded(
        app: Blazar, gemma_path: Path, tmp_path: Path) -> None:
    await import_model(app, gemma_path, "gemma-a")
    await set_value(app, "engine.load_timeout_s", "2")
    await set_value(app, "engine.stop_grace_s", "1")
    engine = _engine_of(_stand_in(tmp_path, "hangs", HANGS))
    sup = Supervisor(app, engine=lambda _app: engine)
    await sup.start()
    try:
        with pytest.raises(LoadFailed, match="did not become ready"):
            await sup.load("gemma-a", ctx=512)
        (started,) = await _read(app, types=["instance.started"])
        (exited,) = await _read(app, types=["instance.exited"])
        assert exited.event.reason == "load_timeout" and exited.cause == started.seq
        with pytest.raises(ProcessLookupError):
            os.kill(started.event.pid, 0)
        assert sup.ps() == []
    finally:
        await sup.close()


async def test_repeated_crashes_open_the_circuit_until_reset(app: Blazar, gemma_path: Path, tmp_path: Path) -> None:
    await import_model(app, gemma_path, "gemma-a")
    engine = _engine_of(_stand_in(tmp_path, "crashes", CRASHES))
    sup = Supervisor(app, engine=lambda _app: engine)
    await sup.start()
    try:
        for _ in range(3):
            with pytest.raises(LoadFailed, match="out of cheese"):
                await sup.load("gemma-a", ctx=512)
        (opened,) = await _read(app, types=["model.circuit_opened"])
        assert opened.event.model == "gemma-a" and opened.event.crashes == 3
        with pytest.raises(CircuitOpen, match="blazar ps --reset gemma-a"):
            await sup.load("gemma-a", ctx=512)
        refused = (await _read(app, types=["instance.load_refused"]))[-1]
        assert refused.event.reason == "circuit_open"
        assert await sup.reset("gemma-a") is True
        with pytest.raises(LoadFailed):  # allowed to try again (and it crashes again)
            await sup.load("gemma-a", ctx=512)
    finally:
        await sup.close()


async def test_rm_refuses_a_loaded_model_and_works_once_it_is_stopped(app: Blazar, sup: Supervisor) -> None:
    await sup.load("gemma-a")
    with pytest.raises(ModelInUse, match="blazar stop gemma-a"):
        await remove_model(app, "gemma-a")
    assert [r["model"] for r in sup.ps()] == ["gemma-a"]
    await sup.stop("gemma-a")
    await remove_model(app, "gemma-a")


async def test_a_larger_context_replaces_an_idle_instance_but_never_a_pinned_one(app: Blazar, sup: Supervisor) -> None:
    small = await sup.load("gemma-a", ctx=512)
    big = await sup.load("gemma-a", ctx=1024)
    assert big.instance_id != small.instance_id and big.ctx_tokens == 1024
    (ev,) = await _read(app, types=["instance.evicted"])
    assert ev.event.reason == "reshape" and ev.event.instance_id == small.instance_id
    await sup.load("gemma-a", pinned=True)  # reuses the 1024 one and pins it
    with pytest.raises(DoesNotFit, match="pinned"):
        await sup.load("gemma-a", ctx=2048)
    assert [r["instance_id"] for r in sup.ps()] == [big.instance_id]
