"""Recording control events: append durably, then bring this process's projections up to date."""

from __future__ import annotations

from blazar.bootstrap import Blazar
from blazar.events.base import Event, Recorded


async def record(app: Blazar, events: Event | list[Event], *, cause: int | None = None) -> list[Recorded]:
    """Durable append (committed before this returns) and catch-up, so the caller reads its own writes."""
    recorded = await app.log.append(events, actor=app.actor, cause=cause)
    if recorded:
        # catch_up (not apply) so events other processes appended meanwhile are folded in seq order too.
        await app.runner.catch_up()
    return recorded
