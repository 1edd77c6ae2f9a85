"""Install, uninstall and look at the service: the unit file at its fixed place (never a place the log names), then
systemctl through its port. Where systemctl cannot reach a systemd (none running, no user bus), the file is still
written or removed and the commands left to run are returned; launchd is always left to the user's `launchctl`.

    BlazarError
    └── ServiceError    no root for a system unit, macOS asked for a system unit, an unsupported platform, a home
                        that does not exist for a system unit (exit 2)
"""

from __future__ import annotations

import contextlib
import os
import pwd
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from blazar.adapters.systemctl import Ran, Systemctl
from blazar.errors import ServiceError
from blazar.operations.service import launchd, systemd
from blazar.operations.service.target import UNIT_NAME, Scope, Target, home_of
from blazar.paths import Paths

SYSTEM_UNIT_DIR = Path("/etc/systemd/system")
# systemctl is-active's answers; anything else (a bus error) means it could not tell.
_STATES = {"active", "inactive", "failed", "activating", "deactivating", "reloading", "maintenance", "refreshing"}


@dataclass(frozen=True, slots=True)
class Place:
    scope: Scope
    path: Path
    kind: Literal["systemd", "launchd"]


def place(scope: Scope, *, platform: str, config_home: str | None, user_home: str) -> Place:
    """Where the scope's file lives on this platform: ~/.config/systemd/user (XDG_CONFIG_HOME respected),
    /etc/systemd/system, or ~/Library/LaunchAgents."""
    if platform.startswith("linux"):
        if scope == "system":
            return Place(scope, SYSTEM_UNIT_DIR / UNIT_NAME, "systemd")
        base = Path(config_home) if config_home else Path(user_home) / ".config"
        return Place(scope, base / "systemd" / "user" / UNIT_NAME, "systemd")
    if platform == "darwin":
        if scope == "system":
            raise ServiceError("on macOS `blazar service` installs a launchd agent for your login (--user); a "
                               "system-wide daemon is not supported")
        return Place(scope, Path(user_home) / "Library" / "LaunchAgents" / launchd.PLIST_NAME, "launchd")
    raise ServiceError(f"`blazar service` needs systemd (Linux) or launchd (macOS); this platform is {platform}")


@dataclass(frozen=True, slots=True)
class Done:
    """What install or uninstall did: the file, the systemctl calls made, and what is left for the user to run."""

    place: Place
    changed: bool  # the file was written (new or different) or removed
    ran: tuple[Ran, ...] = ()
    todo: tuple[str, ...] = ()
    why_todo: str = ""  # why the commands were not run here


def install(t: Target, where: Place, ctl: Systemctl, *, daemon_pid: int | None, uid: int) -> Done:
    """Write the unit (or plist), then reload, enable and (re)start it. `daemon_pid`: a daemon already serving this
    home outside the service; it is not stopped, so the unit is enabled but not started beside it."""
    content = (launchd.render(t) if where.kind == "launchd" else systemd.render(t, where.scope).encode())
    before = where.path.read_bytes() if where.path.exists() else None
    if before != content:
        _write(where.path, content)
    changed = before != content
    if where.kind == "launchd":
        domain = f"gui/{uid}"
        todo = ((f"launchctl bootout {domain}/{launchd.LABEL}",) if before is not None else ()) + (
            f"launchctl bootstrap {domain} {where.path}",)
        return Done(where, changed, todo=todo, why_todo="launchd loads an agent with launchctl")
    user = where.scope == "user"
    cmd = f"systemctl{' --user' if user else ''}"
    reload = ctl("daemon-reload", user=user)
    if not reload.ok:
        return Done(where, changed, (reload,), (f"{cmd} daemon-reload", f"{cmd} enable --now {UNIT_NAME}"),
                    _unreachable(reload))
    active = ctl("is-active", UNIT_NAME, user=user)
    enable = ctl("enable", UNIT_NAME, user=user)
    ran = [reload, active, enable]
    if not enable.ok:
        return Done(where, changed, tuple(ran), (f"{cmd} enable --now {UNIT_NAME}",), f"enable failed: {enable.output}")
    if daemon_pid is not None and active.output != "active":
        return Done(where, changed, tuple(ran), (f"kill -TERM {daemon_pid}", f"{cmd} start {UNIT_NAME}"),
                    f"a daemon (pid {daemon_pid}) already serves this home outside the service: stop it, then "
                    "start the service")
    if not changed and active.output == "active":
        return Done(where, changed, tuple(ran))  # the same unit, running: nothing to restart it for
    # NOTE: restart, not start: a service already running an older unit picks up the new one.
    ran.append(ctl("restart", UNIT_NAME, user=user))
    if not ran[-1].ok:
        return Done(where, changed, tuple(ran), (f"journalctl{' --user' if user else ''} -u blazar -e",),
                    f"the service did not start: {ran[-1].output}")
    return Done(where, changed, tuple(ran))


def uninstall(where: Place, ctl: Systemctl, *, uid: int) -> Done:
    """Stop and disable the service, remove its file, reload. Nothing installed: nothing done."""
    if not where.path.exists():
        return Done(where, False)
    if where.kind == "launchd":
        where.path.unlink()
        return Done(where, True, todo=(f"launchctl bootout gui/{uid}/{launchd.LABEL}",),
                    why_todo="launchd unloads an agent with launchctl")
    user = where.scope == "user"
    cmd = f"systemctl{' --user' if user else ''}"
    disable = ctl("disable", "--now", UNIT_NAME, user=user)
    where.path.unlink()
    if not disable.ok:
        # Without systemd's help its enable link goes too (it was made by a `systemctl enable` run by hand).
        for wants in where.path.parent.glob("*.wants"):  # NOTE: not a glob of the link: it dangles now
            if (wants / UNIT_NAME).is_symlink():
                (wants / UNIT_NAME).unlink()
        return Done(where, True, (disable,), (f"{cmd} stop {UNIT_NAME}", f"{cmd} daemon-reload"),
                    _unreachable(disable))
    return Done(where, True, (disable, ctl("daemon-reload", user=user)))


@dataclass(frozen=True, slots=True)
class Found:
    """An installed service as seen from this install and home."""

    place: Place
    argv: tuple[str, ...]
    home: str  # the data directory the unit's environment names
    same_install: bool
    same_home: bool
    active: str | None  # systemctl is-active's answer; None when it could not tell
    active_why: str = ""

    @property
    def points_here(self) -> bool:
        return self.same_install and self.same_home


def look(where: Place, this: Target, paths: Paths, ctl: Systemctl | None, *, user_home: str) -> Found | None:
    """The service installed at `where`, if any: what it runs and whether that is this install and this home;
    whether it is active when `ctl` is given and can tell."""
    try:
        data = where.path.read_bytes()
    except FileNotFoundError:
        return None
    if where.kind == "launchd":
        seen = launchd.read(data)
    else:
        seen = systemd.read(data.decode(errors="replace"), user_home=user_home)
        if seen.user:  # %h and the default home are that user's
            with contextlib.suppress(KeyError):
                user_home = pwd.getpwnam(seen.user).pw_dir
            seen = systemd.read(data.decode(errors="replace"), user_home=user_home)
    theirs = home_of(seen.env, user_home)
    active: str | None = None
    why = "launchd: see `launchctl print gui/UID/dev.blazar`" if where.kind == "launchd" else "not asked"
    if ctl is not None and where.kind == "systemd":
        ran = ctl("is-active", UNIT_NAME, user=where.scope == "user")
        first = ran.output.splitlines()[0].strip() if ran.output else ""
        active, why = (first, "") if ran.code is not None and first in _STATES else (None, _unreachable(ran))
    return Found(place=where, argv=seen.argv, home=str(theirs.data_dir),
                 same_install=seen.argv[:len(this.program)] == this.program and len(seen.argv) > len(this.program),
                 same_home=(theirs.config_dir, theirs.data_dir) == (paths.config_dir, paths.data_dir),
                 active=active, active_why=why)


def _unreachable(ran: Ran) -> str:
    return f"`{ran.command}` could not reach systemd ({ran.output or f'exit {ran.code}'})"


def _write(path: Path, content: bytes) -> None:
    """Whole or not at all (a temporary file beside it, renamed over it); 0644, as systemd and launchd expect."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(content)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
