"""The `config` projection: the configuration overrides the log has recorded, and the effective result."""

from __future__ import annotations

from typing import Any

from blazar import config as settings
from blazar.events.base import Recorded
from blazar.events.system import ConfigChanged
from blazar.projections.base import Projection, State, TypedState


class ConfigState(TypedState):
    """The `config` projection's state, read through `overrides`."""

    __slots__ = ()


class ConfigProjection(Projection[State]):
    name = "config"
    state_type = ConfigState
    version = 2  # 2: keys are section.key; an old flat name in the log is read under its new one
    types = frozenset({ConfigChanged.TYPE})

    def initial(self) -> State:
        return {"overrides": {}, "changes": 0, "last_seq": 0}

    def apply(self, state: State, rec: Recorded) -> State:
        ev = rec.event
        assert isinstance(ev, ConfigChanged)
        key = settings.current_key(ev.key)  # history is not rewritten: an old event's flat name is read here
        if ev.new is None:
            state["overrides"].pop(key, None)
        else:
            state["overrides"][key] = ev.new
        state["changes"] += 1
        state["last_seq"] = rec.seq
        return state

    def view(self, state: State) -> Any:
        # Defaults are code, not log: the effective map is derived here rather than stored in checkpoints.
        known = {k: v for k, v in state["overrides"].items() if k in settings.FIELDS}
        return {**state, "effective": settings.effective(known)}


def overrides(state: ConfigState) -> dict[str, Any]:
    """The overrides the log has recorded, key to value (a copy; unknown keys included, as recorded): the values
    are whatever JSON `config.changed` recorded, which blazar.config validates."""
    return dict(state._raw["overrides"])
