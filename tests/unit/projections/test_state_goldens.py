"""Each projection's state is typed and its checkpoint schema frozen by a golden (tests/support/state_goldens.py)."""

from __future__ import annotations

import dataclasses

from blazar.projections import all_projections
from blazar.projections.codec import codec_for
from tests.support.state_goldens import problems


def test_every_state_golden_is_current() -> None:
    assert problems() == []


def test_every_projection_state_is_a_dataclass_the_codec_reads_and_writes() -> None:
    for p in all_projections():
        assert dataclasses.is_dataclass(p.state_type), p.name
        codec = codec_for(p.state_type)
        initial = p.initial()
        assert isinstance(initial, p.state_type) and codec.load(codec.dump(initial)) == initial, p.name
