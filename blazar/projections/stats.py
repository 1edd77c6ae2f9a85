"""The `stats` projection: how many events of each type the log holds, and its seq and time range."""

from __future__ import annotations

from dataclasses import dataclass, field

from blazar.events.base import Recorded
from blazar.projections.base import Projection


@dataclass(slots=True)
class StatsState:
    """What `blazar state` shows of the log as a whole (nothing else reads it)."""

    total: int = 0
    by_type: dict[str, int] = field(default_factory=dict)
    first_seq: int | None = None
    last_seq: int | None = None
    first_ts: float | None = None
    last_ts: float | None = None


class StatsProjection(Projection[StatsState]):
    name = "stats"
    state_type = StatsState
    version = 1
    types = None

    def initial(self) -> StatsState:
        return StatsState()

    def apply(self, state: StatsState, rec: Recorded) -> StatsState:
        state.by_type[rec.type] = state.by_type.get(rec.type, 0) + 1
        state.total += 1
        if state.first_seq is None:
            state.first_seq, state.first_ts = rec.seq, rec.ts
        state.last_seq, state.last_ts = rec.seq, rec.ts
        return state
