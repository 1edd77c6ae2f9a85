"""Start-up reconciliation: make the residency projection true again before the supervisor serves.

A daemon that died (SIGKILL, power loss) leaves instances the log calls running. Each is either gone (recorded
`instance.exited`, reason `lost`) or still running with nobody supervising it (stopped, then recorded
`orphan_stopped`). A child whose start never reached the log is found through its pid file and stopped too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

from blazar.adapters.engines import process
from blazar.confine import inside
from blazar.context import Blazar
from blazar.errors import OutsideHome
from blazar.events.instances import ExitReason, InstanceExited
from blazar.instances.live import socketfile
from blazar.projections.residency import ResidentInstance, instances

log = logging.getLogger("blazar.reconcile")
# Instance log files kept after their instance exited; older ones are deleted at start-up.
KEEP_INSTANCE_LOGS = 50


def _ours(pid: int, mark: str, binary_hint: str | None) -> bool:
    """The process at `pid` is the engine child we started (its command line has `mark`, see `_mark`): a recycled
    pid is never signalled."""
    cmd = process.pid_cmdline(pid)
    if not cmd:
        return False
    if binary_hint is not None and cmd[0] != binary_hint:
        return False
    if mark.startswith("--port "):
        return "--port" in cmd and mark.removeprefix("--port ") in cmd
    return mark in cmd


def _mark(app: Blazar, iid: str, port: int) -> str:
    """What only the command line of the child `iid` has: its port, or (port 0: a child on a Unix socket, no port)
    its socket."""
    return f"--port {port}" if port else f"unix://{socketfile(app, iid)}"


async def reconcile(app: Blazar) -> list[str]:
    """Record what really happened to every instance the log says is running; returns their ids."""
    await app.runner.catch_up()
    grace = app.settings().engine.stop_grace_s
    recorded = instances(app.runner.state("residency"), node=app.node or None)  # another node's are its own business

    async def settle(inst: ResidentInstance) -> str:
        iid, port, argv = inst.instance_id, inst.port, inst.argv
        pid = inst.pid if inst.pid is not None else _pid_from_file(app, iid)
        reason: ExitReason
        if pid is None:  # an intent whose spawn never happened (or never wrote its pid file)
            reason, detail = "lost", "its start was recorded but no process was spawned before the daemon stopped"
        elif process.pid_alive(pid) and _ours(pid, _mark(app, iid, port), argv[0] if argv else None):
            await process.stop_pid(pid, grace_s=grace, expect_cmdline=_mark(app, iid, port))
            reason, detail = "orphan_stopped", f"pid {pid} was still running with no supervisor; stopped"
        else:
            reason, detail = "lost", f"pid {pid} was not running when the daemon started"
        await app.record(InstanceExited(instance_id=iid, model=inst.model, reason=reason,
                                         log_tail=_log_tail(app, inst), detail=detail),
                         cause=inst.started_seq)
        with contextlib.suppress(OutsideHome):  # an id that is no file name names no pid file of ours
            _pidfile(app, iid).unlink(missing_ok=True)
        return iid

    # Orphans are stopped side by side: each may take its whole grace period.
    handled = list(await asyncio.gather(*(settle(inst) for inst in recorded)))
    handled += await _unrecorded_children(app, grace)
    # Every child of an earlier daemon is settled (stopped or gone): their engine keys and sockets are dead too.
    for keyfile in (app.paths.run / "instances").glob("*.key"):
        keyfile.unlink(missing_ok=True)
    for socket in app.paths.run.glob("*.sock"):
        socket.unlink(missing_ok=True)
    await asyncio.to_thread(_prune_logs, app)
    return handled


async def _unrecorded_children(app: Blazar, grace: float) -> list[str]:
    """Pid files of spawns whose `instance.started` never made it to the log (the daemon died in between)."""
    out = []
    known = {inst.instance_id for inst in instances(app.runner.state("residency"), node=app.node or None)}
    piddir = app.paths.run / "instances"
    for pidfile in sorted(piddir.glob("*.pid")) if piddir.is_dir() else []:
        iid = pidfile.stem
        if iid in known:
            continue
        try:
            pid_s, port_s = pidfile.read_text().split()
            pid, port = int(pid_s), int(port_s)
        except (OSError, ValueError):
            pidfile.unlink(missing_ok=True)
            continue
        if process.pid_alive(pid) and _ours(pid, _mark(app, iid, port), None):
            await process.stop_pid(pid, grace_s=grace, expect_cmdline=_mark(app, iid, port))
            log.warning("stopped engine child pid %s (port %s) whose start was never recorded", pid, port)
            out.append(iid)
        pidfile.unlink(missing_ok=True)
    return out


def _pidfile(app: Blazar, iid: str) -> Path:
    piddir = app.paths.run / "instances"
    return inside(piddir, piddir / f"{iid}.pid", what=f"instance.starting of {iid!r}")


def _log_tail(app: Blazar, inst: ResidentInstance) -> list[str]:
    """The last lines of the instance's log, read only when its recorded path stays inside the log directory."""
    try:
        log_file = inside(app.paths.log, inst.log_path or f"instances/{inst.instance_id}.log",
                          what=f"instance.starting of {inst.instance_id!r}")
    except OutsideHome as e:
        log.warning("%s", e.message)
        return []
    return process.log_tail(log_file, 20)


def _pid_from_file(app: Blazar, iid: str) -> int | None:
    """The pid a spawn wrote before its `instance.started` could be recorded, if it got that far."""
    try:
        return int(_pidfile(app, iid).read_text().split()[0])
    except (OSError, ValueError, IndexError, OutsideHome):
        return None


def _prune_logs(app: Blazar) -> None:
    live = {f"{inst.instance_id}.log" for inst in instances(app.runner.state("residency"), node=app.node or None)}
    logs = sorted((app.paths.log / "instances").glob("*.log"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in [p for p in logs if p.name not in live][KEEP_INSTANCE_LOGS:]:
        old.unlink(missing_ok=True)
