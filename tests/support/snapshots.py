"""A home's log and config as a snapshot test sees them: a fingerprint of what a refused restore must leave as it
was, config changes made in-process (the CLI's own handlers), then maybe a snapshot."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any

from blazar.bootstrap import bootstrap
from blazar.operations.config import set_value, unset_value
from blazar.operations.snapshot import take_snapshot
from blazar.paths import Paths

EXIT_SNAPSHOT_REFUSED = 3


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fingerprint(paths: Paths) -> dict[str, Any]:
    """What a refused restore must leave exactly as it was: the log's bytes, config.toml, the data dir."""
    return {
        "db": sha(paths.db),
        "config": paths.config_file.read_bytes() if paths.config_file.exists() else None,
        "files": sorted(p.name for p in paths.data_dir.iterdir()),
    }


def change_config(paths: Paths, changes: dict[str, str | None], snapshot_to: Path | None = None) -> None:
    """Config changes made in-process (the CLI's own handlers, without a CLI start-up each), then maybe a snapshot."""

    async def go() -> None:
        app = await bootstrap(paths=paths, actor="test:seed")
        try:
            for key, value in changes.items():
                await (set_value(app, key, value) if value is not None else unset_value(app, key))
            if snapshot_to is not None:
                await take_snapshot(app, snapshot_to)
        finally:
            await app.close()

    asyncio.run(go())


def seed_and_snapshot(paths: Paths, dest: Path | None) -> None:
    change_config(paths, {"log_level": "info", "pii_scrub": "false"}, dest)
