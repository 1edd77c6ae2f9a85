"""The event types: wire name -> current event class, plus upcasters from older schema versions.

Decoding is where a stored row becomes a typed event. An unknown type or a payload that does not validate is
an error naming the seq; old versions are upcast one step at a time (v1 -> v2 -> ... -> current) on read and
are never rewritten in the log.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import orjson
from pydantic import ValidationError

from blazar.errors import EventTooLarge, MalformedEvent, UnknownEventType
from blazar.events import bounds
from blazar.events.base import Event

E = TypeVar("E", bound=type[Event])
Upcaster = Callable[[dict[str, Any]], dict[str, Any]]

_classes: dict[str, type[Event]] = {}
# (type, from_version) -> function producing the payload of version from_version + 1
_upcasters: dict[tuple[str, int], Upcaster] = {}


def register(cls: E) -> E:
    """Class decorator: make `cls` the current model for its wire name."""
    name = cls.TYPE
    existing = _classes.get(name)
    if existing is not None and existing is not cls:
        raise ValueError(f"event type {name!r} registered twice ({existing.__name__}, {cls.__name__})")
    _classes[name] = cls
    return cls


def upcaster(type_name: str, from_version: int) -> Callable[[Upcaster], Upcaster]:
    """Decorator: register the step that turns a `from_version` payload into `from_version + 1`."""

    def deco(fn: Upcaster) -> Upcaster:
        _upcasters[(type_name, from_version)] = fn
        return fn

    return deco


def event_class(type_name: str) -> type[Event] | None:
    return _classes.get(type_name)


def known_types() -> list[str]:
    return sorted(_classes)


def audit_types() -> list[str]:
    """Wire names of the audit-relevant event types. AUDIT is a class property, so the log filters on type."""
    return [t for t, cls in sorted(_classes.items()) if cls.AUDIT]


def decode(seq: int | None, type_name: str, v: int, data: str | bytes) -> Event:
    """Stored row -> current typed event, upcasting old versions."""
    cls = _classes.get(type_name)
    if cls is None:
        raise UnknownEventType(seq, type_name)
    try:
        if v == cls.V:
            return cls.model_validate_json(data)
        if v > cls.V:
            raise MalformedEvent(seq, type_name, f"version {v} is newer than this code knows ({cls.V})")
        payload = orjson.loads(data)
        for step in range(v, cls.V):
            fn = _upcasters.get((type_name, step))
            if fn is None:
                raise MalformedEvent(seq, type_name, f"no upcaster from version {step}")
            payload = fn(payload)
        return cls.model_validate(payload)
    except ValidationError as exc:
        raise MalformedEvent(seq, type_name, _brief(exc)) from None
    except orjson.JSONDecodeError as exc:
        raise MalformedEvent(seq, type_name, f"not JSON ({exc})") from None


# The most an event's payload may encode to (`event_max_kib` sets the log's own): an event is a fact with sizes and
# names, never a client's content; the largest legal payload of every type fits (tests/unit/events/test_event_size.py).
MAX_EVENT_BYTES = 64 << 10


def encode(event: Event, max_bytes: int = MAX_EVENT_BYTES) -> str:
    """Typed event -> the JSON text stored in the log's `data` column; EventTooLarge past `max_bytes` (or the type's
    own MAX_BYTES, where it is larger), EventFieldTooLarge for a field past its bound (blazar/events/bounds.py)."""
    cls = _classes.get(event.TYPE)
    if cls is None or type(event) is not cls:
        raise UnknownEventType(None, getattr(event, "TYPE", type(event).__name__))
    data = event.model_dump_json()
    max_bytes = max(max_bytes, cls.MAX_BYTES)
    if len(data) > max_bytes // 4 and len(data.encode()) > max_bytes:  # characters <= bytes <= 4 x characters
        raise EventTooLarge(event.TYPE, len(data.encode()), max_bytes)
    bounds.check(event, data)
    return data


def _brief(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:3]:
        loc = ".".join(str(p) for p in err["loc"]) or "(root)"
        parts.append(f"{loc}: {err['msg']}")
    more = exc.error_count() - len(parts)
    return "; ".join(parts) + (f" (+{more} more)" if more > 0 else "")
