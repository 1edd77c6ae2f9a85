"""Projection state is typed, and read as typed.

`runner.state("catalog")` is the catalog's `CatalogState`, a dataclass, so mypy checks every read of it anywhere in
blazar/ (tests/unit/test_static_checks.py runs it). What mypy cannot see is checked here: each `state()` overload
names its projection's own state class; each state is a dataclass of its module whose fields hold no Any; every
reader a projection module exports returns typed values (a dict of Any, or Any, would let untyped JSON out).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_overloads, get_type_hints

from blazar.events.log import EventLog
from blazar.projections import all_projections
from blazar.projections.runner import ProjectionRunner

BLAZAR = Path(__file__).resolve().parents[3] / "blazar"

# Fields of a reader's typed result that hold JSON as recorded, by design: the engine probe's output, which the
# adapters' EngineVersion and Capabilities validate (projections may not import adapters).
RECORDED_JSON = {("InstalledEngine", "version"), ("InstalledEngine", "manifest")}
# Readers whose result is a mapping of user-chosen names to recorded values, not the state's layout.
JSON_VALUED = {("blazar.projections.config", "overrides")}  # config key -> value, which blazar.config validates


def test_each_state_overload_names_its_projections_own_state_class() -> None:
    by_overload: dict[str, type] = {}
    for fn in get_overloads(ProjectionRunner.state):
        hints = get_type_hints(fn, globalns=vars(importlib.import_module(ProjectionRunner.__module__)))
        (name,) = get_args(hints["name"])
        by_overload[name] = hints["return"]
    assert by_overload == {p.name: p.state_type for p in all_projections()}


def test_each_projection_has_a_state_class_of_its_own_in_its_module() -> None:
    seen: set[type] = set()
    for p in all_projections():
        cls = p.state_type
        assert cls not in seen, p.name
        assert cls.__module__ == type(p).__module__, f"{p.name}: {cls.__name__} lives beside its projection"
        assert dataclasses.is_dataclass(cls), f"{p.name}: a state is a dataclass"
        assert not list(_untyped(cls, "state", set())), f"{p.name}: fields of Any"
        seen.add(cls)


async def test_the_runner_hands_out_each_projections_state_class_over_its_live_state(log: EventLog) -> None:
    runner = ProjectionRunner(log, all_projections())
    await runner.start()
    for p in all_projections():
        got = runner.state(p.name)
        assert type(got) is p.state_type
        assert runner.state(p.name) is got  # the state itself, not a copy per call


# -- the readers' results are typed ----------------------------------------------------------------------------------

def _readers() -> Iterator[tuple[str, str, Callable[..., Any]]]:
    """Every public module-level function of a projection module whose first parameter is that module's state."""
    for p in all_projections():
        module = importlib.import_module(type(p).__module__)
        for name, fn in vars(module).items():
            if name.startswith("_") or not inspect.isfunction(fn) or fn.__module__ != module.__name__:
                continue
            params = list(inspect.signature(fn).parameters.values())
            if params and get_type_hints(fn).get(params[0].name) is p.state_type:
                yield module.__name__, name, fn


def _untyped(tp: Any, where: str, seen: set[type]) -> Iterator[str]:
    """Where `tp` lets the state's JSON through: Any, or a dataclass field that is Any (its dataclasses walked)."""
    if tp is Any:
        yield where
        return
    origin = get_origin(tp)
    if origin is not None:
        if origin is Literal:
            return
        for i, arg in enumerate(get_args(tp)):
            if arg is not Ellipsis:
                yield from _untyped(arg, f"{where}[{i}]", seen)
        return
    if isinstance(tp, type) and dataclasses.is_dataclass(tp) and tp not in seen:
        seen.add(tp)
        hints = get_type_hints(tp)
        for f in dataclasses.fields(tp):
            if (tp.__name__, f.name) not in RECORDED_JSON:
                yield from _untyped(hints[f.name], f"{tp.__name__}.{f.name}", seen)


def test_there_are_readers_for_every_projection_with_readers() -> None:
    found = {module for module, _, _ in _readers()}
    # audit and stats have none: `blazar state` shows them whole, through the projection's view.
    assert found == {f"blazar.projections.{n}" for n in ("batches", "calibration", "catalog", "config", "engines",
                                                         "keys", "metrics", "nodes", "prefix", "profiles", "realtime",
                                                         "remotes", "residency", "sessions", "traces", "workers")}


def test_every_reader_returns_typed_values_never_the_states_json() -> None:
    leaks = []
    for module, name, fn in _readers():
        if (module, name) in JSON_VALUED:
            continue
        ret = get_type_hints(fn)["return"]
        leaks += [f"{module}.{name} -> {w}" for w in _untyped(ret, "return", set())]
    assert not leaks, "readers that hand out the state's JSON (return a dataclass instead):\n" + "\n".join(leaks)


def test_the_check_for_untyped_results_finds_what_it_should() -> None:
    @dataclasses.dataclass
    class Row:
        name: str
        extra: dict[str, Any]

    assert list(_untyped(dict[str, Any], "r", set())) == ["r[1]"]
    assert list(_untyped(list[Row] | None, "r", set())) == ["Row.extra[1]"]
    assert list(_untyped(tuple[tuple[str, ...], int], "r", set())) == []
    assert list(_untyped(Literal["a", "b"], "r", set())) == []
