"""Checkpoint storage: a projection's state as of a seq, in its own table, with a hash and an anchor.

The anchor (`type@ts` of the event at that seq) ties a checkpoint to one history: after a restore, or on a
log that is not the one the checkpoint was made from, the anchor no longer matches and the projection rebuilds.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from blazar.events.log import EventLog


def text_sha256(text: str | bytes) -> str:
    """A checkpoint's hash: of the bytes its codec wrote (blazar/projections/codec.py)."""
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


@dataclass(frozen=True, slots=True)
class StoredCheckpoint:
    name: str
    version: int
    seq: int
    anchor: str
    state_text: str
    sha256: str


def anchor_of(type_name: str | None, ts: float | None) -> str:
    return "" if type_name is None else f"{type_name}@{ts!r}"


async def load_checkpoints(log: EventLog) -> dict[str, StoredCheckpoint]:
    rows = await log.checkpoints.rows()
    return {r[0]: StoredCheckpoint(r[0], r[1], r[2], r[3], r[4], r[5]) for r in rows}


async def anchor_at(log: EventLog, seq: int) -> str | None:
    """The anchor of the event at `seq`; '' for seq 0; None when the log has no such event."""
    if seq == 0:
        return ""
    got = await log.event_anchor(seq)
    return None if got is None else anchor_of(got[0], got[1])


async def save_checkpoints(log: EventLog, items: list[tuple[str, int, int, str, bytes]]) -> None:
    """Write (name, version, seq, anchor, state's bytes) rows, replacing older checkpoints, in one transaction."""
    rows = []
    now = log.clock.now()
    for name, version, seq, anchor, text in items:
        rows.append((name, version, seq, anchor, text.decode(), text_sha256(text), now))
    await log.checkpoints.put(rows)


async def drop_checkpoints(log: EventLog) -> None:
    await log.checkpoints.clear()
