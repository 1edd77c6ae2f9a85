"""`blazar session list|show` and GET /api/blazar/sessions: each session with where its last turn ran (and whether
that instance still runs), how its turns found the cache, and what the KV bank holds of it.

Sessions live in their tenant's namespace (blazar/serving/tenancy.py): each row says its `tenant` (None: the
machine's owner) and its `name` as the client gave it; `session` is the two together. A list for one tenant shows only
its sessions and its own share of the bank."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from blazar.context import Blazar
from blazar.errors import SessionNotFound
from blazar.events.sessions import split_session
from blazar.projections.residency import instance
from blazar.projections.sessions import BankEntry, bank_entries, session_row, session_rows


def _bank(e: BankEntry) -> dict[str, Any]:
    row = asdict(e)
    row["identity"] = e.identity.model_dump()
    return row


class _Everyone:
    """The tenant filter that lets every session through (an admin's list)."""


EVERYONE = _Everyone()


def _named(session: str) -> dict[str, Any]:
    tenant, name = split_session(session)
    return {"session": session, "name": name, "tenant": tenant}


def session_list(app: Blazar, tenant: str | _Everyone | None = EVERYONE) -> dict[str, Any]:
    """Every session of `tenant` (EVERYONE: all of them), most recent first, and the bank's size against its bound
    (for one tenant, its own saves' size)."""
    state = app.runner.state("sessions")
    residency = app.runner.state("residency")

    def mine(session: str) -> bool:
        return tenant is EVERYONE or split_session(session)[0] == tenant

    bank: dict[str, list[BankEntry]] = {}
    for e in bank_entries(state):
        if mine(e.session):
            bank.setdefault(e.session, []).append(e)
    rows = []
    for r in session_rows(state):
        if not mine(r.name):
            continue
        live = r.instance_id is not None and instance(residency, r.instance_id) is not None
        saved = bank.get(r.name, [])
        rows.append({**asdict(r), **_named(r.name), "live": live, "bank_bytes": sum(e.bytes for e in saved),
                     "bank_tokens": max((e.tokens for e in saved), default=0),
                     "bank_models": [e.model for e in saved]})
    total = state.bank_bytes if tenant is EVERYONE else sum(e.bytes for saved in bank.values() for e in saved)
    return {"sessions": rows, "bank_bytes": total, "bank_limit_bytes": app.settings().sessions.session_bank_mib << 20}


def session_detail(app: Blazar, session: str) -> dict[str, Any]:
    """One session by its full name (blazar/serving/tenancy.py `qualify`)."""
    state = app.runner.state("sessions")
    row = session_row(state, session)
    saved = bank_entries(state, session)
    if row is None and not saved:
        raise SessionNotFound(f"no session named {split_session(session)[1]!r} (blazar session list shows them)")
    out: dict[str, Any] = asdict(row) if row is not None else {}
    out.update(_named(session))
    out["live"] = bool(row and row.instance_id and instance(app.runner.state("residency"), row.instance_id))
    out["bank"] = [_bank(e) for e in saved]
    return out
