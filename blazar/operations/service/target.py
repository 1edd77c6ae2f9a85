"""What a service runs, decided from this process: the absolute path of this install's `blazar`, the variables that
name this home, the directories the daemon writes (the only ones a hardened unit leaves writable) and, for a system
unit, the user it runs as. Pure but for the file checks of `this_install`; the renderers read only a `Target`."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from blazar.paths import Paths

Scope = Literal["user", "system"]
UNIT_NAME = "blazar.service"


@dataclass(frozen=True, slots=True)
class Target:
    argv: tuple[str, ...]  # the program (absolute) and its arguments, `serve` last
    env: tuple[tuple[str, str], ...]  # what names the home: BLAZAR_HOME, or XDG_CONFIG_HOME and XDG_DATA_HOME
    writable: tuple[str, ...]  # absolute directories the daemon writes: the home's, an archive elsewhere
    log_dir: str  # the home's log/ (launchd writes the daemon's output there; systemd has the journal)
    user: str | None = None  # User= of a system unit

    @property
    def program(self) -> tuple[str, ...]:
        """The part of argv that says which install runs: the script, or the interpreter with `-m module`."""
        return self.argv[:-1]


def this_install(executable: str) -> tuple[str, ...]:
    """How to run this install's `blazar`, by absolute path: the console script beside the interpreter (a venv's,
    pipx's), else the interpreter with `-m blazar.cli.main`. NOTE: not resolved: a venv's python is a symlink to the
    system's, whose directory has no `blazar`."""
    python = Path(os.path.abspath(executable))
    script = python.parent / "blazar"
    if _runnable(script):
        return (str(script),)
    return (str(python), "-m", "blazar.cli.main")


def _runnable(script: Path) -> bool:
    """An executable file whose `#!` interpreter exists (a venv copied or moved keeps scripts naming the old one)."""
    try:
        with script.open("rb") as fh:
            first = fh.readline(4096)
    except OSError:
        return False
    if not os.access(script, os.X_OK):
        return False
    if not first.startswith(b"#!"):
        return True
    words = first[2:].decode(errors="replace").split()
    return bool(words) and Path(words[0]).is_file()


def home_env(paths: Paths, env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The variables that make `Paths.from_env` give `paths` again whatever HOME the service starts with."""
    if env.get("BLAZAR_HOME"):
        return (("BLAZAR_HOME", str(paths.data_dir)),)
    return (("XDG_CONFIG_HOME", str(paths.config_dir.parent)), ("XDG_DATA_HOME", str(paths.data_dir.parent)))


def writable(paths: Paths, archive: Path) -> tuple[str, ...]:
    """The home's directories, and the archive's when `archive_dir` puts it elsewhere: everything the daemon writes
    (engine builds, snapshots and imports are the CLI's, run outside the unit)."""
    dirs = [paths.config_dir, paths.data_dir]
    if not any(archive.is_relative_to(d) for d in dirs):
        dirs.append(archive)
    return tuple(dict.fromkeys(str(d) for d in dirs))


def target(paths: Paths, env: Mapping[str, str], *, executable: str, archive: Path,
           user: str | None = None) -> Target:
    return Target(argv=(*this_install(executable), "serve"), env=home_env(paths, env),
                  writable=writable(paths, archive), log_dir=str(paths.log), user=user)


def home_of(unit_env: Mapping[str, str], user_home: str) -> Paths:
    """The home a service's environment names, as the daemon it starts would resolve it."""
    return Paths.from_env({"HOME": user_home, **unit_env})
