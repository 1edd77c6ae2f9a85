"""`/ready`'s log check: is the group-commit writer getting request events into the log, or holding some in memory
that it could not write (a full disk, the log's database away)? A read of the writer's counters; nothing waits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from blazar.diskspace import explain
from blazar.errors import BlazarError
from blazar.events.writer import GroupCommitWriter


def writer_check(writer: GroupCommitWriter | None, home: Path, *, now_monotonic: float) -> dict[str, Any]:
    """ok, the events waiting (`pending`) and those the bounded buffer refused since start (`dropped`); while stalled,
    the `reason` (a stable code: disk_full, log_unavailable, log_error), a one-line `detail`, and for how long."""
    if writer is None:  # nothing submitted yet: nothing waits
        return {"ok": True, "pending": 0, "dropped": 0}
    found: dict[str, Any] = {"ok": not writer.stalled, "pending": writer.pending_count, "dropped": writer.dropped,
                             "max_pending": writer.max_pending}
    error = writer.last_error
    if not writer.stalled or error is None:
        return found
    why: BaseException = explain(error, home, writing="request events to the event log") or error
    found["reason"] = why.code if isinstance(why, BlazarError) else "log_error"
    found["detail"] = (f"{writer.pending_count} request event(s) wait in memory, not yet in the log (at most "
                       f"{writer.max_pending} are kept; later ones are dropped and counted): "
                       + (why.message if isinstance(why, BlazarError) else str(why) or type(why).__name__))
    if writer.failing_since is not None:
        found["failing_s"] = round(now_monotonic - writer.failing_since, 1)
    return found
