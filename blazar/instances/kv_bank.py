"""The KV bank: a session's slot saved to disk when its instance goes (evicted, stopped, the daemon stopping) and
restored into a slot before the session's next prompt, so a long conversation does not pay its whole prefill again.

    place(instance, slot, session)   before a request's prompt: warm (the slot still holds the session), restored
                                     (from the bank, when the identity matches), or cold (and why)
    save_instance(instance, reason)  before an instance's child is stopped: each session slot it holds, bounded in
                                     time (`session_save_timeout_s`) and size (`session_save_max_mib`)
    save_session / restore_session   the same for one session on demand (`blazar session save|restore`)

Every save, failed save and drop is a control event (blazar/events/sessions.py); the bank is bounded by
`session_bank_mib`, oldest save dropped first. Files live in the model's slot directory (`slot_dir`), named by a
hash of the session, 0600 like everything the children write.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from blazar.adapters.engines.client import EngineClient
from blazar.confine import BANK_DIR, inside
from blazar.context import Blazar
from blazar.errors import EngineError, EngineUnreachable, OutsideHome
from blazar.events.base import Event, Recorded
from blazar.events.sessions import SaveReason, SessionDropped, SessionSaved, SessionSaveFailed
from blazar.instances.live import Instance
from blazar.instances.session_slots import SessionSlots
from blazar.projections.sessions import BankEntry, bank_entries, bank_entry, session_row
from blazar.store.models import slot_dir

log = logging.getLogger("blazar.kv_bank")
MIB = 1 << 20
_SAVED_WHEN = {"evicted": "when it evicted instance", "stopped": "when `blazar stop` stopped instance",
               "shutdown": "when the daemon stopped instance", "requested": "by `blazar session save` from instance"}


def bank_path(data_dir: Path, entry: BankEntry) -> Path:
    """The file of a bank entry, proved inside the bank's directory (symlinks resolved); OutsideHome otherwise."""
    return inside(data_dir / BANK_DIR, data_dir / entry.file,
                  what=f"session.saved (seq {entry.seq}) of session {entry.session}")


def bank_file_name(session: str) -> str:
    """The file a session's slot is saved to, in its model's slot directory: a hash, so any session name is safe
    on disk and to the engine's file-name check."""
    return hashlib.sha256(session.encode()).hexdigest()[:32] + ".bin"


@dataclass(frozen=True, slots=True)
class Placement:
    """How a request found its slot: the KV state for a session (None for a request without one), why, whether
    the engine must be told the slot (`id_slot`), and whether what the slot holds is the request's tenant's own
    (else, with tenants kept apart, the engine must not reuse it: `cache_prompt` false)."""

    kv: Literal["warm", "restored", "cold"] | None
    reason: str = ""
    explicit: bool = False
    restored_tokens: int | None = None
    restore_ms: float | None = None
    own: bool = True
    sole: bool = False  # every slot of the instance was last the request's tenant's: the engine may choose

    def engine_fields(self, slot_id: int, *, isolate: bool) -> dict[str, Any]:
        """What the engine's body must say for this placement: the slot, where it matters, and no reuse of another
        tenant's prefix (llama-server reuses a slot's common prefix unless `cache_prompt` is false)."""
        fields: dict[str, Any] = {}
        if self.explicit or (isolate and not self.sole):
            fields["id_slot"] = slot_id
        if isolate and not self.own:
            fields["cache_prompt"] = False
        return fields


def _describe(diff: dict[str, tuple[Any, Any]]) -> str:
    return ", ".join(f"{k} {saved} there, {here} here" for k, (saved, here) in sorted(diff.items()))


class KvBank:
    def __init__(self, app: Blazar, client: EngineClient, slots: SessionSlots | None = None) -> None:
        self.app = app
        self.client = client
        self.slots = slots if slots is not None else SessionSlots()

    # -- the request path ---------------------------------------------------------------------------------------

    async def place(self, inst: Instance, slot_id: int, session: str | None, *, tenant: str | None = None,
                    runs: bool = True) -> Placement:
        """Record where `tenant`'s request runs; for a session, make the slot hold its prefix where the bank can.
        With `runs` False (a restore on its own, no request behind it) a slot that stays cold is not the
        session's."""
        slots, iid = self.slots, inst.instance_id
        if session is None:
            explicit, sole = slots.explicit(iid), slots.sole(iid, tenant, inst.slots)
            own = slots.place(iid, slot_id, None, tenant)
            return Placement(kv=None, explicit=explicit, own=own, sole=sole)
        if slots.owner(iid, slot_id) == session:
            slots.place(iid, slot_id, session, tenant)
            return Placement(kv="warm", reason=f"slot {slot_id} still holds the session's prefix", explicit=True)
        not_here, first = self._why_not_here(inst, session)
        entry = bank_entry(self.app.runner.state("sessions"), session, inst.model)
        if entry is None:
            placed = Placement(kv="cold", reason=not_here if first else f"{not_here}, and the bank holds no save of "
                               "it", explicit=True)
        else:
            placed = await self._restore_entry(inst, slot_id, entry)
            if placed.kv == "cold":
                placed = Placement(kv="cold", reason=f"{not_here}; {placed.reason}", explicit=True)
        if runs or placed.kv != "cold":
            own = slots.place(iid, slot_id, session, tenant)
            if placed.kv == "cold" and not own:
                placed = replace(placed, own=False)  # a cold slot still holds whoever ran there last
        return placed

    def _why_not_here(self, inst: Instance, session: str) -> tuple[str, bool]:
        """Why the session's prefix is not in this slot already, in words; and whether this is its first turn."""
        where, lost = self.slots.where(session), self.slots.lost(session)
        if where is not None and where[0] == inst.instance_id:
            return f"its slot {where[1]} is busy with another request", False
        if lost is not None and lost[0] == inst.instance_id:
            return f"slot {lost[1]} served another request since the session's last turn", False
        if session_row(self.app.runner.state("sessions"), session) is None:
            return "the session's first turn", True
        return "no live slot holds the session", False

    async def _restore_entry(self, inst: Instance, slot_id: int, entry: BankEntry) -> Placement:
        try:
            path = bank_path(self.app.paths.data_dir, entry)
        except OutsideHome as e:
            log.warning("%s", e.message)
            return Placement(kv="cold", reason=f"the bank's file is not trusted: {e.message}", explicit=True)
        if not path.is_file():
            # Deleted by hand (or never written): the entry goes, so the bank's size stays true.
            await self.app.record(SessionDropped(session=entry.session, model=entry.model, file=entry.file,
                                                 bytes=entry.bytes, reason="missing"))
            return Placement(kv="cold", reason=f"the bank's file {entry.file} is gone", explicit=True)
        refusal = self._restorable(inst, entry)
        if refusal is not None:
            return Placement(kv="cold", reason=refusal, explicit=True)
        started = time.perf_counter()
        try:
            status, data = await self.client.slot_action(
                inst.base_url, slot_id, "restore", Path(entry.file).name, api_key=inst.api_key,
                timeout_s=self.app.settings().sessions.session_save_timeout_s)
        except EngineError as e:
            return Placement(kv="cold", reason=f"the restore failed: {e.message}", explicit=True)
        ms = round((time.perf_counter() - started) * 1000, 3)
        if status != 200 or not isinstance(data, dict):
            return Placement(kv="cold", reason=f"the engine refused the restore ({status}: {_engine_words(data)})",
                             explicit=True)
        tokens = int(data.get("n_restored") or 0)
        why = _SAVED_WHEN.get(entry.reason, entry.reason)
        return Placement(kv="restored", reason=f"saved {_ago(self.app, entry.saved_ts)} {why} {entry.instance_id}",
                         explicit=True, restored_tokens=tokens, restore_ms=ms)

    def _restorable(self, inst: Instance, entry: BankEntry) -> str | None:
        """None when the entry can be restored into `inst`; else why not."""
        if inst.kv_identity is None:
            return "this engine cannot restore slots (no --slot-save-path)"
        diff = entry.identity.differences(inst.kv_identity)
        if diff:
            return "the bank's save does not match this instance: " + _describe(diff)
        return None

    # -- saving -------------------------------------------------------------------------------------------------

    async def save_instance(self, inst: Instance, reason: SaveReason) -> list[Recorded]:
        """Save every slot of `inst` that holds a session's newest prefix (before its child is stopped)."""
        owned = self.slots.owned(inst.instance_id)
        if not owned or self.app.settings().sessions.session_bank_mib == 0:
            return []
        events: list[Event] = []
        for slot_id, session in owned:
            events.append(await self._save(inst, slot_id, session, reason))
        recorded = await self.app.record(events)
        return recorded + await self.enforce_bound()

    async def save_session(self, inst: Instance, slot_id: int, session: str) -> list[Recorded]:
        """`blazar session save`: one session's slot now (the caller checked that the bank is on)."""
        recorded = await self.app.record([await self._save(inst, slot_id, session, "requested")])
        return recorded + await self.enforce_bound()

    async def _save(self, inst: Instance, slot_id: int, session: str, reason: SaveReason) -> Event:
        settings = self.app.settings()
        iid, model = inst.instance_id, inst.model

        def failed(why: Literal["timeout", "too_large", "engine_error", "no_full_window"], detail: str) -> Event:
            return SessionSaveFailed(session=session, model=model, instance_id=iid, slot_id=slot_id, reason=why,
                                     detail=detail)

        if inst.kv_identity is None:
            return failed("engine_error", "this engine cannot save slots")
        if not inst.kv_restorable:
            return failed("no_full_window", "the instance runs without a full sliding-window cache, so a restore "
                                            "would prefill everything again (sessions.session_swa_full)")
        name = bank_file_name(session)
        path = slot_dir(self.app.paths.data_dir, model) / name
        started = time.perf_counter()
        try:
            status, data = await self.client.slot_action(inst.base_url, slot_id, "save", name, api_key=inst.api_key,
                                                         timeout_s=settings.sessions.session_save_timeout_s)
        except EngineUnreachable as e:
            if isinstance(e.__cause__, TimeoutError):
                # NOTE: what the engine may have written so far is not the bank's: it would count nowhere.
                path.unlink(missing_ok=True)
                return failed("timeout", f"not saved within {settings.sessions.session_save_timeout_s:g} s")
            return failed("engine_error", e.message)
        ms = round((time.perf_counter() - started) * 1000, 3)
        if status != 200 or not isinstance(data, dict):
            return failed("engine_error", f"{status}: {_engine_words(data)}")
        size = _size(path, data)
        if size > settings.sessions.session_save_max_mib * MIB:
            path.unlink(missing_ok=True)
            return failed("too_large", f"{size / MIB:.1f} MiB is over session_save_max_mib "
                                       f"({settings.sessions.session_save_max_mib} MiB)")
        return SessionSaved(session=session, model=model, instance_id=iid, slot_id=slot_id,
                            file=str(path.relative_to(self.app.paths.data_dir)), bytes=size,
                            tokens=int(data.get("n_saved") or 0), duration_ms=ms, identity=inst.kv_identity,
                            reason=reason)

    async def enforce_bound(self) -> list[Recorded]:
        """Drop the oldest saves until the bank fits `session_bank_mib` (each drop recorded, its file removed)."""
        state = self.app.runner.state("sessions")
        cap = self.app.settings().sessions.session_bank_mib * MIB
        total = state.bank_bytes
        drops: list[Event] = []
        for entry in bank_entries(state):
            if total <= cap:
                break
            try:
                bank_path(self.app.paths.data_dir, entry).unlink(missing_ok=True)
            except OutsideHome as e:  # dropped from the bank all the same, so the bound holds; the file is left
                log.warning("%s; the entry is dropped, its file left alone", e.message)
            drops.append(SessionDropped(session=entry.session, model=entry.model, file=entry.file,
                                        bytes=entry.bytes, reason="bank_full"))
            total -= entry.bytes
        return await self.app.record(drops) if drops else []

    def forget(self, instance_id: str) -> None:
        self.slots.forget(instance_id)

    def last_session_use(self, instance_id: str) -> float | None:
        return self.slots.last_session_use(instance_id)


def _size(path: Path, data: dict[str, Any]) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return int(data.get("n_written") or 0)


def _engine_words(data: Any) -> str:
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict):
            return str(err.get("message") or err)[:200]
        if err:
            return str(err)[:200]
    return str(data)[:200]


def _ago(app: Blazar, ts: float) -> str:
    s = max(0.0, app.clock.now() - ts)
    return f"{s:.0f} s ago" if s < 120 else f"{s / 60:.0f} min ago"

