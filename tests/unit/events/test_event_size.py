"""No event larger than the log takes: every field of every event type is bounded (blazar/events/bounds.py), each
type's largest legal payload (every field filled to its bound) is written, and one byte past a field's bound is
refused naming that field, where the event is appended."""

from __future__ import annotations

import types
from typing import Annotated, Any, Union, get_args, get_origin

import orjson
import pytest
from pydantic import ValidationError

from blazar.errors import EventFieldTooLarge, EventTooLarge
from blazar.events import bounds
from blazar.events import types as registry
from blazar.events.base import Event
from blazar.events.requests import RequestFailed
from tests.support.event_goldens.files import registered
from tests.support.event_goldens.samples import sample_fields

TYPES = registered()


def _filled(annotation: Any, limit: int, sample: Any) -> Any:
    """A value of `annotation` whose JSON text comes as near `limit` bytes as its shape allows."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return _filled(args[0], limit, sample)
    if origin in (Union, types.UnionType):
        return _filled(next(a for a in args if a is not type(None)), limit, sample)
    if annotation is str or annotation is Any:
        return "\x00" * ((limit - 2) // 6)  # six bytes a character in JSON: the most a character can take
    if origin is list:
        item = _filled(args[0], bounds.TEXT_CHARS * 6, sample[0]) if args[0] is str else sample[0]
        return _packed([item], limit)
    if origin is dict:
        value = next(iter(sample.values()))
        return _packed({}, limit, value)
    return sample  # a number, a flag, a literal, a nested model: its sample is its shape


def _packed(start: list[Any] | dict[str, Any], limit: int, value: Any = None) -> Any:
    """Items (a list's first, repeated; or `value` under new keys) added while the JSON text stays within `limit`."""
    out: Any = [] if isinstance(start, list) else {}
    item = start[0] if isinstance(start, list) else value
    step = len(orjson.dumps(item)) + 1 + (0 if isinstance(out, list) else 13)  # a comma; a key "k000000000":
    for i in range(max(0, (limit - 1) // step)):
        if isinstance(out, list):
            out.append(item)
        else:
            out[f"k{i:09d}"] = value
    return out


def largest(cls: type[Event]) -> Event:
    """`cls` with every field as large as its bound allows (a field whose own constraints refuse the filling keeps
    its sample: those constraints bound it tighter)."""
    fields = sample_fields(cls)
    for name, limit in bounds.field_bounds(cls).items():
        assert limit is not None
        info = cls.model_fields[name]
        candidate = {**fields, name: _filled(info.annotation, limit, fields[name])}
        try:
            cls.model_validate(candidate)
        except ValidationError:
            continue
        fields = candidate
    return cls.model_validate(fields)


@pytest.mark.parametrize("cls", TYPES, ids=[c.TYPE for c in TYPES])
def test_every_field_of_every_event_type_is_bounded(cls: type[Event]) -> None:
    unbounded = [name for name, b in bounds.field_bounds(cls).items() if b is None]
    assert unbounded == [], f"{cls.TYPE}: give {unbounded} a Bound (blazar/events/bounds.py)"


@pytest.mark.parametrize("cls", TYPES, ids=[c.TYPE for c in TYPES])
def test_the_largest_legal_payload_of_every_event_type_is_written(cls: type[Event]) -> None:
    fields = bounds.field_bounds(cls)
    most = 2 + sum(len(orjson.dumps(n)) + 1 + (b or 0) + 1 for n, b in fields.items())  # keys, colons, commas
    assert most <= max(registry.MAX_EVENT_BYTES, cls.MAX_BYTES), f"{cls.TYPE}: its bounds add up to {most} bytes"
    event = largest(cls)
    data = registry.encode(event)  # neither bound refuses it
    assert len(data.encode()) <= most


@pytest.mark.parametrize("cls", TYPES, ids=[c.TYPE for c in TYPES])
def test_a_field_one_byte_past_its_bound_is_refused_naming_it(cls: type[Event]) -> None:
    for name, limit in bounds.field_bounds(cls).items():
        info = cls.model_fields[name]
        if not _plain_str(info.annotation) or any(isinstance(m, bounds.Bound) for m in info.metadata):
            continue
        assert limit is not None
        over = cls.model_validate(sample_fields(cls)).model_copy(update={name: "x" * (limit - 1)})  # limit + 1 bytes
        with pytest.raises(EventFieldTooLarge) as refused:
            registry.encode(over)
        assert refused.value.field == name and refused.value.size == limit + 1


def _plain_str(annotation: Any) -> bool:
    origin, args = get_origin(annotation), get_args(annotation)
    if origin in (Union, types.UnionType):
        return any(_plain_str(a) for a in args if a is not type(None))
    return annotation is str


def test_free_text_the_gateway_writes_is_clipped_not_refused() -> None:
    failed = RequestFailed(trace_id="t", model="m", status=502, reason="engine_error", detail="y\x00" * 50_000)
    assert len(failed.detail) == bounds.TEXT_CHARS + 1 and failed.detail.endswith("…") and "\x00" not in failed.detail
    registry.encode(failed)


def test_a_stored_event_is_read_whatever_a_newer_bound_says() -> None:
    # The bounds are checked where an event is appended, never where it is read: an old log keeps reading.
    stored = orjson.dumps({**sample_fields(RequestFailed), "model": "m" * 5000}).decode()
    assert registry.decode(1, RequestFailed.TYPE, RequestFailed.V, stored).model == "m" * 5000


def test_every_bound_is_below_what_the_log_takes_whole() -> None:
    assert issubclass(EventFieldTooLarge, EventTooLarge)
    for cls in TYPES:
        assert max(b or 0 for b in bounds.field_bounds(cls).values()) < max(registry.MAX_EVENT_BYTES, cls.MAX_BYTES)




def test_a_small_event_is_not_measured_field_by_field(monkeypatch: pytest.MonkeyPatch) -> None:
    # The hot path: a request event under its smallest variable field's bound is written without a second dump.
    dumped: list[str] = []
    original = RequestFailed.model_dump

    def counting(self: Any, **kw: Any) -> Any:
        dumped.append(self.TYPE)
        return original(self, **kw)

    monkeypatch.setattr(RequestFailed, "model_dump", counting)
    registry.encode(RequestFailed(trace_id="t", model="m", status=502, reason="engine_error", detail="gone"))
    assert dumped == []
    with pytest.raises(EventFieldTooLarge):
        registry.encode(RequestFailed(trace_id="t", model="m" * 2000, status=502, reason="engine_error"))
    assert dumped == [RequestFailed.TYPE]


def test_lists_the_gateway_writes_keep_their_bounded_part() -> None:
    from blazar.events.instances import InstanceExited
    from blazar.events.requests import Evicted, RequestRouted

    routed = RequestRouted(trace_id="t", model="m", instance_id="i", port=1, cold=False, evicted=[
        Evicted(model=f"m{i}", instance_id=f"i{i}", reason="memory") for i in range(20)])
    assert [e.instance_id for e in routed.evicted] == [f"i{i}" for i in range(16)]  # the first, in order
    exited = InstanceExited(instance_id="i", model="m", reason="crashed", log_tail=[f"line {i}" for i in range(30)])
    assert exited.log_tail == [f"line {i}" for i in range(10, 30)]  # a log's tail: its last lines
