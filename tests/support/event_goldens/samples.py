"""A representative instance of an event class: every field filled, the optional ones too, with values derived only
from each field's name and type, so the golden payload holds every field a log may hold and stays the same from run
to run. Strings are `<field name>`, which also makes the sample's stream key readable (`trace:<trace_id>`)."""

from __future__ import annotations

import enum
import types
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel

from blazar.events.base import Event

E = TypeVar("E", bound=Event)


def sample_event(cls: type[E]) -> E:
    return cls.model_validate(sample_fields(cls))


def sample_fields(model: type[BaseModel]) -> dict[str, Any]:
    return {name: _value(field.annotation, name) for name, field in model.model_fields.items()}


def _value(tp: Any, name: str) -> Any:
    origin, args = get_origin(tp), get_args(tp)
    if origin is Literal:
        return args[0]
    if origin is Annotated:
        return _value(args[0], name)
    if origin in (Union, types.UnionType):
        # An optional field is filled: the non-None branch.
        return _value(next(a for a in args if a is not type(None)), name)
    if origin is list:
        return [_value(args[0], name)]
    if origin is dict:
        return {f"<{name} key>": _value(args[1], name)}
    if tp is Any:
        return f"<{name}>"
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return sample_fields(tp)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return next(iter(tp)).value
    if tp is bool:  # before int: bool is an int
        return True
    if tp is int:
        return 1
    if tp is float:
        return 0.5
    if tp is str:
        return f"<{name}>"
    raise TypeError(f"no sample value for field {name!r} of type {tp!r}: teach tests/support/event_goldens/samples.py")
