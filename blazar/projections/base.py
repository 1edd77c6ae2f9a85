"""A projection is a fold over the log: `state = apply(state, recorded)`.

Rules: `apply` is deterministic and total, reads nothing but its arguments (time comes from the envelope), and
may mutate the state it is given (the runner owns each state object; nobody else holds it). State is typed: a
dataclass per projection (`state_type`), its entries dataclasses too, written to checkpoints and read back by one
codec (blazar/projections/codec.py), so a new field is declared once and read as what it is, with no coercion.
Bump `version` whenever the state's shape or `apply`'s meaning changes: the checkpoint is then dropped (the
state goldens, tests/fixtures/projections/, fail a shape change made without it).

`runner.state("catalog")` gives the `CatalogState` itself; the catalog module's readers (`stored`, `models`, ...)
answer the questions that need more than a field.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

from blazar.events.base import Recorded
from blazar.projections.codec import codec_for

S = TypeVar("S")


@dataclass(frozen=True, slots=True)
class RefusedEvent:
    """An event a projection would not trust (blazar/confine.py): kept under its `refused`, and nothing made of it."""

    seq: int
    type: str
    paths: tuple[str, ...]  # what each untrusted path is and why

    @classmethod
    def of(cls, rec: Recorded, problems: Iterable[object]) -> RefusedEvent:
        """What a projection keeps of `rec`, refused for `problems` (confine.untrusted's, or its own words)."""
        return cls(rec.seq, rec.type, tuple(str(p) for p in problems))


class Projection(ABC, Generic[S]):
    name: ClassVar[str]
    version: ClassVar[int] = 1
    # The event types `apply` looks at; None means every event.
    types: ClassVar[frozenset[str] | None] = None
    # What lives on one machine (models, engines, calibration, saved KV slots): where several gateways share the
    # log, a runner with a node folds only that node's node-local events (and those with no node), and keeps its
    # checkpoint under its own name ("catalog@gpu-1").
    node_local: ClassVar[bool] = False
    # The state's class: a dataclass the codec reads and writes.
    state_type: ClassVar[type[Any]]

    @abstractmethod
    def initial(self) -> S: ...

    @abstractmethod
    def apply(self, state: S, rec: Recorded) -> S: ...

    def view(self, state: S) -> Any:
        """What `blazar state` shows; by default the state as JSON."""
        return codec_for(self.state_type).jsonable(state)

    def wants(self, type_name: str) -> bool:
        return self.types is None or type_name in self.types


def fold(projection: Projection[S], records: list[Recorded], state: S | None = None) -> S:
    """Apply `records` in order to `state` (or to a fresh initial state)."""
    st = projection.initial() if state is None else state
    for rec in records:
        if projection.wants(rec.type):
            st = projection.apply(st, rec)
    return st
