"""The newest events of the log that match a filter, oldest first: what the console's event log opens with before it
follows live. The log reads forward by seq, so the tail is found in widening windows below the last seq."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from blazar.events.base import Recorded
from blazar.events.log import EventLog

FIRST_WINDOW = 1000  # seqs looked at first; each further try looks at four times as many
MAX_TRIES = 8  # 1000 * 4**7 = 16M seqs: past that the rest of the log is read from seq 0 in one go


async def tail(log: EventLog, *, limit: int, types: Sequence[str] | None = None, stream: str | None = None,
               trace_id: str | None = None, before: int | None = None) -> list[Recorded]:
    """The last `limit` events matching every filter given, with a seq at most `before` (default: the last)."""
    upto = await log.last_seq() if before is None else before
    window = FIRST_WINDOW
    found: deque[Recorded] = deque(maxlen=limit)  # only the newest `limit` are ever held
    for attempt in range(MAX_TRIES):
        after = 0 if attempt == MAX_TRIES - 1 else max(0, upto - window)
        found.clear()
        async for rec in log.read(after=after, upto=upto, types=types or None, stream=stream, trace_id=trace_id):
            found.append(rec)
        if len(found) >= limit or after == 0:
            break
        window *= 4
    return list(found)
