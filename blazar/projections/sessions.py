"""The `sessions` projection: every session a request named (its model, the slot its last turn was placed on, how
its turns found the cache: warm, restored, cold) and the KV bank (per session and model, the saved slot's file, size,
tokens and identity). `blazar session list|show`, the restore path and the bank's bound read it.

A session's row goes when the session is removed, or when it expires: no save of it left in the bank and no turn
for `EXPIRE_S`. Expired rows are swept at the first event of each hour of the log's own time (`SWEEP_S`), and a row
its last save kept past its expiry goes when that save does: so replay, and a checkpoint plus its tail, drop exactly
what the live fold did, whatever order the rows are stored in.

A save whose file could lead out of the bank's directory (blazar/confine.py) enters no bank and no session: it is kept
under `refused`, which `blazar doctor` reports."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from blazar.confine import untrusted
from blazar.events.base import Recorded
from blazar.events.requests import RequestPlaced
from blazar.events.sessions import (
    KvIdentity,
    SessionDropped,
    SessionRemoved,
    SessionRestored,
    SessionSaved,
    SessionSaveFailed,
)
from blazar.projections.base import Projection, RefusedEvent

EXPIRE_S = 86400.0  # a session with nothing in the bank is forgotten a day after its last turn
SWEEP_S = 3600.0  # expired rows are looked for at the first event of each hour (by the events' times)


@dataclass(frozen=True, slots=True)
class BankEntry:
    """One saved slot: what `file` (relative to the data directory) holds and what it is valid for."""

    session: str
    model: str
    file: str
    bytes: int
    tokens: int
    saved_ts: float
    identity: KvIdentity
    instance_id: str
    slot_id: int
    reason: str
    seq: int = 0  # the session.saved event that made it


@dataclass(slots=True)
class SessionRow:
    """A session a request named: where its last turn was placed and how its turns found the cache. Updated in place
    by each turn."""

    name: str
    first_ts: float
    last_ts: float
    model: str | None = None
    instance_id: str | None = None  # where its last turn was placed
    slot_id: int | None = None
    turns: int = 0
    warm: int = 0
    restored: int = 0
    cold: int = 0
    last_kv: str | None = None
    last_reason: str | None = None
    restored_tokens: int = 0


@dataclass(slots=True)
class SessionsState:
    """The `sessions` projection's state: the sessions' rows and the KV bank (session -> model -> its saved slot)."""

    sessions: dict[str, SessionRow] = field(default_factory=dict)
    bank: dict[str, dict[str, BankEntry]] = field(default_factory=dict)
    bank_bytes: int = 0  # the bank's entries' bytes, together
    saves: int = 0
    save_failures: int = 0
    drops: int = 0
    refused: list[RefusedEvent] = field(default_factory=list)  # saves whose file could lead out of the bank, by seq
    swept: int | None = None  # the hour (of the log's time) of the last sweep for expired rows


class SessionsProjection(Projection[SessionsState]):
    node_local = True
    name = "sessions"
    state_type = SessionsState
    version = 4  # 2: expiry; 3: saves that could lead out refused; 4: a typed state
    types = frozenset({RequestPlaced.TYPE, SessionSaved.TYPE, SessionSaveFailed.TYPE, SessionDropped.TYPE,
                       SessionRestored.TYPE, SessionRemoved.TYPE})

    def initial(self) -> SessionsState:
        return SessionsState()

    def apply(self, state: SessionsState, rec: Recorded) -> SessionsState:
        self._apply(state, rec)
        _expire(state, rec.ts)
        return state

    def _apply(self, state: SessionsState, rec: Recorded) -> None:
        ev = rec.event
        if isinstance(ev, SessionSaved) and (problems := untrusted(ev)):
            state.refused.append(RefusedEvent.of(rec, problems))
        elif isinstance(ev, RequestPlaced):
            row = _row(state, ev.session, rec.ts)
            row.model, row.instance_id, row.slot_id, row.last_ts = ev.model, ev.instance_id, ev.slot_id, rec.ts
            row.last_kv, row.last_reason = ev.kv, ev.reason
            row.turns += 1
            if ev.kv == "warm":
                row.warm += 1
            elif ev.kv == "restored":
                row.restored += 1
            else:
                row.cold += 1
            if ev.restored_tokens:
                row.restored_tokens += ev.restored_tokens
        elif isinstance(ev, SessionSaved):
            bank = state.bank.setdefault(ev.session, {})
            old = bank.get(ev.model)
            state.bank_bytes += ev.bytes - (old.bytes if old else 0)
            bank[ev.model] = BankEntry(session=ev.session, model=ev.model, file=ev.file, bytes=ev.bytes,
                                       tokens=ev.tokens, saved_ts=rec.ts, identity=ev.identity,
                                       instance_id=ev.instance_id, slot_id=ev.slot_id, reason=ev.reason, seq=rec.seq)
            state.saves += 1
            row = _row(state, ev.session, rec.ts)
            if row.model is None:
                row.model = ev.model
        elif isinstance(ev, SessionSaveFailed):
            state.save_failures += 1
        elif isinstance(ev, SessionDropped):
            bank = state.bank.get(ev.session, {})
            gone = bank.pop(ev.model, None)
            if gone is not None:
                state.bank_bytes -= gone.bytes
                state.drops += 1
            if not bank:
                state.bank.pop(ev.session, None)
                kept = state.sessions.get(ev.session)
                if kept is not None and kept.last_ts <= rec.ts - EXPIRE_S:
                    del state.sessions[ev.session]  # its last save kept it past its expiry: it goes with it
        elif isinstance(ev, SessionRemoved):
            for entry in state.bank.pop(ev.session, {}).values():
                state.bank_bytes -= entry.bytes
            state.sessions.pop(ev.session, None)
        else:
            assert isinstance(ev, SessionRestored)
            row = _row(state, ev.session, rec.ts)
            row.model, row.instance_id, row.slot_id, row.last_ts = ev.model, ev.instance_id, ev.slot_id, rec.ts
            row.last_kv, row.last_reason = "restored", "restored by `blazar session restore`"
            row.restored_tokens += ev.tokens


def _expire(state: SessionsState, now: float) -> None:
    """Once an hour of the log's time: drop every row whose session expired (nothing in the bank, no turn for
    EXPIRE_S). Which rows go does not depend on the order they are stored in."""
    hour = int(now // SWEEP_S)
    if state.swept == hour:
        return
    state.swept = hour
    cutoff = now - EXPIRE_S
    rows = state.sessions
    for name in [n for n, row in rows.items() if row.last_ts <= cutoff and n not in state.bank]:
        del rows[name]


def _row(state: SessionsState, name: str, ts: float) -> SessionRow:
    row = state.sessions.get(name)
    if row is None:
        row = state.sessions[name] = SessionRow(name, first_ts=ts, last_ts=ts)
    return row


# -- typed readers -------------------------------------------------------------------------------------------------

def bank_entry(state: SessionsState, session: str, model: str) -> BankEntry | None:
    return state.bank.get(session, {}).get(model)


def bank_entries(state: SessionsState, session: str | None = None) -> list[BankEntry]:
    """Every bank entry (or one session's), oldest save first: the order the bank's bound drops them in."""
    out = [e for s, by_model in state.bank.items() if session is None or s == session for e in by_model.values()]
    return sorted(out, key=lambda e: (e.saved_ts, e.session, e.model))


def session_row(state: SessionsState, name: str) -> SessionRow | None:
    """Session `name`'s row (a copy: the state's own changes with each turn), or None."""
    row = state.sessions.get(name)
    return None if row is None else replace(row)


def session_rows(state: SessionsState) -> list[SessionRow]:
    """Every session, the most recently used first (copies)."""
    return sorted((replace(row) for row in state.sessions.values()), key=lambda r: -r.last_ts)


def refusals(state: SessionsState) -> list[RefusedEvent]:
    """The saves this projection would not trust (their file could lead out of the bank), by seq."""
    return list(state.refused)
