"""The event table of docs/3.DATA_MODEL.md, rendered from the event types: one row per event type with its version,
whether it is a control event (committed before a command is acknowledged) and audited, its stream, the first paragraph
of its class docstring and its fields (a default after `=`, a Literal's choices in brackets). The doc holds it between
two markers; `scripts/event-goldens --write` replaces what is between them and tests/unit/events/test_event_goldens.py
checks that it is current."""

from __future__ import annotations

import difflib
import enum
import inspect
import re
import types
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import orjson
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from blazar.events.base import Event
from tests.support.event_goldens.files import ROOT, SCRIPT, registered, rel
from tests.support.event_goldens.samples import sample_event

DOC = ROOT / "docs" / "3.DATA_MODEL.md"
BEGIN = ("<!-- event-types: generated from the event types by `scripts/event-goldens --write`; edit the event "
         "classes in blazar/events/, not this table -->")
END = "<!-- /event-types -->"


def table() -> str:
    rows = ["| type | v | control | audit | stream | what it records | payload |", "|---|---|---|---|---|---|---|"]
    rows += [_row(cls) for cls in registered()]
    return "\n".join(rows) + "\n"


def undocumented() -> list[str]:
    return [f"{cls.__name__} ({_module(cls)}) has no docstring: its first paragraph is its line in {rel(DOC)}"
            for cls in registered() if not cls.__dict__.get("__doc__")]


def with_table(doc: str) -> str:
    """`doc` with the text between the markers replaced by the current table."""
    start, end = doc.find(BEGIN), doc.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{rel(DOC)} lacks the markers of its event table: {BEGIN} ... {END}")
    return doc[: start + len(BEGIN)] + "\n\n" + table() + "\n" + doc[end:]


def doc_problem() -> str | None:
    current = DOC.read_text()
    wanted = with_table(current)
    if current == wanted:
        return None
    diff = "\n".join(difflib.unified_diff(current.splitlines(), wanted.splitlines(), "in the doc",
                                          "from the event types", n=0, lineterm=""))
    return f"{rel(DOC)}'s event table is not what the event types say: run `{SCRIPT}`.\n{diff}"


def write_doc() -> bool:
    current = DOC.read_text()
    wanted = with_table(current)
    if wanted != current:
        DOC.write_text(wanted)
    return wanted != current


def _row(cls: type[Event]) -> str:
    cells = [
        f"[`{cls.TYPE}`](../{_module(cls)})",
        str(cls.V),
        "yes" if cls.CONTROL else "no",
        "yes" if cls.AUDIT else "no",
        f"`{sample_event(cls).stream_key()}`",
        _summary(cls),
        ", ".join(_field(name, f) for name, f in cls.model_fields.items()),
    ]
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def _module(cls: type) -> Path:
    return Path(inspect.getfile(cls)).resolve().relative_to(ROOT)


def _summary(cls: type[Event]) -> str:
    doc = inspect.cleandoc(cls.__dict__.get("__doc__") or "")
    return re.sub(r"\s+", " ", doc.split("\n\n", 1)[0]).strip()


def _field(name: str, field: FieldInfo) -> str:
    text = f"`{name}`"
    if not field.is_required():
        default = field.get_default(call_default_factory=True)
        text = f"`{name}={orjson.dumps(default).decode()}`"
    choices, models = _kinds(field.annotation)
    if choices:
        text += " (" + " | ".join(str(c) for c in choices) + ")"
    if models:
        text += " (" + ", ".join(models) + ")"
    return text


def _kinds(tp: Any) -> tuple[list[Any], list[str]]:
    """The Literal choices and the nested models an annotation holds, wherever they are in it."""
    origin = get_origin(tp)
    if origin is Literal:
        return list(get_args(tp)), []
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [], [tp.__name__]
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return [m.value for m in tp], []
    choices: list[Any] = []
    models: list[str] = []
    if origin in (Union, types.UnionType, list, dict):
        for arg in get_args(tp):
            c, m = _kinds(arg)
            choices += c
            models += m
    return choices, models
