"""Adaptive slots' hands in the instances package (the decision is blazar/serving/slots_governor.py's): the fit's plan
for a ready instance at another -np, its own memory counted as free; and the relaunch at that shape once its requests
in flight have ended. The relaunch is an ordinary load of the same model at the new -np (`Supervisor.ensure` with
`slots`): the old instance gives way (instance.evicted, reason `reshape`, its sessions saved to the KV bank, restored
on their next turn), and requests that arrive meanwhile wait for that load, as for any other."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

from blazar.errors import LoadFailed
from blazar.instances.live import Instance
from blazar.instances.load_decision import Refuse, Start

if TYPE_CHECKING:
    from blazar.instances.supervisor import Supervisor

DRAIN_POLL_S = 0.02  # how often a relaunch looks whether the requests in flight have ended


@dataclass(frozen=True)
class SlotsPlan:
    """The fit's answer for an instance at another -np: whether it fits without evicting anything else, what it
    plans, what the old shape had, what the budget offered; and why not."""

    fits: bool
    planned_bytes: int
    had_bytes: int
    host_free_bytes: int
    detail: str = ""


class Reshaper:
    def __init__(self, supervisor: Supervisor) -> None:
        self.supervisor = supervisor

    async def plan(self, instance_id: str, slots: int) -> SlotsPlan | None:
        """The plan for `instance_id` at `slots`; None when it is not a ready instance any more (nothing to plan)."""
        sup = self.supervisor
        lv = sup.live.get(instance_id)
        if lv is None or lv.state != "ready":
            return None
        had = lv.plan.local_bytes
        if lv.pinned:
            return SlotsPlan(False, 0, had, 0, f"{lv.instance.model} is pinned: it is never relaunched")
        decision = await sup.room.plan_slots(sup.resolve(lv.instance.model), lv, slots, sup.app.settings())
        if isinstance(decision, Start) and decision.via == "here":
            return SlotsPlan(True, decision.fit.local_bytes, had, decision.host_free_bytes)
        if isinstance(decision, Refuse):
            planned = decision.fit.local_bytes if decision.fit is not None else 0
            return SlotsPlan(False, planned, had, int(decision.observations.get("host_free_bytes") or 0),
                             decision.detail)
        return SlotsPlan(False, 0, had, 0, f"{slots} slots fit only if other instances were evicted or spread over "
                                           "RPC workers: adaptive slots does neither")

    async def relaunch(self, instance_id: str, slots: int, drain_s: float) -> Instance:
        """The instance at `slots`, once its requests in flight have ended (at most `drain_s`: LoadFailed after, the
        old shape serving on). The caller holds new requests back (Admission.reshaping) meanwhile."""
        sup = self.supervisor
        lv = sup.live.get(instance_id)
        if lv is None or lv.state != "ready":
            raise LoadFailed(f"instance {instance_id} is gone")
        for _ in range(max(1, round(drain_s / DRAIN_POLL_S))):  # NOTE: counted, not timed: bounded on any clock
            if lv.in_flight == 0:
                break
            await asyncio.sleep(DRAIN_POLL_S)
        else:
            raise LoadFailed(f"{lv.in_flight} requests still in flight on {instance_id} after {drain_s:g} s")
        inst = lv.instance
        return await sup.ensure(sup.resolve(inst.model), ctx=inst.ctx_tokens, keep_alive=lv.keep_alive_s,
                                reason="reshape", embeddings=inst.embeddings, session=lv.plan.swa_full, slots=slots)
