"""A dead engine child is seen at once: the process adapter tells a child on its way out from one that runs
(`pid_dying`), the supervisor answers "is it gone?" for a port that refused a request (`Supervisor.gone`, a real
child process), and the gateway routes a request whose engine was gone before it took it again, once, giving back
the first attempt's slot and hold (fakes for the supervisor and the engine, the real app, gateway and admission).

The end-to-end proof with the real engine is tests/integration/test_dead_engine.py."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from blazar.adapters.engines.process import pid_dying
from blazar.api.app import create_app
from blazar.context import Blazar
from blazar.instances.live import Live
from blazar.instances.supervisor import Instance, Supervisor
from blazar.serving.admission import Admission
from blazar.serving.gateway import Gateway
from tests.support.asgi import LocalConductor
from tests.support.bounds import HANG_S
from tests.support.fakes import FakeEngine, FakeSupervisor

BOUND_S = HANG_S
TERMINAL = {"request.completed", "request.failed", "request.rejected"}
CHAT = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}


# -- the process: running, or on its way out ----------------------------------------------------------------------

# A child that listens on a port (printed once it does) and serves nothing: llama-server's part in these tests.
LISTENER = "import socket, time; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); " \
           "print(s.getsockname()[1], flush=True); time.sleep(60)"


async def _sleeper() -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(sys.executable, "-c", LISTENER, stdout=asyncio.subprocess.PIPE)


async def _refused(port: int) -> bool:
    """Connect as the gateway would: True once the port refuses (the child's sockets are closed). A connect that
    meets the listener as the kernel closes it is reset rather than refused: the same answer to the gateway."""
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except (ConnectionRefusedError, ConnectionResetError):
        return True
    writer.close()
    return False


async def test_a_running_child_is_not_dying_and_a_killed_unreaped_one_is() -> None:
    proc = await _sleeper()
    try:
        assert pid_dying(proc.pid) is False
        proc.send_signal(signal.SIGKILL)
        # Before the parent reaps it, the child is a zombie (or still inside its exit): dying, either way.
        for _ in range(int(BOUND_S / 0.01)):
            if pid_dying(proc.pid):
                break
            await asyncio.sleep(0.01)
        assert pid_dying(proc.pid) is True
    finally:
        await asyncio.wait_for(proc.wait(), BOUND_S)
    assert pid_dying(proc.pid) is True  # reaped: no such process


# -- the supervisor: is the instance behind a refused port gone? -----------------------------------------------------

@pytest.fixture
async def watched(app: Blazar, tmp_path: Path) -> AsyncIterator[tuple[Supervisor, Live]]:
    """A supervisor watching one ready child of its own (a sleeping program standing in for llama-server)."""
    sup = Supervisor(app)
    proc = await _sleeper()
    assert proc.stdout is not None
    port = int(await asyncio.wait_for(proc.stdout.readline(), BOUND_S))
    inst = Instance(instance_id="i1", model="m", port=port, slots=1, ctx_tokens=64, engine_tag="t")
    lv = Live(instance=inst, proc=proc, plan=None, log_path=tmp_path / "i1.log",  # type: ignore[arg-type]
               started_seq=0, started_mono=app.clock.monotonic(), keep_alive_s=None, pinned=False, state="ready")
    sup._live["i1"] = lv
    lv.watcher = asyncio.create_task(sup._watch(lv))
    try:
        yield sup, lv
    finally:
        if proc.returncode is None:
            proc.kill()
        await asyncio.wait_for(lv.watcher, BOUND_S)


async def _exits(app: Blazar) -> list[Any]:
    return [r.event async for r in app.log.read(types=["instance.exited"])]


async def test_a_running_child_behind_a_refused_port_is_not_gone(app: Blazar,
                                                                 watched: tuple[Supervisor, Live]) -> None:
    sup, lv = watched
    assert await sup.gone(lv.instance) is False
    assert lv.state == "ready" and sup.instances() == [lv.instance] and await _exits(app) == []


async def test_a_killed_child_is_gone_and_its_crash_recorded_before_the_answer(
        app: Blazar, watched: tuple[Supervisor, Live]) -> None:
    sup, lv = watched
    lv.proc.send_signal(signal.SIGKILL)
    for _ in range(int(BOUND_S / 0.01)):  # what the gateway sees first: its port refuses
        if await _refused(lv.instance.port):
            break
        await asyncio.sleep(0.01)
    assert await asyncio.wait_for(sup.gone(lv.instance), BOUND_S) is True
    (exited,) = await _exits(app)  # recorded by the time gone() answers: the next request will not find it
    assert exited.reason == "crashed" and exited.exit_code == -signal.SIGKILL and sup.instances() == []
    assert await sup.gone(lv.instance) is True  # asked again: still gone, nothing recorded twice
    assert len(await _exits(app)) == 1



async def test_gone_waits_for_an_exit_the_watcher_is_still_writing(
        app: Blazar, watched: tuple[Supervisor, Live], monkeypatch: pytest.MonkeyPatch) -> None:
    """The watcher drops a reaped child from the live set before its `instance.exited` is written: asked then,
    `gone` waits for the write, so its "gone" still means "recorded" (a loaded machine once showed the gap)."""
    sup, lv = watched
    writing, release = asyncio.Event(), asyncio.Event()
    record = app.record

    async def held_record(*events: Any, **kw: Any) -> Any:
        writing.set()
        await release.wait()
        return await record(*events, **kw)

    monkeypatch.setattr(app, "record", held_record)
    lv.proc.send_signal(signal.SIGKILL)
    await asyncio.wait_for(writing.wait(), BOUND_S)  # the watcher reaped it and is writing the exit
    assert sup.live.get("i1") is None
    asked = asyncio.create_task(sup.gone(lv.instance))
    try:
        for _ in range(10):
            await asyncio.sleep(0)
        assert not asked.done()  # told nothing while the exit is unwritten
    finally:
        release.set()
    assert await asyncio.wait_for(asked, BOUND_S) is True
    (exited,) = await _exits(app)
    assert exited.reason == "crashed"


# -- the gateway: routed again, once ----------------------------------------------------------------------------------

async def _serve(app: Blazar, sup: FakeSupervisor, engine: FakeEngine, body: dict[str, Any]
                 ) -> tuple[Any, list[Any], Admission]:
    admission = Admission()
    gateway = Gateway(app, sup, admission, engine)  # type: ignore[arg-type]
    seen: list[Any] = []
    original = gateway.desk.emit

    def emit(event: Any, trace_id: str, actor: str | None = None) -> None:
        seen.append(event)
        original(event, trace_id, actor)

    gateway.desk.emit = emit  # type: ignore[method-assign]
    async with LocalConductor(create_app(app, sup, gateway)) as c:  # type: ignore[arg-type]
        result = await c.simulate_post("/v1/chat/completions", json=body)
    await asyncio.sleep(0)  # the guard's done callback runs after the response
    return result, seen, admission


def _settled(sup: FakeSupervisor, admission: Admission) -> bool:
    snap = admission.snapshot()
    return sup.held == 0 and all(int(v.get("busy", 0)) == 0 and int(v.get("queued", 0)) == 0 for v in snap.values())


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_request_whose_engine_was_gone_is_routed_again_and_answered(app: Blazar, stream: bool) -> None:
    sup, engine = FakeSupervisor(dead={"i1"}, in_turn=True, slots=1), FakeEngine(refusing={1})
    result, seen, admission = await _serve(app, sup, engine, {**CHAT, "stream": stream})
    assert result.status_code == 200 and "hi" in result.text
    types = [e.TYPE for e in seen]
    assert types.count("request.routed") == 2 and types.count("request.admitted") == 2
    assert types.index("request.rerouted") < [i for i, t in enumerate(types) if t == "request.routed"][1]
    rerouted = next(e for e in seen if e.TYPE == "request.rerouted")
    assert rerouted.instance_id == "i1" and "Cannot connect" in rerouted.detail
    assert sum(types.count(t) for t in TERMINAL) == 1 and "request.completed" in types
    assert sup.asked == ["i1"] and [url for url, _ in engine.bodies] == ["http://127.0.0.1:2"]
    assert _settled(sup, admission)


async def test_a_request_whose_instance_exited_while_it_waited_for_a_slot_is_routed_again(app: Blazar) -> None:
    sup, engine = FakeSupervisor(dead=set(), exited={"i1"}, in_turn=True, slots=1), FakeEngine(refusing=set())
    result, seen, admission = await _serve(app, sup, engine, CHAT)
    assert result.status_code == 200
    types = [e.TYPE for e in seen]
    assert types.count("request.routed") == 2 and types.count("request.admitted") == 1  # i1 never held it
    rerouted = next(e for e in seen if e.TYPE == "request.rerouted")
    assert rerouted.instance_id == "i1" and "is gone" in rerouted.detail
    assert sum(types.count(t) for t in TERMINAL) == 1 and [url for url, _ in engine.bodies] == ["http://127.0.0.1:2"]
    assert _settled(sup, admission)


async def test_an_engine_that_refuses_while_its_child_runs_is_a_502_not_a_retry(app: Blazar) -> None:
    sup, engine = FakeSupervisor(dead=set(), in_turn=True, slots=1), FakeEngine(refusing={1})
    result, seen, admission = await _serve(app, sup, engine, CHAT)
    assert result.status_code == 502 and "Cannot connect" in result.text
    types = [e.TYPE for e in seen]
    assert "request.rerouted" not in types and types.count("request.routed") == 1
    assert types.count("request.failed") == 1 and sum(types.count(t) for t in TERMINAL) == 1
    assert sup.asked == ["i1"] and _settled(sup, admission)


async def test_a_request_is_routed_again_only_once(app: Blazar) -> None:
    sup, engine = FakeSupervisor(dead={"i1", "i2"}, in_turn=True, slots=1), FakeEngine(refusing={1, 2})
    result, seen, admission = await _serve(app, sup, engine, CHAT)
    assert result.status_code == 502
    types = [e.TYPE for e in seen]
    assert types.count("request.rerouted") == 1 and types.count("request.routed") == 2
    assert sum(types.count(t) for t in TERMINAL) == 1 and types[-1] == "request.failed"
    assert sup.asked == ["i1"]  # the second attempt's failure is the request's: nothing more is asked
    assert _settled(sup, admission)


async def test_a_request_that_already_streamed_is_not_retried(app: Blazar) -> None:
    sup, engine = FakeSupervisor(dead={"i1"}, in_turn=True, slots=1), FakeEngine(refusing=set(), breaks=True)
    result, seen, admission = await _serve(app, sup, engine, {**CHAT, "stream": True})
    assert result.status_code == 200 and "engine_crashed" in result.text  # the in-stream error event, as before
    types = [e.TYPE for e in seen]
    assert "request.rerouted" not in types and types.count("request.routed") == 1 and sup.asked == []
    failed = next(e for e in seen if e.TYPE == "request.failed")
    assert failed.reason == "engine_crashed" and _settled(sup, admission)


async def test_a_slot_the_first_attempt_named_is_not_sent_to_the_next_instance(app: Blazar) -> None:
    sup, engine = FakeSupervisor(dead={"i1"}, in_turn=True, slots=1), FakeEngine(refusing={1})
    admission = Admission()
    gateway = Gateway(app, sup, admission, engine)  # type: ignore[arg-type]
    gateway.kv.slots.explicit = lambda iid: iid == "i1"  # type: ignore[method-assign]  # i1 named its slots
    async with LocalConductor(create_app(app, sup, gateway)) as c:  # type: ignore[arg-type]
        result = await c.simulate_post("/v1/chat/completions", json=CHAT)
    assert result.status_code == 200
    ((_, body),) = engine.bodies
    assert "id_slot" not in body
