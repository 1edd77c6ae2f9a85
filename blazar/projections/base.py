"""A projection is a fold over the log: `state = apply(state, recorded)`.

Rules: `apply` is deterministic and total, reads nothing but its arguments (time comes from the envelope), and
may mutate the state it is given (the runner owns each state object; nobody else holds it). State is plain
JSON data (dicts, lists, str, int, float, bool, None) so checkpoints, `blazar state --json` and equality in
tests need no extra code. Bump `version` whenever `apply` changes meaning: the checkpoint is then dropped.

Outside `blazar/projections/` nobody sees that JSON: `runner.state("catalog")` gives a `CatalogState`, a typed
handle that only the catalog module's readers (`stored`, `models`, ...) look inside, and that mypy refuses to index.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from blazar.events.base import Recorded

State = dict[str, Any]


class TypedState:
    """One projection's state as the rest of Blazar holds it: an opaque handle that its module's typed readers take.

    NOTE: no `__getitem__`, on purpose: `runner.state("catalog")["models"]` is a mypy error, so code outside
    `blazar/projections/` cannot grow a dependency on the state's JSON layout. Each projection subclasses it
    (`CatalogState`), so a reader given another projection's state is a mypy error too.
    """

    __slots__ = ("_raw",)

    def __init__(self, raw: State) -> None:
        self._raw = raw

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self._raw)} keys)"


@dataclass(frozen=True, slots=True)
class RefusedEvent:
    """An event a projection would not trust (blazar/confine.py): kept under its `refused`, and nothing made of it."""

    seq: int
    type: str
    paths: tuple[str, ...]  # what each untrusted path is and why


def refused_events(raw: list[dict[str, Any]]) -> list[RefusedEvent]:
    """A projection's `refused` list (confine.refused's records), typed."""
    return [RefusedEvent(seq=int(r["seq"]), type=str(r["type"]), paths=tuple(str(p) for p in r["paths"]))
            for r in raw]


class Projection(ABC):
    name: ClassVar[str]
    version: ClassVar[int] = 1
    # The event types `apply` looks at; None means every event.
    types: ClassVar[frozenset[str] | None] = None
    # What lives on one machine (models, engines, calibration, saved KV slots): where several gateways share the
    # log, a runner with a node folds only that node's node-local events (and those with no node), and keeps its
    # checkpoint under its own name ("catalog@gpu-1").
    node_local: ClassVar[bool] = False
    # The typed handle `runner.state(name)` wraps this projection's state in (see TypedState).
    state_type: ClassVar[type[TypedState]]

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
