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

from dataclasses import dataclass
from typing import Any

from blazar.confine import refused, untrusted
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
from blazar.projections.base import Projection, RefusedEvent, State, TypedState, refused_events

EXPIRE_S = 86400.0  # a session with nothing in the bank is forgotten a day after its last turn
SWEEP_S = 3600.0  # expired rows are looked for at the first event of each hour (by the events' times)


class SessionsState(TypedState):
    """The `sessions` projection's state, read through `bank_entry`, `bank_entries`, `bank_bytes`, `session_row`,
    `session_rows` and `refused_saves`."""

    __slots__ = ()


class SessionsProjection(Projection[State]):
    node_local = True
    name = "sessions"
    state_type = SessionsState
    version = 3  # 2: expiry; 3: saves that could lead out refused
    types = frozenset({RequestPlaced.TYPE, SessionSaved.TYPE, SessionSaveFailed.TYPE, SessionDropped.TYPE,
                       SessionRestored.TYPE, SessionRemoved.TYPE})

    def initial(self) -> State:
        return {"sessions": {}, "bank": {}, "bank_bytes": 0, "saves": 0, "save_failures": 0, "drops": 0,
                "refused": [], "swept": None}

    def apply(self, state: State, rec: Recorded) -> State:
        self._apply(state, rec)
        _expire(state, rec.ts)
        return state

    def _apply(self, state: State, rec: Recorded) -> None:
        ev = rec.event
        if isinstance(ev, SessionSaved) and (problems := untrusted(ev)):
            state["refused"].append(refused(rec, problems, session=ev.session, model=ev.model))
        elif isinstance(ev, RequestPlaced):
            row = _row(state, ev.session, rec.ts)
            row.update(model=ev.model, instance_id=ev.instance_id, slot_id=ev.slot_id, last_ts=rec.ts,
                       last_kv=ev.kv, last_reason=ev.reason)
            row["turns"] += 1
            row[ev.kv] += 1
            if ev.restored_tokens:
                row["restored_tokens"] += ev.restored_tokens
        elif isinstance(ev, SessionSaved):
            bank = state["bank"].setdefault(ev.session, {})
            old = bank.get(ev.model)
            state["bank_bytes"] += ev.bytes - (old["bytes"] if old else 0)
            bank[ev.model] = {"file": ev.file, "bytes": ev.bytes, "tokens": ev.tokens, "saved_ts": rec.ts,
                              "identity": ev.identity.model_dump(), "instance_id": ev.instance_id,
                              "slot_id": ev.slot_id, "reason": ev.reason, "seq": rec.seq}
            state["saves"] += 1
            _row(state, ev.session, rec.ts).setdefault("model", ev.model)
        elif isinstance(ev, SessionSaveFailed):
            state["save_failures"] += 1
        elif isinstance(ev, SessionDropped):
            bank = state["bank"].get(ev.session, {})
            old = bank.pop(ev.model, None)
            if old is not None:
                state["bank_bytes"] -= old["bytes"]
                state["drops"] += 1
            if not bank:
                state["bank"].pop(ev.session, None)
                row = state["sessions"].get(ev.session)
                if row is not None and row["last_ts"] <= rec.ts - EXPIRE_S:
                    del state["sessions"][ev.session]  # its last save kept it past its expiry: it goes with it
        elif isinstance(ev, SessionRemoved):
            for entry in state["bank"].pop(ev.session, {}).values():
                state["bank_bytes"] -= entry["bytes"]
            state["sessions"].pop(ev.session, None)
        else:
            assert isinstance(ev, SessionRestored)
            row = _row(state, ev.session, rec.ts)
            row.update(model=ev.model, instance_id=ev.instance_id, slot_id=ev.slot_id, last_ts=rec.ts,
                       last_kv="restored", last_reason="restored by `blazar session restore`")
            row["restored_tokens"] += ev.tokens


def _expire(state: State, now: float) -> None:
    """Once an hour of the log's time: drop every row whose session expired (nothing in the bank, no turn for
    EXPIRE_S). Which rows go does not depend on the order they are stored in."""
    hour = int(now // SWEEP_S)
    if state["swept"] == hour:
        return
    state["swept"] = hour
    cutoff = now - EXPIRE_S
    rows: dict[str, dict[str, Any]] = state["sessions"]
    for name in [n for n, row in rows.items() if row["last_ts"] <= cutoff and n not in state["bank"]]:
        del rows[name]


def _row(state: State, name: str, ts: float) -> dict[str, Any]:
    rows: dict[str, dict[str, Any]] = state["sessions"]
    row = rows.get(name)
    if row is None:
        row = rows[name] = {"name": name, "model": None, "instance_id": None, "slot_id": None, "first_ts": ts,
                            "last_ts": ts, "turns": 0, "warm": 0, "restored": 0, "cold": 0, "last_kv": None,
                            "last_reason": None, "restored_tokens": 0}
    return row


# -- typed readers -------------------------------------------------------------------------------------------------

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


@dataclass(frozen=True, slots=True)
class SessionRow:
    name: str
    model: str | None
    instance_id: str | None  # where its last turn was placed
    slot_id: int | None
    first_ts: float
    last_ts: float
    turns: int
    warm: int
    restored: int
    cold: int
    last_kv: str | None
    last_reason: str | None
    restored_tokens: int


def _entry(session: str, model: str, raw: dict[str, Any]) -> BankEntry:
    return BankEntry(session=session, model=model, file=raw["file"], bytes=raw["bytes"], tokens=raw["tokens"],
                     saved_ts=raw["saved_ts"], identity=KvIdentity.model_validate(raw["identity"]),
                     instance_id=raw["instance_id"], slot_id=raw["slot_id"], reason=raw["reason"],
                     seq=int(raw.get("seq") or 0))


def bank_entry(state: SessionsState, session: str, model: str) -> BankEntry | None:
    raw = state._raw["bank"].get(session, {}).get(model)
    return _entry(session, model, raw) if raw is not None else None


def bank_entries(state: SessionsState, session: str | None = None) -> list[BankEntry]:
    """Every bank entry (or one session's), oldest save first: the order the bank's bound drops them in."""
    out = [_entry(s, m, raw) for s, by_model in state._raw["bank"].items() if session is None or s == session
           for m, raw in by_model.items()]
    return sorted(out, key=lambda e: (e.saved_ts, e.session, e.model))


def bank_bytes(state: SessionsState) -> int:
    return int(state._raw["bank_bytes"])


def session_row(state: SessionsState, name: str) -> SessionRow | None:
    raw = state._raw["sessions"].get(name)
    return SessionRow(**raw) if raw is not None else None


def session_rows(state: SessionsState) -> list[SessionRow]:
    """Every session, the most recently used first."""
    return sorted((SessionRow(**raw) for raw in state._raw["sessions"].values()), key=lambda r: -r.last_ts)


def refusals(state: SessionsState) -> list[RefusedEvent]:
    """The saves this projection would not trust (their file could lead out of the bank), by seq."""
    return refused_events(state._raw.get("refused", []))
