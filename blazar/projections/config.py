"""The `config` projection: the configuration overrides the log has recorded, and the effective result."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import JsonValue

from blazar import config as settings
from blazar.events.base import Recorded
from blazar.events.system import ConfigChanged
from blazar.projections.base import Projection


@dataclass(slots=True)
class ConfigState:
    """The overrides the log has recorded, `section.key` to value as recorded (unknown keys included: the values are
    whatever JSON `config.changed` recorded, which blazar.config validates when it builds the settings)."""

    overrides: dict[str, JsonValue] = field(default_factory=dict)
    changes: int = 0
    last_seq: int = 0


class ConfigProjection(Projection[ConfigState]):
    name = "config"
    state_type = ConfigState
    version = 3  # 2: keys are section.key; an old flat name in the log is read under its new one. 3: typed
    types = frozenset({ConfigChanged.TYPE})

    def initial(self) -> ConfigState:
        return ConfigState()

    def apply(self, state: ConfigState, rec: Recorded) -> ConfigState:
        ev = rec.event
        assert isinstance(ev, ConfigChanged)
        key = settings.current_key(ev.key)  # history is not rewritten: an old event's flat name is read here
        if ev.new is None:
            state.overrides.pop(key, None)
        else:
            state.overrides[key] = ev.new
        state.changes += 1
        state.last_seq = rec.seq
        return state

    def view(self, state: ConfigState) -> Any:
        # Defaults are code, not log: the effective map is derived here rather than stored in checkpoints.
        known = {k: v for k, v in state.overrides.items() if k in settings.FIELDS}
        return {"overrides": dict(state.overrides), "changes": state.changes, "last_seq": state.last_seq,
                "effective": settings.effective(known)}


def overrides(state: ConfigState) -> dict[str, JsonValue]:
    """The overrides the log has recorded, key to value (a copy, so a caller's edit is not the state's)."""
    return dict(state.overrides)
