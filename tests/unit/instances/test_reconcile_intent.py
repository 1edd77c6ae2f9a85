"""Reconciliation of an intent with no outcome: `instance.starting` recorded, then the daemon died before (or just
after) the spawn. The next start records what is true, so the residency projection never keeps a ghost."""

from __future__ import annotations

import subprocess
import sys

from blazar.context import Blazar
from blazar.events.instances import InstanceStarting
from blazar.instances.reconcile import reconcile

MiB = 1 << 20


def _intent(iid: str, port: int, binary: str = "llama-server") -> InstanceStarting:
    return InstanceStarting(instance_id=iid, model="gemma", engine_tag="b1", port=port,
                            argv=[binary, "--port", str(port)], log_path=f"instances/{iid}.log",
                            ctx_tokens=1024, engine_ctx=1024, slots=1, planned_bytes=300 * MiB,
                            estimate_bytes=290 * MiB)


async def test_an_intent_never_spawned_is_recorded_lost(app: Blazar) -> None:
    (intent,) = await app.record(_intent("a1", 40001))
    assert app.runner.state("residency").instances["a1"].pid is None
    assert await reconcile(app) == ["a1"]
    assert app.runner.state("residency").instances == {}
    exits = [r async for r in app.log.read(types=["instance.exited"])]
    assert len(exits) == 1 and exits[0].event.reason == "lost" and exits[0].cause == intent.seq
    assert "no process was spawned" in exits[0].event.detail


async def test_an_intent_whose_child_wrote_its_pid_file_is_stopped_as_an_orphan(app: Blazar) -> None:
    """The spawn happened and wrote its pid file, but `instance.started` never reached the log."""
    port = 40002
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "--port", str(port)])  # noqa: ASYNC220
    try:
        await app.record(_intent("a2", port, sys.executable))
        piddir = app.paths.run / "instances"
        piddir.mkdir(parents=True, exist_ok=True)
        (piddir / "a2.pid").write_text(f"{child.pid} {port}\n")
        assert await reconcile(app) == ["a2"]
        assert child.wait(timeout=30) is not None  # stopped (SIGTERM)
        (exited,) = [r async for r in app.log.read(types=["instance.exited"])]
        assert exited.event.reason == "orphan_stopped" and str(child.pid) in exited.event.detail
        assert not (piddir / "a2.pid").exists()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
