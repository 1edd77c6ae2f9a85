"""The contract suite's fixtures: every test here runs once per log backend (`BACKENDS`), on a fresh, empty log.

`new_backend` is the one parametrized fixture (`backend` is the first home it makes): a new backend is a new entry
in `tests/contract/backends.py` (and a marker of its name in pyproject.toml). Each test carries its backend's name as a
marker: `-m "not postgresql"` runs the suite on SQLite only (`scripts/test --fast`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from blazar.clock import FakeClock
from blazar.events.log import EventLog
from tests.contract.backends import BACKENDS, Backend


@pytest.fixture(params=[pytest.param(name, marks=getattr(pytest.mark, name)) for name in sorted(BACKENDS)])
def new_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[str], Backend]:
    """Makes fresh, empty backends of this run's kind, each in its own home (`label` names the home)."""

    def make(label: str) -> Backend:
        root = tmp_path / f"home-{request.param}-{label}"
        root.mkdir()
        return BACKENDS[request.param](root)

    return make


@pytest.fixture
def backend(new_backend: Callable[[str], Backend]) -> Backend:
    return new_backend("main")


@pytest.fixture
async def event_log(backend: Backend, clock: FakeClock) -> AsyncIterator[EventLog]:
    """An open log on the backend, on the fake clock (`clock`, from tests/conftest.py)."""
    lg = await backend.open(clock=clock)
    try:
        yield lg
    finally:
        await lg.close()


@pytest.fixture
async def second_log(backend: Backend, event_log: EventLog) -> AsyncIterator[EventLog]:
    """Another, independently opened log on the same backend (its own connections), on the system clock."""
    lg = await backend.open()
    try:
        yield lg
    finally:
        await lg.close()
