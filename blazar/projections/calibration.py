"""The `calibration` projection: per model, the recent differences between what the engine allocated and what the
planner expected (`instance.memory_measured`), and `correction_for`, the bytes the next plan adds for that model.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from blazar.events.base import Recorded
from blazar.events.models import InstanceMemoryMeasured
from blazar.projections.base import Projection

# Differences kept per model, newest last. Few on purpose: a new engine build or driver changes the numbers, and
# the median of a short window follows that within a few loads.
RECENT_PER_MODEL = 8


def shape_key(ctx: int, slots: int, cache_type_k: str, cache_type_v: str) -> str:
    return f"{ctx}|{slots}|{cache_type_k.lower()}|{cache_type_v.lower()}"


@dataclass(slots=True)
class Measurement:
    """One `instance.memory_measured`: what a load of the model at `shape` allocated against its plan."""

    seq: int
    shape: str  # shape_key(ctx, slots, cache types)
    planned_bytes: int
    measured_bytes: int
    diff_bytes: int  # measured - planned


@dataclass(slots=True)
class CalibrationState:
    """The `calibration` projection's state; `correction_for` reads it."""

    models: dict[str, list[Measurement]] = field(default_factory=dict)  # the latest few per model, newest last
    measurements: int = 0
    last_seq: int = 0


class CalibrationProjection(Projection[CalibrationState]):
    node_local = True
    name = "calibration"
    state_type = CalibrationState
    version = 2
    types = frozenset({InstanceMemoryMeasured.TYPE})

    def initial(self) -> CalibrationState:
        return CalibrationState()

    def apply(self, state: CalibrationState, rec: Recorded) -> CalibrationState:
        ev = rec.event
        assert isinstance(ev, InstanceMemoryMeasured)
        recent = state.models.setdefault(ev.model, [])
        shape = shape_key(ev.ctx_tokens, ev.slots, ev.cache_type_k, ev.cache_type_v)
        recent.append(Measurement(seq=rec.seq, shape=shape, planned_bytes=ev.planned_bytes,
                                  measured_bytes=ev.measured_bytes, diff_bytes=ev.measured_bytes - ev.planned_bytes))
        del recent[:-RECENT_PER_MODEL]
        state.measurements += 1
        state.last_seq = rec.seq
        return state


def correction_for(state: CalibrationState, model: str, ctx: int, slots: int, cache_type_k: str,
                   cache_type_v: str) -> int:
    """Bytes to add to the next plan of `model`: the latest difference measured at this very shape, else the
    median of the model's recent differences (the higher middle value: when in doubt, plan for more), else 0."""
    recent = state.models.get(model)
    if not recent:
        return 0
    key = shape_key(ctx, slots, cache_type_k, cache_type_v)
    for m in reversed(recent):
        if m.shape == key:
            return m.diff_bytes
    return statistics.median_high(m.diff_bytes for m in recent)
