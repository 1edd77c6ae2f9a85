"""A test's view of a BLAZAR_HOME that the CLI writes to: its event log, read in the shape `blazar events --json`
prints (one dict per event), a model put in its store, a config key set and request history recorded in the past,
each without the half second a CLI subprocess costs."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from blazar.bootstrap import bootstrap
from blazar.clock import FakeClock
from blazar.events.log_sqlite import SqliteEventLog
from blazar.events.models import ModelAliased
from blazar.events.requests import RequestCompleted, RequestReceived
from blazar.operations.config import set_value
from blazar.paths import Paths
from blazar.store.models import import_model


def home_paths(home: Path) -> Paths:
    return Paths.from_env({"BLAZAR_HOME": str(home)})


def read_events(home: Path, *types: str) -> list[dict[str, Any]]:
    """Every event in `home`'s log (only those of `types` when given), oldest first, as `Recorded.to_json()`."""
    db = home_paths(home).db
    if not db.exists():
        return []

    async def read() -> list[dict[str, Any]]:
        log = await SqliteEventLog.open(db, migrate=False)
        try:
            return [rec.to_json() async for rec in log.read(types=list(types) or None)]
        finally:
            await log.close()

    return asyncio.run(read())


def event_types(home: Path) -> list[str]:
    return [e["type"] for e in read_events(home)]


def import_into(home: Path, src: Path, name: str) -> None:
    """`blazar import SRC --name NAME`, in this process."""

    async def go() -> None:
        app = await bootstrap(paths=home_paths(home), env={}, actor="test:pytest")
        try:
            await import_model(app, src, name)
        finally:
            await app.close()

    asyncio.run(go())


def configure(home: Path, key: str, text: str) -> None:
    """`blazar config set KEY TEXT`, in this process."""

    async def go() -> None:
        app = await bootstrap(paths=home_paths(home), env={}, actor="test:pytest")
        try:
            await set_value(app, key, text)
        finally:
            await app.close()

    asyncio.run(go())


def seed_history(home: Path, *, age_s: float, traces: int, prefix: str = "old", env: dict[str, str] | None = None
                 ) -> None:
    """`traces` request traces (received + completed) and one control event, recorded `age_s` ago."""

    async def go() -> None:
        clock = FakeClock(time.time() - age_s)
        app = await bootstrap(paths=home_paths(home), env=env or {}, actor="test:pytest", clock=clock)
        try:
            await app.log.append(ModelAliased(alias=f"{prefix}-alias", target="m"), actor="test:pytest")
            for i in range(traces):
                tid = f"{prefix}-{i}"
                await app.log.append(RequestReceived(trace_id=tid, dialect="openai", route="/v1/chat/completions",
                                                     model="m"), actor="gateway", trace_id=tid)
                clock.advance(1)
                await app.log.append(RequestCompleted(trace_id=tid, model="m", duration_ms=3.0), actor="gateway",
                                     trace_id=tid)
        finally:
            await app.close()

    asyncio.run(go())
