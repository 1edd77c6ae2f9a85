"""The session guard against stray files: what git would list as new in the checkout is found (a file, a whole new
directory as one entry), while ignored paths (caches, .venv) and what was there before never count."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.checkout_guard import left_behind, message, untracked


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    root = tmp_path / "checkout"
    root.mkdir()
    subprocess.run(["git", "init", "-q", str(root)], check=True, timeout=60)
    (root / ".gitignore").write_text(".venv/\n__pycache__/\n")
    (root / "README.md").write_text("x\n")
    return root


def test_new_files_and_directories_are_found_and_ignored_ones_are_not(checkout: Path) -> None:
    before = untracked(checkout)
    assert before == {".gitignore", "README.md"}  # nothing committed yet: untracked, and there before
    (checkout / ".venv" / "bin").mkdir(parents=True)
    (checkout / "__pycache__").mkdir()
    (checkout / "__pycache__" / "x.pyc").write_bytes(b"")
    (checkout / "postgresql+asyncpg:1" / "blazar@127.0.0.1:145405").mkdir(parents=True)
    (checkout / "postgresql+asyncpg:1" / "blazar@127.0.0.1:145405" / "nowhere").write_bytes(b"SQLite")
    (checkout / "stray.db").write_bytes(b"")
    new = left_behind(before, checkout)
    assert new == ["postgresql+asyncpg:1/", "stray.db"]
    assert "postgresql+asyncpg:1/" in message(new, checkout)


def test_nothing_new_is_nothing_to_report(checkout: Path) -> None:
    (checkout / "scratch.txt").write_text("a developer's own file, there before the session")
    before = untracked(checkout)
    assert left_behind(before, checkout) == []


def test_outside_a_git_checkout_there_is_nothing_to_compare(tmp_path: Path) -> None:
    assert untracked(tmp_path / "not-a-checkout") is None
    assert left_behind(None, tmp_path) == []
