"""Engine children nobody supervises: processes running an engine binary of this home's store (their executable,
from /proc, lies under `engines/`), or a speech child of this home (Blazar's whisper child or piper's server: a
Python launcher whose model argument lies under `models/`), whose parent is neither our daemon nor another Blazar
command (a smoke test in `blazar engine use`). A daemon that died (SIGKILL, OOM) leaves such children holding memory
and ports.

A process is only ever called ours by its executable, or a speech child by its launcher module and a model path in
this home's store, so a recycled pid or a stranger's llama-server (or whisper) is never named (nor stopped by
`--fix`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from blazar.adapters.engines.process import pid_alive, pid_cmdline
from blazar.operations.doctor.report import Action, Check, ok

_PROC = Path("/proc")


def pid_running(pid: int) -> bool:
    return pid > 0 and pid_alive(pid)


@dataclass(frozen=True)
class EngineProcess:
    pid: int
    ppid: int
    exe: Path
    parent_cmdline: tuple[str, ...]


def _ppid(pid: int) -> int | None:
    try:
        raw = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return int(raw[raw.rindex(")") + 2:].split()[1])  # after the command name: state, then ppid


def _exe(pid: int) -> Path | None:
    try:
        return Path(os.readlink(_PROC / str(pid) / "exe"))
    except OSError:  # another user's process, a kernel thread, or gone
        return None


# The launchers of the speech kinds (blazar/adapters/engines/kinds.py), and the flag that names their model.
_SPEECH_LAUNCHERS = {"blazar.children.whisper": "--model", "piper.http_server": "-m"}


def speech_child(cmdline: list[str] | None, models_dir: Path) -> bool:
    """`cmdline` is a speech kind's child of this home: `python -m <launcher> ... <flag> <a path under models/>`."""
    if not cmdline or len(cmdline) < 3 or cmdline[1] != "-m" or cmdline[2] not in _SPEECH_LAUNCHERS:
        return False
    flag = _SPEECH_LAUNCHERS[cmdline[2]]
    args = cmdline[3:]
    model = next((args[i + 1] for i, a in enumerate(args[:-1]) if a == flag), None)
    return model is not None and Path(model).resolve().is_relative_to(models_dir.resolve())


def engine_processes(engines_dir: Path, models_dir: Path | None = None) -> list[EngineProcess]:
    """Every live process whose executable is inside `engines_dir`, and every speech child of a model inside
    `models_dir` (when given)."""
    root = engines_dir.resolve()
    found: list[EngineProcess] = []
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        exe = _exe(pid)
        if exe is None or not pid_alive(pid):
            continue
        if not exe.is_relative_to(root) and (models_dir is None or not speech_child(pid_cmdline(pid), models_dir)):
            continue
        ppid = _ppid(pid)
        if ppid is None:
            continue
        found.append(EngineProcess(pid=pid, ppid=ppid, exe=exe, parent_cmdline=tuple(pid_cmdline(ppid) or ())))
    return sorted(found, key=lambda p: p.pid)


def is_blazar_command(cmdline: tuple[str, ...]) -> bool:
    """`blazar ...` (the console script) or `python -m blazar.cli.main ...`: a Blazar process that owns its child."""
    return any(Path(arg).name == "blazar" or arg.startswith("blazar.") for arg in cmdline[:3])


def orphan_reason(proc: EngineProcess, daemon_pid: int | None) -> str | None:
    """Why `proc` has no owner, or None when our daemon or a live Blazar command is its parent."""
    if daemon_pid is not None and proc.ppid == daemon_pid:
        return None
    if proc.parent_cmdline and is_blazar_command(proc.parent_cmdline):
        return None
    parent = " ".join(proc.parent_cmdline)[:60] or "gone"
    return f"parent pid {proc.ppid} ({parent}) is not a Blazar process"


def orphans(engines_dir: Path, daemon_pid: int | None, models_dir: Path | None = None) -> Check:
    procs = engine_processes(engines_dir, models_dir)
    lost = [(p, why) for p in procs if (why := orphan_reason(p, daemon_pid)) is not None]
    if not lost:
        owned = f"{len(procs)} engine process(es), each owned by " + (f"the daemon (pid {daemon_pid}) or " if
                                                                      daemon_pid else "") + "a Blazar command"
        return ok("machine", "orphans", owned if procs else f"no engine process of {engines_dir} is running")
    actions = tuple(Action("stop_process", str(p.exe), pid=p.pid, why=why) for p, why in lost)
    listing = "; ".join(f"pid {p.pid} {p.exe} ({why})" for p, why in lost)
    return Check("machine", "orphans", "fail", f"{len(lost)} orphan engine process(es): {listing}",
                 fix="blazar doctor --fix (SIGTERM, then SIGKILL) or kill " + " ".join(str(p.pid) for p, _ in lost),
                 actions=actions)
