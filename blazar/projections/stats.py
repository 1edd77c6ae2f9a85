"""The `stats` projection: how many events of each type the log holds, and its seq and time range."""

from __future__ import annotations

from blazar.events.base import Recorded
from blazar.projections.base import Projection, State, TypedState


class StatsState(TypedState):
    """The `stats` projection's state; `blazar state` shows it (no reader: nothing else reads it)."""

    __slots__ = ()


class StatsProjection(Projection):
    name = "stats"
    state_type = StatsState
    version = 1
    types = None

    def initial(self) -> State:
        return {"total": 0, "by_type": {}, "first_seq": None, "last_seq": None, "first_ts": None, "last_ts": None}

    def apply(self, state: State, rec: Recorded) -> State:
        by_type = state["by_type"]
        by_type[rec.type] = by_type.get(rec.type, 0) + 1
        state["total"] += 1
        if state["first_seq"] is None:
            state["first_seq"] = rec.seq
            state["first_ts"] = rec.ts
        state["last_seq"] = rec.seq
        state["last_ts"] = rec.ts
        return state
