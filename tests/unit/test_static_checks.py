"""The static checks as tests: ruff over the repository, mypy over blazar/ (`--strict` for the pure core) and the
import contracts, all configured in pyproject.toml.

They run the tools from this interpreter's environment (the bin dir beside sys.executable), from the repo root
so that pyproject.toml is the configuration they read.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
RUFF = BIN / "ruff"
MYPY = BIN / "mypy"
LINT_IMPORTS = BIN / "lint-imports"
# The packages mypy checks with every flag of --strict (pyproject.toml's [[tool.mypy.overrides]]).
STRICT = ("blazar.events.*", "blazar.projections.*", "blazar.fit.*", "blazar.dialects.*")


def _run(tool: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(tool), *args], cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)


def test_ruff_finds_nothing_to_fix() -> None:
    assert RUFF.exists(), f"ruff is not installed in {BIN} (pip install -e '.[dev]')"
    result = _run(RUFF, "check")  # the whole repository, .gitignore'd paths aside
    assert result.returncode == 0, f"ruff failed (exit {result.returncode}):\n{result.stdout}{result.stderr}"


@pytest.mark.slow(reason="mypy over all of blazar/ with an empty cache takes one to two minutes on 2 cores")
@pytest.mark.skipif(not MYPY.exists(), reason=f"mypy is not installed in {BIN} (pip install -e '.[dev]')")
def test_mypy_finds_no_type_errors_in_blazar() -> None:
    result = _run(MYPY)
    assert result.returncode == 0, f"mypy failed (exit {result.returncode}):\n{result.stdout}{result.stderr}"


def test_imports_keep_the_layer_contracts() -> None:
    assert LINT_IMPORTS.exists(), f"lint-imports is not installed in {BIN} (pip install -e '.[dev]')"
    result = _run(LINT_IMPORTS)
    assert result.returncode == 0, f"lint-imports failed (exit {result.returncode}):\n{result.stdout}{result.stderr}"


def _strict_flags() -> list[str]:
    """The flags `mypy --strict` turns on, as this mypy's --help lists them."""
    text = subprocess.run([str(MYPY), "--help"], capture_output=True, text=True, timeout=60, check=True).stdout
    found = re.search(r"^  --strict\s+(.*?)^  --", text, re.M | re.S)
    assert found is not None, "mypy --help no longer describes --strict"
    return re.findall(r"--([a-z]+(?:-\s*[a-z]+)*)", found.group(1).split("flags:", 1)[1])


@pytest.mark.skipif(not MYPY.exists(), reason=f"mypy is not installed in {BIN} (pip install -e '.[dev]')")
def test_the_pure_core_is_checked_with_every_flag_of_mypy_strict() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    (core,) = [o for o in config.get("overrides", []) if set(o["module"]) == set(STRICT)]
    flags = [re.sub(r"-\s*", "_", f) for f in _strict_flags()]
    assert len(flags) >= 10, flags
    missing = [f for f in flags if core.get(f) is not True and config.get(f) is not True]
    assert not missing, f"pyproject.toml's strict override for {', '.join(STRICT)} lacks: {', '.join(missing)}"


def test_no_type_ignore_in_blazar() -> None:
    # A `type: ignore` hides what the types say; where a value's type is known only at run time, a check says so.
    found = [f"{p.relative_to(ROOT)}:{n}" for p in sorted((ROOT / "blazar").rglob("*.py"))
             for n, line in enumerate(p.read_text().splitlines(), 1) if "type: ignore" in line]
    assert found == []
