"""Event schemas frozen by golden files (tests/fixtures/events/<type>.v<N>.json, written by `scripts/event-goldens
--write`): every registered type and version has one; each still decodes, through the upcasters, the way the log
reads a stored row; the current version's schema and encoding are the ones its golden recorded, or the failure says
which event changed, how, and what to do (a new version with an upcaster, or regenerate when compatible).
docs/3.DATA_MODEL.md's event table is the one the registry renders."""

from __future__ import annotations

import enum
import shutil
from pathlib import Path
from typing import Literal

import jsonschema
import pytest
from pydantic import Field

from blazar.events import types as registry
from blazar.events.base import Event
from blazar.events.requests import RequestRerouted, RequestRouted, _RequestEvent
from tests.support.event_goldens import __main__ as goldens_script
from tests.support.event_goldens import files, table
from tests.support.event_goldens.files import (
    Golden,
    decode_golden,
    decode_problem,
    drift,
    load,
    missing,
    recorded,
    registered,
    strays,
)
from tests.support.event_goldens.table import doc_problem, undocumented

GOLDENS = recorded()


def test_every_registered_event_type_and_version_has_a_golden() -> None:
    problems = missing()
    assert not problems, "\n".join(problems)


def test_every_golden_is_of_a_registered_type_and_version() -> None:
    problems = strays()
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("golden", GOLDENS, ids=lambda g: f"{g.type}.v{g.v}")
def test_the_golden_payload_decodes_to_the_current_class(golden: Golden) -> None:
    problem = decode_problem(golden)
    if problem is not None:
        pytest.fail(problem, pytrace=False)


@pytest.mark.parametrize("golden", GOLDENS, ids=lambda g: f"{g.type}.v{g.v}")
def test_the_golden_payload_matches_the_schema_it_recorded(golden: Golden) -> None:
    # Keeps a hand-made older golden (request.routed v1: a payload as a v1 daemon wrote it) honest about its schema.
    jsonschema.Draft202012Validator(golden.schema).validate(golden.payload)


@pytest.mark.parametrize("cls", registered(), ids=lambda c: f"{c.TYPE}.v{c.V}")
def test_the_current_schema_is_the_one_its_golden_recorded(cls: type[Event]) -> None:
    d = drift(cls)
    if d is not None:
        pytest.fail(d.message, pytrace=False)


# --- the check itself fails when it should: a changed class stands in for the registered one ------------------------


def _as_registered(monkeypatch: pytest.MonkeyPatch, cls: type[Event]) -> None:
    monkeypatch.setitem(registry._classes, cls.TYPE, cls)


def test_a_renamed_field_fails_and_asks_for_a_new_version_with_an_upcaster(monkeypatch: pytest.MonkeyPatch) -> None:
    class Renamed(_RequestEvent):
        TYPE = "request.rerouted"

        model: str
        instance: str  # was instance_id
        reason: Literal["engine_gone", "context_grown", "swap_recalled"] = "engine_gone"
        detail: str = ""

    _as_registered(monkeypatch, Renamed)
    d = drift(Renamed)
    assert d is not None and not d.compatible
    assert "request.rerouted v1 (Renamed) changed without a new version" in d.message
    assert "instance_id: removed (or renamed)" in d.message and "instance: added, required" in d.message
    assert "set `V = 2` on Renamed" in d.message and "@upcaster('request.rerouted', 1)" in d.message
    assert "blazar/events/types.py" in d.message


def test_a_new_field_with_a_default_is_compatible_and_asks_to_regenerate(monkeypatch: pytest.MonkeyPatch) -> None:
    class Grown(_RequestEvent):
        TYPE = "request.rerouted"

        model: str
        instance_id: str
        reason: Literal["engine_gone", "context_grown", "swap_recalled"] = "engine_gone"
        detail: str = ""
        attempts: int = 1

    _as_registered(monkeypatch, Grown)
    d = drift(Grown)
    assert d is not None and d.compatible
    assert "attempts: added with default 1 (integer) (compatible)" in d.message
    assert "run `scripts/event-goldens --write`" in d.message


def test_a_changed_default_is_not_compatible(monkeypatch: pytest.MonkeyPatch) -> None:
    class Defaulted(_RequestEvent):
        TYPE = "request.rerouted"

        model: str
        instance_id: str
        reason: Literal["engine_gone", "context_grown", "swap_recalled"] = "engine_gone"
        detail: str = "?"

    _as_registered(monkeypatch, Defaulted)
    d = drift(Defaulted)
    assert d is not None and not d.compatible
    assert 'detail: default "" -> "?"' in d.message


def test_a_literal_may_gain_a_choice_but_not_lose_one(monkeypatch: pytest.MonkeyPatch) -> None:
    class MoreReasons(_RequestEvent):
        TYPE = "request.rerouted"

        model: str
        instance_id: str
        reason: Literal["engine_gone", "context_grown", "swap_recalled", "engine_busy"] = "engine_gone"
        detail: str = ""

    _as_registered(monkeypatch, MoreReasons)
    d = drift(MoreReasons)
    assert d is not None and d.compatible and 'reason: choices ["engine_busy"] added' in d.message


def test_a_retyped_field_inside_a_nested_model_names_its_path(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic import BaseModel, ConfigDict

    class Victim(BaseModel):
        model_config = ConfigDict(frozen=True, extra="forbid")
        model: str
        instance_id: str
        reason: int

    class Retyped(_RequestEvent):
        TYPE = RequestRouted.TYPE
        V = RequestRouted.V

        model: str
        instance_id: str
        port: int
        cold: bool
        load_ms: int | None = None
        evicted: list[Victim] = Field(default_factory=list)
        ctx_tokens: float | None = None  # widened from int | None

    _as_registered(monkeypatch, Retyped)
    d = drift(Retyped)
    assert d is not None and not d.compatible
    assert "evicted[].reason: type string -> integer (NOT compatible)" in d.message
    assert "ctx_tokens: widened: integer -> number (compatible)" in d.message
    assert "request.routed v2" in d.message and "set `V = 3`" in d.message


def test_a_docstring_a_class_name_or_the_field_order_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    class Reworded(_RequestEvent):
        """Said differently."""

        TYPE = RequestRerouted.TYPE

        detail: str = ""
        reason: Literal["engine_gone", "context_grown", "swap_recalled"] = "engine_gone"
        instance_id: str
        model: str

    _as_registered(monkeypatch, Reworded)
    assert drift(Reworded) is None


def test_every_event_class_has_a_docstring_for_its_line_in_the_data_model() -> None:
    problems = undocumented()
    assert not problems, "\n".join(problems)


def test_the_data_model_doc_lists_every_event_type_as_the_registry_says() -> None:
    problem = doc_problem()
    if problem is not None:
        pytest.fail(problem, pytrace=False)


def test_an_enum_in_place_of_a_literal_with_the_same_values_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    class Reason(enum.StrEnum):
        ENGINE_GONE = "engine_gone"
        CONTEXT_GROWN = "context_grown"
        SWAP_RECALLED = "swap_recalled"

    class Enumerated(_RequestEvent):
        TYPE = RequestRerouted.TYPE

        model: str
        instance_id: str
        reason: Reason = Reason.ENGINE_GONE
        detail: str = ""

    _as_registered(monkeypatch, Enumerated)
    assert drift(Enumerated) is None


@pytest.fixture
def scratch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> tuple[Path, Path]:
    """Copies of the goldens and the data-model doc for the script to write, in place of the real ones."""
    fixtures, doc = tmp_path / "events", tmp_path / "DATA_MODEL.md"
    shutil.copytree(files.FIXTURES, fixtures)
    shutil.copy(table.DOC, doc)
    monkeypatch.setattr(files, "FIXTURES", fixtures)
    monkeypatch.setattr(table, "DOC", doc)
    return fixtures, doc


def test_the_script_refuses_an_incompatible_change_and_records_a_compatible_one(
        monkeypatch: pytest.MonkeyPatch, scratch: tuple[Path, Path]) -> None:
    fixtures, doc = scratch
    golden = fixtures / "request.rerouted.v1.json"
    before = golden.read_bytes()

    class Renamed(_RequestEvent):
        """Renamed."""

        TYPE = RequestRerouted.TYPE

        model: str
        instance: str
        reason: Literal["engine_gone", "context_grown", "swap_recalled"] = "engine_gone"
        detail: str = ""

    _as_registered(monkeypatch, Renamed)
    assert goldens_script.main(["--write"]) == 1
    assert golden.read_bytes() == before and doc.read_bytes() == table.DOC.read_bytes()

    class Grown(_RequestEvent):
        """Grown."""

        TYPE = RequestRerouted.TYPE

        model: str
        instance_id: str
        reason: Literal["engine_gone", "context_grown", "swap_recalled"] = "engine_gone"
        detail: str = ""
        attempts: int = 1

    _as_registered(monkeypatch, Grown)
    assert goldens_script.main(["--write"]) == 0
    assert load(golden).payload["attempts"] == 1 and drift(Grown) is None
    assert "`attempts=1`" in doc.read_text() and "| Grown. |" in doc.read_text()
    assert sorted(p.name for p in fixtures.iterdir()) == sorted(p.name for p in files.FIXTURES.iterdir())


def test_a_new_version_gets_its_golden_and_the_old_one_must_upcast(monkeypatch: pytest.MonkeyPatch,
                                                                    scratch: tuple[Path, Path]) -> None:
    fixtures, _doc = scratch

    class RenamedV2(_RequestEvent):
        """The connection's words are `said` now."""

        TYPE = RequestRerouted.TYPE
        V = 2

        model: str
        instance_id: str
        reason: Literal["engine_gone", "context_grown", "swap_recalled"] = "engine_gone"
        said: str = ""

    _as_registered(monkeypatch, RenamedV2)
    assert missing() == ["request.rerouted v2 has no golden: run `scripts/event-goldens --write` to write "
                         f"{fixtures / 'request.rerouted.v2.json'}"]
    assert goldens_script.main(["--write"]) == 1  # v2 written, but the v1 golden cannot be read without an upcaster
    v1 = load(fixtures / "request.rerouted.v1.json")
    problem = decode_problem(v1)
    assert problem is not None and "no upcaster from version 1" in problem and "upcasters from v1 to v2" in problem

    def v1_to_v2(payload: dict[str, object]) -> dict[str, object]:
        rest = {k: v for k, v in payload.items() if k != "detail"}
        return {**rest, "said": payload.get("detail", "")}

    monkeypatch.setitem(registry._upcasters, (RequestRerouted.TYPE, 1), v1_to_v2)
    assert goldens_script.main([]) == 0
    assert decode_golden(v1) == RenamedV2(trace_id="<trace_id>", model="<model>", instance_id="<instance_id>",
                                          said="<detail>")
    assert load(fixtures / "request.rerouted.v2.json").payload["said"] == "<said>"
