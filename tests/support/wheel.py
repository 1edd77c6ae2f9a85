"""Blazar as a user installs it without the checkout: the wheel built from this checkout (hatchling, as pyproject.toml
says, built once per test process), and a fresh virtual environment with that wheel installed.

Its dependencies cannot come from PyPI in a test: a `.pth` line in the fresh environment's site-packages names the
dev environment's site-packages instead. A directory added by a .pth line does not get its own .pth files read, so
the dev environment's editable install of `blazar` (a .pth of its own) is not active there: `import blazar` finds
the wheel's copy (the tests assert it)."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.support.homes import session_file

REPO = Path(__file__).resolve().parents[2]
WHEEL = "blazar-0.1.0-py3-none-any.whl"
BUILD_S = 120


def require_hatchling() -> None:
    """The wheel is built by hatchling (the dev extra has it): missing, the test skips, unless
    BLAZAR_REQUIRE_ENGINE=1 (CI, where `scripts/setup --dev` installed it) makes that a failure."""
    try:
        import hatchling  # noqa: F401
    except ImportError:
        msg = "hatchling is not installed (pip install -e '.[dev]'): no wheel to test"
        if os.environ.get("BLAZAR_REQUIRE_ENGINE") == "1":
            pytest.fail(msg)
        pytest.skip(msg)


def _build(dest: Path) -> None:
    dest.mkdir()
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "--disable-pip-version-check", "-w", str(dest), str(REPO)],
                   check=True, capture_output=True, timeout=BUILD_S, cwd=dest)


def built_wheel() -> Path:
    """The wheel of this checkout, built once per test process."""
    require_hatchling()
    return session_file("wheel", _build) / WHEEL


def wheel_names(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as z:
        return set(z.namelist())


def fresh_venv(wheel: Path, where: Path) -> Path:
    """A new virtual environment at `where` with `wheel` installed (no dependencies: they come from the dev
    environment through a .pth line); returns its bin directory."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, capture_output=True,
                   timeout=BUILD_S)
    python = where / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
                    "--no-index", "--disable-pip-version-check", str(wheel)], check=True, capture_output=True,
                   timeout=BUILD_S)
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True, timeout=BUILD_S).stdout.strip()
    (Path(purelib) / "_blazar_dev_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return where / "bin"
