"""Waiting for an admission slot in unit tests, bounded: a request queued as a task (where it was told it queued),
one that must be admitted at once, one that must be refused at once. A bug that queues what should not fails the
bound rather than hanging."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from blazar.serving.admission import Admission, Ticket

BOUND_S = 2.0  # every wait in these tests ends well before this, or the test fails instead of hanging


class Queued:
    """A request waiting for a slot, started as a task; `position`/`depth` are what on_queued reported."""

    def __init__(self, task: asyncio.Task[Ticket], position: int, depth: int) -> None:
        self.task, self.position, self.depth = task, position, depth

    async def admitted(self) -> Ticket:
        async with asyncio.timeout(BOUND_S):
            return await self.task


async def enqueue(adm: Admission, key: str, slots: int = 1, *, priority: int = 0, tenant: str = "",
                  weight: int = 1) -> Queued:
    seen = asyncio.Event()
    report: list[tuple[int, int]] = []

    def on_queued(position: int, depth: int) -> None:
        report.append((position, depth))
        seen.set()

    task = asyncio.create_task(adm.acquire(key, slots, priority=priority, on_queued=on_queued, tenant=tenant,
                                           weight=weight))
    async with asyncio.timeout(BOUND_S):
        await seen.wait()
    assert len(report) == 1
    return Queued(task, *report[0])


async def now(adm: Admission, key: str, slots: int = 1, *, priority: int = 0, tenant: str = "",
              weight: int = 1) -> Ticket:
    """Acquire that must not queue."""
    def on_queued(position: int, depth: int) -> None:
        raise AssertionError(f"queued at {position} of {depth}")

    async with asyncio.timeout(BOUND_S):
        return await adm.acquire(key, slots, priority=priority, on_queued=on_queued, tenant=tenant, weight=weight)


async def refused(call: Coroutine[Any, Any, Ticket]) -> None:
    """An acquire expected to raise at once; a bug that queues it instead fails the bound rather than hanging."""
    async with asyncio.timeout(BOUND_S):
        await call
    raise AssertionError("admitted, but a refusal was expected")
