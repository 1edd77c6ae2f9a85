"""Installing a part Blazar can do without until it is needed (cmake and ninja for `engine build`, a model's PyPI
package for `pull`) into the environment Blazar itself runs in, with this interpreter's own pip.

That is the environment `pipx install blazar` made, or the virtual environment `pip install blazar` went into: pip
writes into `sys.prefix`. A pipx environment has no pip of its own but imports pipx's shared one (a .pth file in its
site-packages names pipx's shared libraries), so `python -m pip install` works there too. Where pip cannot run (no
pip at all, offline, an externally managed system Python), the caller says the exact command to run by hand: for a
pipx environment that is `pipx inject`, which pipx then remembers across `pipx upgrade` and `pipx reinstall`.
"""

from __future__ import annotations

import importlib.util
import shlex
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

# Runs pip's argv, its output on our stderr (stdout stays the command's own, for --json); returns the exit code.
Runner = Callable[[list[str]], int]
Say = Callable[[str], None]
PIPX_METADATA = "pipx_metadata.json"  # what pipx writes at the top of each environment it makes


@dataclass(frozen=True)
class PythonEnv:
    """The environment Blazar runs in, as far as installing into it goes."""

    executable: str
    prefix: str  # where pip installs: the virtual environment's directory
    has_pip: bool
    pipx_name: str | None  # the pipx environment's name (what `pipx inject` takes); None: not made by pipx


def pipx_name(prefix: Path) -> str | None:
    """pipx names an environment after its directory under PIPX_HOME/venvs, and marks it with its metadata file."""
    return prefix.name if (prefix / PIPX_METADATA).is_file() else None


def this_env() -> PythonEnv:
    return PythonEnv(executable=sys.executable, prefix=sys.prefix, has_pip=importlib.util.find_spec("pip") is not None,
                     pipx_name=pipx_name(Path(sys.prefix)))


def install_argv(env: PythonEnv, requirements: Sequence[str]) -> list[str]:
    return [env.executable, "-m", "pip", "install", "--disable-pip-version-check", *requirements]


def by_hand(env: PythonEnv, requirements: Sequence[str]) -> str:
    """The command a person runs to install `requirements` where Blazar could not: pipx's own for a pipx
    environment (a plain pip install there is forgotten by `pipx reinstall`), else this interpreter's pip."""
    reqs = " ".join(shlex.quote(r) for r in requirements)
    if env.pipx_name is not None:
        return f"pipx inject {shlex.quote(env.pipx_name)} {reqs}"
    return f"{shlex.quote(env.executable)} -m pip install {reqs}"


def run_pip(argv: list[str]) -> int:
    try:
        return subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=sys.stderr, check=False).returncode
    except OSError:
        return 127


def install(requirements: Sequence[str], *, why: str, say: Say, env: PythonEnv | None = None,
            runner: Runner | None = None) -> str | None:
    """Install `requirements` with this interpreter's pip, saying so first (`why`: what needs them). None when
    they are installed; else why not, with the command to run by hand, for the caller's own error."""
    env = env or this_env()
    manual = by_hand(env, requirements)
    if not env.has_pip:
        return f"{why} needs {', '.join(requirements)}, and this Python has no pip to install them: run `{manual}`"
    say(f"{why} needs {', '.join(requirements)}: installing them with pip into {env.prefix}")
    rc = (runner or run_pip)(install_argv(env, requirements))
    if rc != 0:
        return (f"{why} needs {', '.join(requirements)}, and pip could not install them (exit {rc}; offline?): "
                f"run `{manual}`")
    importlib.invalidate_caches()  # the packages pip just wrote are importable in this process from now on
    return None
