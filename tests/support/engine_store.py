"""The engine store as its tests see it: the log's event types, one type's records, the engines projection, file
digests, and stand-in engines (shell scripts that answer --version and --help like llama-server)."""

from __future__ import annotations

import hashlib
import stat
from pathlib import Path

from blazar.context import Blazar
from blazar.projections.engines import EnginesState

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "llama_server"


async def types(app: Blazar) -> list[str]:
    return [r.type async for r in app.log.read()]


async def events(app: Blazar, type_name: str) -> list:
    return [r async for r in app.log.read(types=[type_name])]


def size_and_sha256(path: Path) -> tuple[int, str]:
    data = path.read_bytes()
    return len(data), hashlib.sha256(data).hexdigest()


def engines_state(app: Blazar) -> EnginesState:
    return app.runner.state("engines")


def stand_in(path: Path, serve: str, *, note: str = "") -> Path:
    """A shell script that answers --version and --help like the real engine and does `serve` when started."""
    path.write_text("#!/bin/sh\n"
                    f"# {note}\n"
                    'case "$1" in\n'
                    f'  --version) cat "{FIXTURES / "version.txt"}" ;;\n'
                    f'  --help) cat "{FIXTURES / "help.txt"}" ;;\n'
                    f"  *) {serve} ;;\n"
                    "esac\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path

