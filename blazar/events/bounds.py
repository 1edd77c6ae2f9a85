"""How big each field of an event may be, so that no event is larger than the log takes.

Every field of every event type has a bound on its JSON text, in bytes: a plain `str` is a name (NAME: 256
characters of a request's or a command's name, no control characters); a number, a flag or a literal is bounded by
its type; every other field (a list, a dict, a nested model, free text, a path) says its own with `Bound` in its
annotation. The sum of one type's bounds is its largest legal payload, and every type's fits in MAX_EVENT_BYTES
(tests/unit/events/test_event_size.py feeds each type that payload). `check` runs where an event is encoded for the
log, so a value that reaches an event unbounded is refused at the code that built it, naming the field; a stored
event is never checked again on reading (an old log may hold what a newer bound refuses).

Free text the gateway writes itself (an error's detail, a log line) is clipped where the event is made (`Clip`,
`ClipLines`): a long message loses its tail, never the event."""

from __future__ import annotations

import functools
import types
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union, get_args, get_origin

import orjson
from pydantic import BaseModel, GetCoreSchemaHandler
from pydantic_core import CoreSchema, core_schema

from blazar.errors import EventFieldTooLarge

if TYPE_CHECKING:
    from blazar.events.base import Event

# A character's most bytes in JSON text: 6 for a string from outside (a control character is written \u0000, and the
# edge does not refuse them in every field: a voice, a label), 4 (UTF-8) in the free text the gateway writes, which
# has them replaced (`Clip`).
_NAME_BYTES_PER_CHAR = 6
_BYTES_PER_CHAR = 4


@dataclass(frozen=True, slots=True)
class Bound:
    """The most bytes a field's JSON text may take."""

    json: int


def name_chars(n: int) -> Bound:
    """A string from outside (a name, an id, a label) of at most `n` characters, whatever characters they are."""
    return Bound(n * _NAME_BYTES_PER_CHAR + 2)


def items(count: int, each: Bound | int) -> Bound:
    """A list of at most `count` items, each at most `each`."""
    return Bound(2 + count * ((each.json if isinstance(each, Bound) else each) + 1))


def entries(count: int, key: Bound, value: Bound | int) -> Bound:
    """An object of at most `count` entries."""
    return Bound(2 + count * (key.json + 1 + (value.json if isinstance(value, Bound) else value) + 1))


NAME_CHARS = 256  # blazar/api/bounds.py MAX_NAME_CHARS: the longest name a request or a command may use
NAME = name_chars(NAME_CHARS)
ID = name_chars(64)  # an id the gateway made (a trace, an instance, a batch, a file): ASCII, far shorter
SHA256 = Bound(66)  # a digest in hex
WORD = Bound(66)  # a word the gateway chooses from its own set (a code, a format, a media type): ASCII
TEXT_CHARS = 1024  # the most of a detail, a reason or an error message an event keeps
LINE_CHARS = 512  # the most of one log line an event keeps
PATH = Bound(4096 + 2)  # a path in the home (PATH_MAX bytes; a home whose paths are longer is refused on writing)
SETTING = Bound(8 << 10)  # a setting's value (config.changed): a number, a word, a short list
OBSERVATIONS = Bound(16 << 10)  # what a decision saw (free and needed bytes, the candidates and their scores)
URL = name_chars(1024)
MODEL_PATTERNS = items(32, Bound(256 + 2))  # a key's scope: at most 32 ASCII patterns (blazar/operations/keys.py)
REMOTE_MODELS_MAX = 32  # the models one remote serves (blazar/cluster/remotes.py)
# A model's settings (`model.configured`, `model.variant_created`) in JSON bytes; blazar/store/model_settings.py
# refuses more, so the whole event fits in the log's bound.
TEMPLATE_BYTES = 24 << 10
SYSTEM_BYTES = 16 << 10
PARAMETERS_BYTES = 6 << 10
MAX_LAYERS = 512  # a GGUF's blocks (the largest models have under 200): per-layer lists in model.imported
_INT_BYTES = 20  # -9223372036854775808
_FLOAT_BYTES = 24  # orjson's longest float
_CONTROL = {c: "\ufffd" for c in range(32) if chr(c) not in "\n\t"} | {127: "\ufffd"}


def _clipped(value: Any, limit: int) -> Any:
    if not isinstance(value, str):
        return value
    value = value.translate(_CONTROL)
    return value[:limit] + "\u2026" if len(value) > limit else value


@dataclass(frozen=True, slots=True)
class Clip:
    """Free text the gateway writes (a detail, a reason, an error message): clipped to `chars` characters where the
    event is made, control characters but newline and tab replaced (and so when read: harmless for text)."""

    chars: int

    @property
    def json(self) -> int:
        return (self.chars + 1) * _BYTES_PER_CHAR + 2

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.no_info_before_validator_function(lambda v: _clipped(v, self.chars), handler(source))


@dataclass(frozen=True, slots=True)
class ClipLines:
    """Lines the gateway writes: the last `count` (a log's tail: its last lines say how it ended) or the first (what
    a count beside them says in full), each clipped as `Clip(chars)` is."""

    count: int
    chars: int = LINE_CHARS
    keep: Literal["last", "first"] = "last"

    @property
    def json(self) -> int:
        return items(self.count, Clip(self.chars).json).json

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        def clip(value: Any) -> Any:
            if not isinstance(value, list):
                return value
            kept = value[-self.count:] if self.keep == "last" else value[:self.count]
            return [_clipped(v, self.chars) for v in kept]
        return core_schema.no_info_before_validator_function(clip, handler(source))


@dataclass(frozen=True, slots=True)
class First:
    """A list the gateway writes whose first `count` items an event keeps, each at most `each` (the events that
    record each item in full are elsewhere: `request.routed`'s evictions are each an `instance.evicted`)."""

    count: int
    each: Bound

    @property
    def json(self) -> int:
        return items(self.count, self.each).json

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.no_info_before_validator_function(
            lambda v: v[:self.count] if isinstance(v, list) else v, handler(source))


Text = Annotated[str, Clip(TEXT_CHARS)]


def bound_of(annotation: Any, metadata: list[Any] | tuple[Any, ...] = ()) -> int | None:
    """The bound of a field of type `annotation` (with its Field metadata) in JSON bytes; None: it has none."""
    for item in metadata:
        if isinstance(item, Bound | Clip | ClipLines | First):
            return item.json
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return bound_of(args[0], args[1:])
    if origin in (Union, types.UnionType):
        bounds = [4 if a is type(None) else bound_of(a) for a in args]  # null
        return None if any(b is None for b in bounds) else max(b for b in bounds if b is not None)
    if origin is Literal:
        return max(len(orjson.dumps(a)) for a in args)
    if annotation is bool:
        return 5
    if annotation is int:
        return _INT_BYTES
    if annotation is float:
        return _FLOAT_BYTES
    if annotation is str:
        return NAME.json
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):  # a nested model: its fields' sum
        inner = field_bounds(annotation)
        if any(b is None for b in inner.values()):
            return None
        return 2 + sum(len(orjson.dumps(n)) + 2 + (b or 0) for n, b in inner.items())
    if isinstance(annotation, type) and hasattr(annotation, "__members__"):
        return max(len(orjson.dumps(m.value)) for m in annotation.__members__.values())  # an enum
    return None


@functools.cache
def field_bounds(cls: type[BaseModel]) -> dict[str, int | None]:
    """Each field's bound (None: unbounded, which tests/unit/events/test_event_size.py refuses)."""
    return {name: bound_of(f.annotation, f.metadata) for name, f in cls.model_fields.items()}


def _fixed(annotation: Any) -> bool:
    """True for a type whose values cannot outgrow its bound: a number, a flag, a literal, an enum (or None)."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return _fixed(args[0])
    if origin in (Union, types.UnionType):
        return all(_fixed(a) for a in args)
    return origin is Literal or annotation in (bool, int, float, type(None)) or (
        isinstance(annotation, type) and not issubclass(annotation, BaseModel) and hasattr(annotation, "__members__"))


@functools.cache
def _checked(cls: type[BaseModel]) -> tuple[int, tuple[tuple[str, int], ...]]:
    """The fields to measure (those whose size varies), and the smallest payload that could hold one over its
    bound: below it there is nothing to measure, which is every request event's common case."""
    fields = tuple((name, b) for name, b in field_bounds(cls).items()
                   if b is not None and not _fixed(cls.model_fields[name].annotation))
    return min((b for _, b in fields), default=1 << 62), fields


def check(event: Event, data: str) -> None:
    """Refuse `event` (its JSON text `data`) when a field is over its bound, naming the field."""
    smallest, fields = _checked(type(event))
    if len(data) <= smallest // 4 or len(data.encode()) <= smallest:
        return  # no field can be over a bound in a payload this small (a character is at most 4 bytes)
    payload = event.model_dump(mode="json")
    for name, limit in fields:
        size = len(orjson.dumps(payload.get(name)))
        if size > limit:
            raise EventFieldTooLarge(event.TYPE, name, size, limit)
