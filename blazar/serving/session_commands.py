"""`blazar session save|restore|rm` as the daemon carries them out: save a session's live slot to the KV bank now,
restore its newest save into a free slot (loading its model if need be), or forget it and delete its saves. Each
takes the slot from admission first, so it never races a request on the same slot."""

from __future__ import annotations

import time
from typing import Any

from blazar.context import Blazar
from blazar.errors import SessionNotFound, SessionUnavailable
from blazar.events.base import Recorded
from blazar.events.sessions import SessionRemoved, SessionRestored
from blazar.instances.kv_bank import KvBank, bank_path
from blazar.projections.sessions import SessionsState, bank_entries, session_row
from blazar.serving.gateway import Gateway
from blazar.serving.tenancy import split_session


def shown(session: str) -> str:
    """A session's name as its client gave it (its tenant is who asked)."""
    return split_session(session)[1]


def _state(app: Blazar) -> SessionsState:
    return app.runner.state("sessions")


def _unknown(app: Blazar, name: str) -> bool:
    return session_row(_state(app), name) is None and not bank_entries(_state(app), name)


async def save_session(gw: Gateway, name: str) -> list[Recorded]:
    """Save the slot that holds `name`'s newest prefix, now."""
    if gw.app.settings().sessions.session_bank_mib == 0:
        raise SessionUnavailable("the KV bank is off (session_bank_mib is 0): nothing is saved")
    where = gw.kv.slots.where(name)
    if where is None:
        if _unknown(gw.app, name):
            raise SessionNotFound(f"no session named {shown(name)!r} (blazar session list shows them)")
        raise SessionUnavailable(f"session {shown(name)} holds no live slot: the instance of its last turn has gone "
                                 "(what it saved then is in the bank: blazar session show)")
    iid, slot_id = where
    inst = next((i for i in gw.supervisor.instances() if i.instance_id == iid), None)
    if inst is None:
        raise SessionUnavailable(f"session {shown(name)}'s instance {iid} is stopping")
    ticket = gw.admission.try_acquire(inst.model, inst.slots, slot_id=slot_id)
    if ticket is None:
        raise SessionUnavailable(f"session {shown(name)}'s slot {slot_id} of {inst.model} is busy with a request; "
                                 "try again when it is done")
    try:
        return await gw.kv.save_session(inst, slot_id, name)
    finally:
        gw.admission.give_back(ticket)


async def restore_session(gw: Gateway, name: str, model: str | None = None) -> dict[str, Any]:
    """Restore `name`'s newest save (of `model`, if given) into a free slot of its model, loading it if need be."""
    entries = [e for e in bank_entries(_state(gw.app), name) if model is None or e.model == model]
    if not entries:
        if _unknown(gw.app, name):
            raise SessionNotFound(f"no session named {shown(name)!r} (blazar session list shows them)")
        raise SessionUnavailable(f"the bank holds no save of session {shown(name)}"
                                 + (f" for {model}" if model else ""))
    entry = entries[-1]
    inst = await gw.supervisor.ensure(gw.supervisor.resolve(entry.model), reason="load", session=True)
    tenant = split_session(name)[0]
    ticket = gw.admission.try_acquire(inst.model, inst.slots, pick=gw.kv.slots.picker(
        inst.instance_id, name, tenant, isolate=gw.admitter.isolating()))
    if ticket is None:
        raise SessionUnavailable(f"every slot of {inst.model} is busy; try again when one is free")
    started = time.perf_counter()
    try:
        placed = await gw.kv.place(inst, ticket.slot_id, name, tenant=tenant, runs=False)
    finally:
        gw.admission.give_back(ticket)
    if placed.kv == "cold":
        raise SessionUnavailable(f"session {shown(name)} was not restored: {placed.reason}")
    answer = {"session": shown(name), "tenant": tenant, "model": inst.model, "instance_id": inst.instance_id,
              "slot_id": ticket.slot_id, "kv": placed.kv, "tokens": placed.restored_tokens, "reason": placed.reason}
    if placed.kv == "restored":
        await gw.app.record(SessionRestored(session=name, model=inst.model, instance_id=inst.instance_id,
                                            slot_id=ticket.slot_id, tokens=placed.restored_tokens or 0,
                                            duration_ms=round((time.perf_counter() - started) * 1000, 3)))
    return answer


async def remove_session(app: Blazar, name: str, kv: KvBank | None = None) -> Recorded:
    """Forget `name`: delete its saves from the bank and, in the daemon, let no slot count as holding it."""
    await app.runner.catch_up()
    if _unknown(app, name):
        raise SessionNotFound(f"no session named {shown(name)!r} (blazar session list shows them)")
    entries = bank_entries(_state(app), name)
    # Every file proved inside the bank before any is deleted: a refusal deletes nothing and records nothing.
    files = [bank_path(app.paths.data_dir, e) for e in entries]
    for f in files:
        f.unlink(missing_ok=True)
    if kv is not None:
        kv.slots.forget_session(name)
    (rec,) = await app.record(SessionRemoved(session=name, files=[e.file for e in entries],
                                             bytes=sum(e.bytes for e in entries)))
    return rec
