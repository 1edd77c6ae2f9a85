"""`blazar session list|show` and GET /api/blazar/sessions: each session with where its last turn ran (and whether
that instance still runs), how its turns found the cache, and what the KV bank holds of it."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from blazar.context import Blazar
from blazar.errors import SessionNotFound
from blazar.projections.residency import instance
from blazar.projections.sessions import BankEntry, bank_bytes, bank_entries, session_row, session_rows


def _bank(e: BankEntry) -> dict[str, Any]:
    row = asdict(e)
    row["identity"] = e.identity.model_dump()
    return row


def session_list(app: Blazar) -> dict[str, Any]:
    """Every session (most recent first), and the bank's size against its bound."""
    state = app.runner.state("sessions")
    residency = app.runner.state("residency")
    bank: dict[str, list[BankEntry]] = {}
    for e in bank_entries(state):
        bank.setdefault(e.session, []).append(e)
    rows = []
    for r in session_rows(state):
        live = r.instance_id is not None and instance(residency, r.instance_id) is not None
        saved = bank.get(r.name, [])
        rows.append({**asdict(r), "live": live, "bank_bytes": sum(e.bytes for e in saved),
                     "bank_tokens": max((e.tokens for e in saved), default=0),
                     "bank_models": [e.model for e in saved]})
    return {"sessions": rows, "bank_bytes": bank_bytes(state),
            "bank_limit_bytes": app.settings().session_bank_mib << 20}


def session_detail(app: Blazar, name: str) -> dict[str, Any]:
    state = app.runner.state("sessions")
    row = session_row(state, name)
    saved = bank_entries(state, name)
    if row is None and not saved:
        raise SessionNotFound(f"no session named {name!r} (blazar session list shows them)")
    out: dict[str, Any] = asdict(row) if row is not None else {"name": name}
    out["live"] = bool(row and row.instance_id and instance(app.runner.state("residency"), row.instance_id))
    out["bank"] = [_bank(e) for e in saved]
    return out
