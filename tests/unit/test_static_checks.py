"""The static checks as tests: ruff over the repository, mypy over blazar/ and the import contracts, all configured
in pyproject.toml.

They run the tools from this interpreter's environment (the bin dir beside sys.executable), from the repo root
so that pyproject.toml is the configuration they read.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
RUFF = BIN / "ruff"
MYPY = BIN / "mypy"
LINT_IMPORTS = BIN / "lint-imports"


def _run(tool: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(tool), *args], cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)


def test_ruff_finds_nothing_to_fix() -> None:
    assert RUFF.exists(), f"ruff is not installed in {BIN} (pip install -e '.[dev]')"
    result = _run(RUFF, "check")  # the whole repository, .gitignore'd paths aside
    assert result.returncode == 0, f"ruff failed (exit {result.returncode}):\n{result.stdout}{result.stderr}"


@pytest.mark.slow
@pytest.mark.skipif(not MYPY.exists(), reason=f"mypy is not installed in {BIN} (pip install -e '.[dev]')")
def test_mypy_finds_no_type_errors_in_blazar() -> None:
    result = _run(MYPY)
    assert result.returncode == 0, f"mypy failed (exit {result.returncode}):\n{result.stdout}{result.stderr}"


def test_imports_keep_the_layer_contracts() -> None:
    assert LINT_IMPORTS.exists(), f"lint-imports is not installed in {BIN} (pip install -e '.[dev]')"
    result = _run(LINT_IMPORTS)
    assert result.returncode == 0, f"lint-imports failed (exit {result.returncode}):\n{result.stdout}{result.stderr}"
