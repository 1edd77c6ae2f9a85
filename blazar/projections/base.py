"""A projection is a fold over the log: `state = apply(state, recorded)`.

Rules: `apply` is deterministic and total, reads nothing but its arguments (time comes from the envelope), and
may mutate the state it is given (the runner owns each state object; nobody else holds it). State is plain
JSON data (dicts, lists, str, int, float, bool, None) so checkpoints, `blazar state --json` and equality in
tests need no extra code. Bump `version` whenever `apply` changes meaning: the checkpoint is then dropped.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from blazar.events.base import Recorded

State = dict[str, Any]


class Projection(ABC):
    name: ClassVar[str]
    version: ClassVar[int] = 1
    # The event types `apply` looks at; None means every event.
    types: ClassVar[frozenset[str] | None] = None
    # What lives on one machine (models, engines, calibration, saved KV slots): where several gateways share the
    # log, a runner with a node folds only that node's node-local events (and those with no node), and keeps its
    # checkpoint under its own name ("catalog@gpu-1").
    node_local: ClassVar[bool] = False

    @abstractmethod
    def initial(self) -> State: ...

    @abstractmethod
    def apply(self, state: State, rec: Recorded) -> State: ...

    def view(self, state: State) -> Any:
        """What `blazar state` shows; by default the state itself."""
        return state

    def wants(self, type_name: str) -> bool:
        return self.types is None or type_name in self.types


def fold(projection: Projection, records: list[Recorded], state: State | None = None) -> State:
    """Apply `records` in order to `state` (or to a fresh initial state)."""
    st = projection.initial() if state is None else state
    for rec in records:
        if projection.wants(rec.type):
            st = projection.apply(st, rec)
    return st
