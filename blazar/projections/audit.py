"""The `audit` projection and the audit record: who did what, when, with what outcome (never content).

`audit_record` is the one definition of an audit line's content; the projection keeps counts and the most
recent records, and `queries/audit.py` chains the same records into a tamper-evident JSONL export.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Any

from blazar.events.base import Recorded
from blazar.projections.base import Projection, State, TypedState

RECENT = 20


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


# Actor kinds whose name part is an OS user (the CLI's, the daemon's). NOTE: `key:<name>` is kept: a key's name is
# the operator's own label for a client, and the audit trail exists to say which client did what.
USER_ACTORS = frozenset({"cli", "daemon", "user"})


def scrub_actor(actor: str) -> str:
    """`cli:alice` -> `cli:u-3bc51062973c`: a stable pseudonym in place of a user name (the same for `daemon:alice`)."""
    kind, sep, who = actor.partition(":")
    if not sep or kind not in USER_ACTORS:
        return actor
    return f"{kind}:u-{hashlib.sha256(who.encode()).hexdigest()[:12]}"


def audit_record(rec: Recorded, *, pii_scrub: bool = True) -> dict[str, Any] | None:
    """The audit line content for `rec`, or None when the event is not audit-relevant."""
    ev = rec.event
    if not ev.AUDIT:
        return None
    return {
        "seq": rec.seq,
        "ts": iso(rec.ts),
        "actor": scrub_actor(rec.actor) if pii_scrub else rec.actor,
        "action": rec.type,
        "subject": ev.audit_subject(),
        "outcome": ev.audit_outcome(),
        "trace_id": rec.trace_id,
        "details": ev.audit_details(),
    }


class AuditState(TypedState):
    """The `audit` projection's state; `blazar state` shows it (no reader: the export reads the log itself)."""

    __slots__ = ()


class AuditProjection(Projection[State]):
    name = "audit"
    state_type = AuditState
    version = 1
    types = None  # audit relevance is a property of the event class, checked in apply

    def initial(self) -> State:
        return {"records": 0, "by_action": {}, "by_actor": {}, "by_outcome": {}, "last_seq": 0, "recent": []}

    def apply(self, state: State, rec: Recorded) -> State:
        record = audit_record(rec, pii_scrub=False)
        if record is None:
            return state
        state["records"] += 1
        for key, field in (("by_action", "action"), ("by_actor", "actor"), ("by_outcome", "outcome")):
            counts = state[key]
            counts[record[field]] = counts.get(record[field], 0) + 1
        state["last_seq"] = rec.seq
        recent = state["recent"]
        recent.append({k: record[k] for k in ("seq", "ts", "actor", "action", "subject", "outcome")})
        del recent[:-RECENT]
        return state
