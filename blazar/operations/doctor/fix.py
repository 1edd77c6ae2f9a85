"""`blazar doctor --fix`: only the repairs a check proved safe, each proved again just before it is made, and each
recorded as `doctor.fixed`. Stale run files go under the daemon lock (so no daemon starts meanwhile); an orphan
is stopped with SIGTERM, then SIGKILL, only while its executable is still this home's engine; a KV-bank save goes
only while no event records it still (and, under a running daemon, only once no save could be writing it). Models
and the log are never touched."""

from __future__ import annotations

from pathlib import Path

from blazar import runlock
from blazar.adapters.engines.process import pid_cmdline, stop_pid
from blazar.context import Blazar
from blazar.events.base import Recorded
from blazar.events.doctor import DoctorFixed
from blazar.instances import bank_leftovers
from blazar.operations.doctor.machine import see_daemon
from blazar.operations.doctor.orphans import engine_processes, orphan_reason
from blazar.operations.doctor.report import Action, Check


async def apply_fixes(app: Blazar, checks: list[Check]) -> list[Recorded]:
    """Make each check's actions that are still safe; returns what was done, as recorded."""
    done: list[DoctorFixed] = []
    for check in checks:
        files = [a for a in check.actions if a.kind == "remove_file"]
        if files:
            done += _remove_stale_run_files(app, check.id, files)
        saves = [a for a in check.actions if a.kind == "remove_bank_file"]
        if saves:
            done += await _remove_unrecorded_saves(app, check.id, saves)
        for action in check.actions:
            if action.kind == "stop_process":
                fixed = await _stop_orphan(app, check.id, action)
                if fixed is not None:
                    done.append(fixed)
    return await app.record(done) if done else []


def _remove_stale_run_files(app: Blazar, check: str, actions: list[Action]) -> list[DoctorFixed]:
    run, lock = app.paths.run.resolve(), app.paths.daemon_lock
    done: list[DoctorFixed] = []
    try:
        with runlock.hold(lock):
            seen = see_daemon(app.paths)
            for a in actions:
                p = Path(a.path)
                # Only files under run/; daemon.json only while it still names the pid the check saw dead; the
                # lock last, below, while we hold it (a daemon starting after that makes a new one).
                if (not p.resolve().is_relative_to(run) or p == lock
                        or (p.name == "daemon.json" and seen.file_pid != a.pid)):
                    continue
                try:
                    p.unlink()
                except FileNotFoundError:
                    continue
                done.append(DoctorFixed(check=check, action="removed_file", target=str(p), detail=a.why,
                                        pid=a.pid))
            lock.unlink(missing_ok=True)
    except BlockingIOError:  # a daemon started since the check: its files are not stale any more
        return []
    done += [DoctorFixed(check=check, action="removed_file", target=str(a.path), detail=a.why, pid=a.pid)
             for a in actions if Path(a.path) == lock]
    return done


async def _remove_unrecorded_saves(app: Blazar, check: str, actions: list[Action]) -> list[DoctorFixed]:
    """The saves the check listed that are still unrecorded now (the log read again), still plain files under the
    bank, and, with a daemon running, still older than any save in progress."""
    await app.runner.catch_up()
    grace = bank_leftovers.grace_s(app) if see_daemon(app.paths).live else None
    still = set(bank_leftovers.unrecorded_saves(app.paths.data_dir, app.runner.state("sessions"),
                                                younger_kept_s=grace))
    return bank_leftovers.remove([p for a in actions if (p := Path(a.path)) in still], check=check)


async def _stop_orphan(app: Blazar, check: str, action: Action) -> DoctorFixed | None:
    assert action.pid is not None
    seen = see_daemon(app.paths)
    now = next((p for p in engine_processes(app.paths.engines, app.paths.models) if p.pid == action.pid), None)
    if now is None or str(now.exe) != action.path:
        return None  # gone already, or the pid now runs something else
    why = orphan_reason(now, seen.holder if seen.live else None)
    if why is None:  # a daemon or a Blazar command adopted it meanwhile (it cannot, but check anyway)
        return None
    argv = pid_cmdline(action.pid)
    if not argv:
        return None
    # stop_pid signals only while the pid still runs this argv[0] (and the same process: its start time).
    stopped = await stop_pid(action.pid, grace_s=app.settings().engine.stop_grace_s, expect_cmdline=argv[0])
    if not stopped:
        return None
    return DoctorFixed(check=check, action="stopped_process", target=action.path, detail=why, pid=action.pid)
