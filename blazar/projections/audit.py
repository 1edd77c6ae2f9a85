"""The `audit` projection and the audit record: who did what, when, with what outcome (never content).

`audit_record` is the one definition of an audit line's content; `queries/audit.py` chains those records into a
tamper-evident JSONL export. The projection keeps counts and the most recent records' headlines (`AuditEntry`: the
same fields, made by the same functions, less the details).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from blazar.events.base import Recorded
from blazar.projections.base import Projection

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


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One of the most recent audit records, as `blazar state` shows it (its details are in the log and the export)."""

    seq: int
    ts: str  # ISO 8601, UTC
    actor: str
    action: str
    subject: str
    outcome: str


@dataclass(slots=True)
class AuditState:
    """The `audit` projection's state; `blazar state` shows it (no reader: the export reads the log itself)."""

    records: int = 0
    by_action: dict[str, int] = field(default_factory=dict)
    by_actor: dict[str, int] = field(default_factory=dict)  # as recorded (not scrubbed: the state stays local)
    by_outcome: dict[str, int] = field(default_factory=dict)
    last_seq: int = 0
    recent: list[AuditEntry] = field(default_factory=list)  # the newest RECENT, oldest first


def _inc(counts: dict[str, int], k: str) -> None:
    counts[k] = counts.get(k, 0) + 1


class AuditProjection(Projection[AuditState]):
    name = "audit"
    state_type = AuditState
    version = 2  # 2: a typed state
    types = None  # audit relevance is a property of the event class, checked in apply

    def initial(self) -> AuditState:
        return AuditState()

    def apply(self, state: AuditState, rec: Recorded) -> AuditState:
        ev = rec.event
        if not ev.AUDIT:
            return state
        entry = AuditEntry(seq=rec.seq, ts=iso(rec.ts), actor=rec.actor, action=rec.type,
                           subject=ev.audit_subject(), outcome=ev.audit_outcome())
        state.records += 1
        _inc(state.by_action, entry.action)
        _inc(state.by_actor, entry.actor)
        _inc(state.by_outcome, entry.outcome)
        state.last_seq = rec.seq
        state.recent.append(entry)
        del state.recent[:-RECENT]
        return state
