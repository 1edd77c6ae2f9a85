"""`blazar state`: every projection's view as of now, or as of a past seq or time (by replay)."""

from __future__ import annotations

from typing import Any

from blazar.events.log import EventLog
from blazar.projections import all_projections
from blazar.projections.runner import ProjectionRunner


async def state_at(log: EventLog, *, seq: int | None = None, use_checkpoints: bool = True) -> dict[str, Any]:
    """Fold every projection up to `seq` (inclusive; None = the whole log)."""
    runner = ProjectionRunner(log, all_projections())
    await runner.start(upto=seq, use_checkpoints=use_checkpoints)
    return {"seq": runner.seq, "projections": runner.views()}


def current_state(runner: ProjectionRunner) -> dict[str, Any]:
    return {"seq": runner.seq, "projections": runner.views()}
