"""Only the entry points read the environment: `bootstrap.py` and the CLI's commands read `os.environ` and pass it
down (`app.env`, a `Paths`, an engine child's `child_env`); nothing below them reads it on its own."""

from __future__ import annotations

import re
from pathlib import Path

import blazar

ROOT = Path(blazar.__file__).parent
READS = re.compile(r"\bos\.environ\b|\bgetenv\(|\benviron\.get\(")
ENTRY_POINTS = {"bootstrap.py"}


def test_only_bootstrap_and_the_cli_read_the_environment() -> None:
    readers = sorted(
        str(path.relative_to(ROOT)) for path in ROOT.rglob("*.py")
        if path.relative_to(ROOT).parts[0] != "cli" and path.name not in ENTRY_POINTS
        and any(READS.search(line) and not line.lstrip().startswith("#") and '"""' not in line
                for line in path.read_text().splitlines())
    )
    assert readers == []
