"""Recorded events without a log: what unit tests feed projections, readers and folds.

`rec(seq, event)` wraps an event in the envelope the log would give it when it commits it: `ts` one second per seq
after `epoch` (so events are in time order), the event's own stream key and trace id, the actor `daemon`, no cause.
A test whose assertions read the envelope says so with keyword arguments (`ts=`, `actor=`, `epoch=`), at the call or
once for its file with `functools.partial`.

`streamed_cold_queued()` is one whole request as the log records it, for the span fold and its export.
"""

from __future__ import annotations

from blazar.events import Event, Recorded
from blazar.events.requests import (
    Evicted,
    RequestAdmitted,
    RequestCompleted,
    RequestFirstToken,
    RequestQueued,
    RequestReceived,
    RequestRouted,
)

EPOCH = 1000.0
# One request's trace id, and the time it was received at (streamed_cold_queued).
TRACE = "0af7651916cd43dd8448eb211c80319c"
TRACE_TS = 1_700_000_000.0


def rec(seq: int, event: Event, *, ts: float | None = None, epoch: float = EPOCH, actor: str = "daemon",
        trace_id: str | None = None, cause: int | None = None) -> Recorded:
    """`event` as the log records it at `seq`; `ts` defaults to `epoch + seq`, `trace_id` to the event's own."""
    return Recorded(seq=seq, ts=epoch + seq if ts is None else ts, type=event.TYPE, v=event.V,
                    stream=event.stream_key(), trace_id=trace_id or getattr(event, "trace_id", None), actor=actor,
                    cause=cause, event=event)


def recs(*events: Event, epoch: float = EPOCH, actor: str = "daemon") -> list[Recorded]:
    """`events` as one log holds them from seq 1."""
    return [rec(seq, event, epoch=epoch, actor=actor) for seq, event in enumerate(events, start=1)]


def streamed_cold_queued(trace: str = TRACE, *, actor: str = "daemon:test", **received: object
                         ) -> list[Recorded]:
    """received -> routed (cold, evicting one) -> queued -> admitted -> first token -> completed."""
    return [
        rec(1, RequestReceived(trace_id=trace, dialect="openai", route="/v1/chat/completions", model="gemma",
                               stream=True, max_tokens=32, **received), ts=TRACE_TS, actor=actor),  # type: ignore[arg-type]
        rec(2, RequestRouted(trace_id=trace, model="gemma3-270m", instance_id="i2", port=40001, cold=True,
                             load_ms=800, evicted=[Evicted(model="qwen", instance_id="i1", reason="memory")]),
            ts=TRACE_TS + 1.0, actor=actor),
        rec(3, RequestQueued(trace_id=trace, model="gemma3-270m", instance_id="i2", position=1, depth=1, slots=1,
                             busy=1), ts=TRACE_TS + 1.1, actor=actor),
        rec(4, RequestAdmitted(trace_id=trace, model="gemma3-270m", instance_id="i2", waited_ms=400.0, slots=1,
                               busy=1), ts=TRACE_TS + 1.5, actor=actor),
        rec(5, RequestFirstToken(trace_id=trace, model="gemma3-270m", ttft_ms=1700.0), ts=TRACE_TS + 1.7, actor=actor),
        rec(6, RequestCompleted(trace_id=trace, model="gemma3-270m", instance_id="i2", duration_ms=2500.0,
                                prompt_tokens=12, completion_tokens=20, finish_reason="length", chunks=21,
                                engine_timings={"prompt_ms": 150.0, "predicted_ms": 700.0,
                                                "predicted_per_second": 28.5}), ts=TRACE_TS + 2.5, actor=actor),
    ]
