"""The golden files: one per event type and schema version, `tests/fixtures/events/<type>.v<N>.json`, holding a payload
as the log stores it (`data`) and the schema it was written under.

The current version's golden is generated (`scripts/event-goldens --write`); an older version's is whatever that
version's last golden was, kept forever: it must still decode, through its upcasters, to the current class. The
checks here return the messages a failing test (or `scripts/event-goldens`) shows.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import orjson

import blazar.events  # noqa: F401 - registers every event type
from blazar.errors import BlazarError
from blazar.events.base import Event
from blazar.events.types import decode, encode, event_class, known_types
from tests.support.event_goldens.samples import sample_event
from tests.support.event_goldens.schema import Schema, normalize, normalized_schema, schema_changes

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests" / "fixtures" / "events"
SCRIPT = "scripts/event-goldens --write"


@dataclass(frozen=True)
class Golden:
    type: str
    v: int
    payload: dict[str, Any]
    schema: Schema

    @property
    def path(self) -> Path:
        return golden_path(self.type, self.v)

    def render(self) -> bytes:
        doc = {"type": self.type, "v": self.v, "payload": self.payload, "schema": self.schema}
        return orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"


def golden_path(type_name: str, v: int) -> Path:
    return FIXTURES / f"{type_name}.v{v}.json"


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


# Blazar's own event types. NOTE: chosen by the module of the class registered when this module is first imported,
# not by name at each call: test modules register types of their own (tests/unit/events/test_log.py's `test.pinged`)
# that have no golden, and tests here stand a changed class in for a registered one (it must still be checked).
_PRODUCT_TYPES = sorted(name for name in known_types()
                        if (cls := event_class(name)) is not None and cls.__module__.startswith("blazar."))


def registered() -> list[type[Event]]:
    """The current class of each of Blazar's event types, by wire name."""
    return [cls for name in _PRODUCT_TYPES if (cls := event_class(name)) is not None]


def fresh(cls: type[Event]) -> Golden:
    """The golden the current code writes for `cls`: a representative instance, encoded as the log encodes it."""
    payload = orjson.loads(encode(sample_event(cls)))
    return Golden(cls.TYPE, cls.V, payload, normalized_schema(cls))


def load(path: Path) -> Golden:
    doc = orjson.loads(path.read_bytes())
    return Golden(doc["type"], doc["v"], doc["payload"], doc["schema"])


def recorded() -> list[Golden]:
    return [load(p) for p in sorted(FIXTURES.glob("*.json"))]


def decode_golden(golden: Golden) -> Event:
    """The golden's payload read the way the log reads a stored row: the same decode, upcasters included."""
    return decode(None, golden.type, golden.v, orjson.dumps(golden.payload))


# --- the checks -------------------------------------------------------------------------------------------------------


def missing() -> list[str]:
    """Every registered (type, version) has a golden: the current one generated, each older one kept."""
    out = []
    for cls in registered():
        for v in range(1, cls.V + 1):
            if golden_path(cls.TYPE, v).exists():
                continue
            if v == cls.V:
                out.append(f"{cls.TYPE} v{v} has no golden: run `{SCRIPT}` to write {rel(golden_path(cls.TYPE, v))}")
            else:
                out.append(f"{cls.TYPE} v{v} has no golden, and the current code cannot write one (it knows only "
                           f"v{cls.V}): every version a log may hold keeps its golden forever; restore "
                           f"{rel(golden_path(cls.TYPE, v))} from git")
    return out


def strays() -> list[str]:
    """A golden names a type and version the event types know, and its file name says the same."""
    out = []
    for path in sorted(FIXTURES.glob("*.json")):
        g = load(path)
        cls = event_class(g.type)
        if path != g.path:
            out.append(f"{rel(path)} holds {g.type} v{g.v}: its name should be {g.path.name}")
        elif cls is None:
            out.append(f"{rel(path)}: {g.type!r} is not a registered event type. Logs hold such events: an event "
                       f"type is never removed (register its class again in blazar/events/)")
        elif g.v > cls.V:
            out.append(f"{rel(path)}: {g.type} is at v{cls.V} in the code, older than this golden's v{g.v}: a version "
                       "is never taken back")
    return out


def decode_problem(golden: Golden) -> str | None:
    """The golden's payload still decodes, through the upcasters, to the current class of its type."""
    cls = event_class(golden.type)
    try:
        ev = decode_golden(golden)
    except BlazarError as exc:
        why = str(exc).removeprefix("a new event: ")
        head = (f"{golden.type} v{golden.v}: its golden payload ({rel(golden.path)}) no longer decodes with the "
                f"current code: {why}\nEvery {golden.type} v{golden.v} event already in a log would fail the same way.")
        if cls is not None and golden.v < cls.V:
            return (f"{head} The upcasters from v{golden.v} to v{cls.V} must turn it into a payload the current "
                    f"{cls.__name__} accepts: fix the one that fails, or, if the change is in v{cls.V} itself, "
                    f"{_how_to_version(cls)}")
        return f"{head} Put the schema back, or {_how_to_version(cls)}" if cls is not None else head
    if cls is not None and type(ev) is not cls:
        return f"{golden.type} v{golden.v} decoded to {type(ev).__name__}, not {cls.__name__}"
    return None


class Drift(NamedTuple):
    message: str
    compatible: bool  # may `scripts/event-goldens --write` record it without --force


def drift(cls: type[Event]) -> Drift | None:
    """The current version's schema and encoding are the ones its golden recorded, or what changed and what to do."""
    path = golden_path(cls.TYPE, cls.V)
    if not path.exists():
        return None  # missing() says so
    old = load(path)
    changes = schema_changes(normalize(old.schema), normalized_schema(cls))
    undecodable = decode_problem(old)
    head = f"{cls.TYPE} v{cls.V} ({cls.__name__}) changed without a new version; its golden is {rel(path)}."
    if changes:
        lines = "\n".join(f"  - {c.line()}" for c in changes)
        if all(c.compatible for c in changes) and undecodable is None:
            return Drift(f"{head}\n{lines}\nThese changes are compatible: a v{cls.V} payload recorded before them "
                         f"still decodes to the same facts (the golden's does). If that is what you meant, record "
                         f"them: run `{SCRIPT}`. If a field's meaning changed, not only its shape, "
                         f"{_how_to_version(cls)}", True)
        return Drift(f"{head}\n{lines}\nNot compatible: logs already hold {cls.TYPE} v{cls.V} events written under "
                     f"the old schema, and they would no longer decode (or would decode to something else). Put the "
                     f"v{cls.V} schema back, or {_how_to_version(cls)}", False)
    if undecodable is not None:
        return Drift(undecodable, False)
    again = orjson.loads(encode(decode_golden(old)))
    if again != old.payload:
        return Drift(f"{head}\nIts schema is the same, but its golden payload no longer encodes to the same JSON "
                     f"(the log stores what `encode` writes):\n  recorded: {_dumps(old.payload)}\n"
                     f"  now:      {_dumps(again)}\nIf stored events keep their meaning, run `{SCRIPT}`; if not, "
                     f"{_how_to_version(cls)}", True)
    return None


def _how_to_version(cls: type[Event]) -> str:
    t, v = cls.TYPE, cls.V
    where = Path(inspect.getfile(cls)).resolve().relative_to(ROOT)
    return (f"add a new version: set `V = {v + 1}` on {cls.__name__} ({where}) and, beside the class, register the "
            f"step from a v{v} payload to a v{v + 1} one with `@upcaster({t!r}, {v})` (blazar/events/types.py "
            f"applies upcasters on read, one version at a time; `request.routed` in blazar/events/requests.py is an "
            f"example), then run `{SCRIPT}`: it writes {t}.v{v + 1}.json and keeps {t}.v{v}.json, whose payload "
            f"must then upcast to v{v + 1}.")


def _dumps(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
