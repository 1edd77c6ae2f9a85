"""Whose service, for which home: a user unit is this user's, for the home this environment names; a system unit
runs as the user behind `sudo` (SUDO_USER), for that user's home. Writing or removing a system unit needs root."""

from __future__ import annotations

import os
import pwd
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from blazar.errors import ServiceError
from blazar.logdb import archive_location
from blazar.operations.service.manage import SYSTEM_UNIT_DIR, Place, place
from blazar.operations.service.target import Scope, Target, target
from blazar.paths import Paths


@dataclass(frozen=True, slots=True)
class Setup:
    place: Place
    target: Target  # what this install would run for this home
    paths: Paths
    user_home: str
    uid: int


def pick(user: bool, system: bool) -> Scope:
    if user and system:
        raise ServiceError("--user and --system: choose one (a user unit is the default)")
    return "system" if system else "user"


def invoking_user(env: Mapping[str, str], euid: int) -> pwd.struct_passwd:
    """Whom a system unit runs as: the user behind sudo when root runs it through sudo, else this one."""
    sudo_user = env.get("SUDO_USER")
    if euid == 0 and sudo_user and sudo_user != "root":
        try:
            return pwd.getpwnam(sudo_user)
        except KeyError:
            pass
    return pwd.getpwuid(euid)


def setup(scope: Scope, env: Mapping[str, str], *, executable: str, platform: str, euid: int,
          writing: bool) -> Setup:
    """Everything `blazar service` needs for `scope`; `writing`: install or uninstall (a system unit needs root)."""
    if scope == "system" and writing and euid != 0 and platform.startswith("linux"):
        raise ServiceError(f"a system unit goes in {SYSTEM_UNIT_DIR}, which needs root: run `sudo "
                           f"{executable_hint(executable)} service ... --system`, or install a user unit (the "
                           "default, no root)")
    who = invoking_user(env, euid) if scope == "system" else pwd.getpwuid(euid)
    user_home = who.pw_dir if scope == "system" else (env.get("HOME") or who.pw_dir)
    paths = Paths.from_env({**env, "HOME": user_home})
    where = place(scope, platform=platform, config_home=env.get("XDG_CONFIG_HOME") if scope == "user" else None,
                  user_home=user_home)
    t = target(paths, env, executable=executable, archive=archive_location(paths, env),
               user=who.pw_name if scope == "system" else None)
    return Setup(where, t, paths, user_home, who.pw_uid)


def executable_hint(executable: str) -> str:
    """The `blazar` to name in a sudo command: root's PATH rarely holds a venv's."""
    script = Path(os.path.abspath(executable)).parent / "blazar"
    return str(script) if script.exists() else "blazar"
