"""Each projection's state is typed and its checkpoint schema frozen by a golden (tests/support/state_goldens.py)."""

from __future__ import annotations

import dataclasses

from blazar.projections import all_projections
from blazar.projections.codec import codec_for
from tests.support.state_goldens import problems

# Projections whose state is still a JSON dict behind a TypedState handle, while they move to a dataclass; an entry
# that is typed now fails the test, so this set only empties.
UNTYPED: set[str] = set()


def test_every_state_golden_is_current() -> None:
    assert problems() == []


def test_every_projection_state_is_a_dataclass_the_codec_reads_and_writes() -> None:
    typed = {p.name for p in all_projections() if not codec_for(p.state_type).plain}
    assert not typed & UNTYPED, f"typed now: remove from UNTYPED: {sorted(typed & UNTYPED)}"
    for p in all_projections():
        if p.name in UNTYPED:
            continue
        assert dataclasses.is_dataclass(p.state_type), p.name
        codec = codec_for(p.state_type)
        initial = p.initial()
        assert isinstance(initial, p.state_type) and codec.load(codec.dump(initial)) == initial, p.name
    untyped = {p.name for p in all_projections() if codec_for(p.state_type).plain}
    assert untyped <= UNTYPED, f"a new projection with an untyped state: {sorted(untyped - UNTYPED)}"
