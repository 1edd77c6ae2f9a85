"""Recorded events without a log: what unit tests feed projections, readers and folds.

`rec(seq, event)` wraps an event in the envelope the log would give it when it commits it: `ts` one second per seq
after `epoch` (so events are in time order), the event's own stream key and trace id, the actor `daemon`, no cause.
A test whose assertions read the envelope says so with keyword arguments (`ts=`, `actor=`, `epoch=`), at the call or
once for its file with `functools.partial`.
"""

from __future__ import annotations

from blazar.events import Event, Recorded

EPOCH = 1000.0


def rec(seq: int, event: Event, *, ts: float | None = None, epoch: float = EPOCH, actor: str = "daemon",
        trace_id: str | None = None, cause: int | None = None) -> Recorded:
    """`event` as the log records it at `seq`; `ts` defaults to `epoch + seq`, `trace_id` to the event's own."""
    return Recorded(seq=seq, ts=epoch + seq if ts is None else ts, type=event.TYPE, v=event.V,
                    stream=event.stream_key(), trace_id=trace_id or getattr(event, "trace_id", None), actor=actor,
                    cause=cause, event=event)


def recs(*events: Event, epoch: float = EPOCH, actor: str = "daemon") -> list[Recorded]:
    """`events` as one log holds them from seq 1."""
    return [rec(seq, event, epoch=epoch, actor=actor) for seq, event in enumerate(events, start=1)]
