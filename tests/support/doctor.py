"""`blazar doctor`'s checks on a home, as the CLI runs them, in this process."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from blazar.bootstrap import bootstrap
from blazar.operations.doctor import checks
from blazar.operations.doctor.report import Check
from blazar.paths import Paths
from blazar.queries.file_modes import loose_modes
from tests.support.blazar_home import home_paths


def run_checks(home: Path, *, quick: bool = False) -> dict[str, Check]:
    """Both halves of the checks, as the CLI runs them (the log opened between them, when safe)."""
    paths = home_paths(home)
    found = asyncio.run(checks.before_open(paths, {"XDG_CACHE_HOME": str(home / "cache")},
                                           loose_modes=loose_modes(paths), now=time.time(), quick=quick))
    if checks.safe_to_open(found):
        found += asyncio.run(_with_log(paths, quick))
    else:
        found += checks.not_opened()
    return {c.id: c for c in found}


async def _with_log(paths: Paths, quick: bool) -> list[Check]:
    app = await bootstrap(paths=paths, env={}, actor="test:pytest", reconcile_config=False)
    try:
        return await checks.with_log(app, quick=quick)
    finally:
        await app.close()
