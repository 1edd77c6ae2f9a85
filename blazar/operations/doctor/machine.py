"""The machine around the home: disk free, file modes, the daemon's run files and port, config.toml.

NOTE: `run/daemon.json` is read here rather than through blazar.daemon, which sits above the handlers (the
import-linter layers); these are the same three fields `blazar.daemon.DaemonInfo` writes."""

from __future__ import annotations

import errno
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path

import orjson

from blazar import runlock
from blazar.config import read_file
from blazar.credentials import admin_token_file
from blazar.diskspace import LOG_HEADROOM_BYTES
from blazar.errors import ConfigError
from blazar.operations.doctor.orphans import pid_running
from blazar.operations.doctor.report import Action, Check, Status, ok
from blazar.paths import Paths

GIB = 1 << 30
DISK_WARN_BELOW = 5 * GIB
DISK_FAIL_BELOW = 1 * GIB


@dataclass(frozen=True)
class DaemonSeen:
    """Who holds the daemon lock, and what run/daemon.json says (None: no file, or not readable)."""

    holder: int | None
    file: Path
    file_pid: int | None
    file_host: str | None
    file_port: int | None
    file_exists: bool

    @property
    def live(self) -> bool:
        return self.holder is not None and self.holder > 0 and pid_running(self.holder)


def see_daemon(paths: Paths) -> DaemonSeen:
    f = paths.run / "daemon.json"
    pid: int | None = None
    host: str | None = None
    port: int | None = None
    try:
        raw = orjson.loads(f.read_bytes())
        pid, host, port = int(raw["pid"]), str(raw["host"]), int(raw["port"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return DaemonSeen(holder=runlock.holder(paths.daemon_lock), file=f, file_pid=pid, file_host=host,
                      file_port=port, file_exists=f.exists())


def daemon_file(paths: Paths, seen: DaemonSeen) -> Check:
    """run/daemon.json belongs to the daemon holding the lock; any other is stale (with the admin token beside it)."""
    if seen.live:
        if seen.file_pid == seen.holder:
            return ok("machine", "daemon_file", f"daemon pid {seen.holder} is running; {seen.file} is its own")
        if not seen.file_exists:
            return ok("machine", "daemon_file", f"daemon pid {seen.holder} is starting (no {seen.file.name} yet)")
        return Check("machine", "daemon_file", "warn", f"{seen.file} names pid {seen.file_pid}, but the running "
                     f"daemon is pid {seen.holder}", fix=f"restart the daemon (kill -TERM {seen.holder}; blazar serve)")
    if not seen.file_exists:
        return ok("machine", "daemon_file", "no daemon running and no run/daemon.json left behind")
    why = (f"pid {seen.file_pid} is not running and holds no lock" if seen.file_pid is not None
           else "it cannot be read and no daemon holds the lock")
    stale = [seen.file, admin_token_file(paths), paths.daemon_lock]
    actions = tuple(Action("remove_file", str(p), pid=seen.file_pid, why=why) for p in stale if p.exists())
    return Check("machine", "daemon_file", "warn", f"stale {seen.file}: {why}", fix="blazar doctor --fix (or rm "
                 + " ".join(str(p) for p in stale if p.exists()) + ")", actions=actions)


def port(host: str, port_: int, seen: DaemonSeen) -> Check:
    """The configured port: held by our daemon, or free for `blazar serve`."""
    if seen.live and seen.file_pid == seen.holder and seen.file_port is not None:
        if seen.file_port == port_:
            return ok("machine", "port", f"{host}:{port_} is held by our daemon (pid {seen.holder})")
        return Check("machine", "port", "warn", f"our daemon (pid {seen.holder}) listens on {seen.file_port}, the "
                     f"config says {port_}", fix=f"restart it to apply: kill -TERM {seen.holder}; blazar serve")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port_))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return Check("machine", "port", "warn", f"{host}:{port_} is in use by another program, so "
                             "`blazar serve` would refuse to start", fix="stop that program, or `blazar config set "
                             "server.port N`")
            return Check("machine", "port", "fail", f"cannot bind {host}:{port_}: {e.strerror or e}",
                         fix="`blazar config set server.host 127.0.0.1`")
    return ok("machine", "port", f"{host}:{port_} is free (no daemon running)")


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def disk(label: str, path: Path, *, warn_below: int = DISK_WARN_BELOW, fail_below: int = DISK_FAIL_BELOW) -> Check:
    where = _existing(path)
    usage = shutil.disk_usage(where)
    seen = f"{usage.free / GIB:.1f} GiB free of {usage.total / GIB:.1f} GiB under {path}"
    if usage.free >= warn_below:
        return ok("machine", f"disk_{label}", seen)
    status: Status = "fail" if usage.free < fail_below else "warn"
    floor = fail_below if status == "fail" else warn_below
    full = ": full, nothing more can be written there" if usage.free < LOG_HEADROOM_BYTES else ""
    return Check("machine", f"disk_{label}", status, f"{seen} (below {floor / GIB:.0f} GiB){full}",
                 fix="free space: `blazar rm MODEL`, `blazar engine prune`, old snapshots, or clear "
                 "~/.cache/blazar/engine-builds")


def file_modes(loose: list[str]) -> Check:
    """`loose` from blazar.queries.file_modes: sensitive paths that give group or others any access."""
    if not loose:
        return ok("machine", "file_modes", "the log, config, run and log directories are the owner's alone")
    where = [Path(p.rsplit(" (", 1)[0]) for p in loose]
    cmds = "; ".join(f"chmod {'600' if p.is_file() else '700'} {p}" for p in where)
    return Check("machine", "file_modes", "warn", f"{len(loose)} sensitive path(s) open to group or others: "
                 + ", ".join(loose), fix=cmds)


def config_file(path: Path) -> Check:
    try:
        values = read_file(path)
    except ConfigError as e:
        return Check("machine", "config", "fail", e.message, fix=f"edit {path}, or `blazar config unset KEY` for "
                     "the key named")
    if not values:
        return ok("machine", "config", f"{path}: none (defaults)" if not path.exists() else f"{path}: empty")
    return ok("machine", "config", f"{path}: valid ({len(values)} key(s) set)")
