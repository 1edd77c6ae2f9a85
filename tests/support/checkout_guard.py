"""The checkout stays as the tests found it: what git would list as new (untracked and not ignored) is listed when
the session starts and again when it ends, and anything new fails the run (tests/conftest.py). A test that ran the
CLI in the checkout once left a SQLite log named after a mistyped PostgreSQL URL there, and it was committed.

Ignored paths (.venv, caches, build outputs) never count; outside a git checkout there is nothing to compare."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def untracked(root: Path = REPO) -> set[str] | None:
    """The paths under `root` git does not track and does not ignore (a new directory as one `dir/` entry), or
    None when `root` is not a git checkout (or git cannot be run)."""
    try:
        found = subprocess.run(
            ["git", "-C", str(root), "ls-files", "--others", "--exclude-standard", "--directory", "-z"],
            capture_output=True, timeout=60, check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return {p for p in found.stdout.decode(errors="replace").split("\0") if p}


def left_behind(before: set[str] | None, root: Path = REPO) -> list[str]:
    """What appeared in the checkout since `before` (empty when there was nothing to compare)."""
    if before is None:
        return []
    after = untracked(root)
    return sorted((after or set()) - before)


def message(new: list[str], root: Path = REPO) -> str:
    return (f"the tests left {len(new)} new path(s) in the checkout ({root}): {', '.join(new)}; a test that writes "
            "files or runs the CLI must do it in a temporary directory (the tests' working directory is one)")
