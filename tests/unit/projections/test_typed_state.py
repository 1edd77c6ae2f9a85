"""Projection state is read through typed readers only.

`runner.state("catalog")` is a `CatalogState`: an opaque handle with no `__getitem__`, so mypy refuses
`state["models"]` anywhere in blazar/ (tests/unit/test_static_checks.py runs it). What mypy cannot see is checked here:
each `state()` overload names its projection's own state class; every reader a projection module exports returns
typed values, never the state's JSON (a dict of Any, or Any); and nothing outside blazar/projections/ reaches round
the readers, through `raw_state()` or a state's `_raw`, or subscripts what `state()` gives.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_overloads, get_type_hints

from blazar.events.log import EventLog
from blazar.projections import all_projections
from blazar.projections.base import TypedState
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
        assert cls is not TypedState and cls not in seen, p.name
        assert cls.__module__ == type(p).__module__, f"{p.name}: {cls.__name__} lives beside its projection"
        if issubclass(cls, TypedState):  # not typed yet: a handle over the JSON
            assert cls.__slots__ == (), f"{cls.__name__} adds nothing to the handle"
        else:
            assert dataclasses.is_dataclass(cls), f"{p.name}: a typed state is a dataclass"
            assert not list(_untyped(cls, "state", set())), f"{p.name}: fields of Any"
        seen.add(cls)


def test_a_typed_state_cannot_be_indexed_or_iterated_like_the_json_it_wraps() -> None:
    for name in ("__getitem__", "__iter__", "__contains__", "get", "keys", "items", "values"):
        assert not hasattr(TypedState, name), name
    assert not isinstance(TypedState({}), Mapping)


async def test_the_runner_hands_out_each_projections_state_class_over_its_live_state(log: EventLog) -> None:
    runner = ProjectionRunner(log, all_projections())
    await runner.start()
    for p in all_projections():
        got = runner.state(p.name)
        assert type(got) is p.state_type
        if isinstance(got, TypedState):
            assert got._raw is runner.raw_state(p.name)
        else:  # a typed state is handed out as it is
            assert got is runner.raw_state(p.name)
        assert runner.state(p.name) is got  # the handle is made once per state object


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
                                                         "keys", "metrics", "nodes", "profiles", "remotes", "residency",
                                                         "sessions", "traces", "workers")}


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


# -- nobody outside projections/ reaches round the readers -------------------------------------------------------------

def _outside_projections() -> Iterator[Path]:
    for path in sorted(BLAZAR.rglob("*.py")):
        if BLAZAR / "projections" not in path.parents:
            yield path


def _bypasses(tree: ast.AST) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "_raw":
            yield node.lineno, "reads a typed state's `_raw`"
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "raw_state":
            yield node.lineno, "calls `raw_state()`"
        elif (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Call)
              and isinstance(node.value.func, ast.Attribute) and node.value.func.attr == "state"):
            yield node.lineno, "subscripts what `state()` gives"


def test_nothing_outside_projections_reads_a_states_json() -> None:
    found = [f"{path.relative_to(BLAZAR.parent)}:{line}: {what}"
             for path in _outside_projections() for line, what in _bypasses(ast.parse(path.read_text()))]
    assert not found, "read projection state through its module's typed readers:\n" + "\n".join(found)


def test_the_bypass_check_finds_each_way_round_the_readers() -> None:
    code = ('a = app.runner.state("keys")["keys"]\nb = app.runner.raw_state("keys")\nc = state._raw["models"]\n'
            'd = stored(app.runner.state("catalog"), "x")\n')
    assert [line for line, _ in _bypasses(ast.parse(code))] == [1, 2, 3]

