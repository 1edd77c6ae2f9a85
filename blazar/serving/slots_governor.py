"""The adaptive slots governor: off the request path, one background task looks at every local instance's queue in
admission every `fit.adaptive_tick_s` (while `fit.adaptive_slots` is on). The rule (slots_rule.py) grows an instance
whose queue stays full and shrinks one that grew once its queue stays empty. A reshape, in order:

    plan the new -np with the fit (Reshaper.plan) ─ does not fit: instance.reshape_refused, the shape stays
    instance.reshape_planned (the looks' numbers, the plan's bytes) ─ recorded before anything is done
    hold the model's lane (Admission.reshaping): no slot is given, newcomers queue (none refused)
    wait for the requests in flight to end (never cut; at most fit.adaptive_drain_s, else refused `busy`)
    relaunch at the new -np (Reshaper.relaunch: the old instance evicted, reason `reshape`, its sessions banked)
    open the lane at the new -np: the waiters go on (each routed again to the new instance: routing.py's reroute)
    instance.reshaped (the new instance, the requests released, how long they were held)

One reshape per model at a time, and only where the model has one local instance (admission counts a model's
requests in one lane), not in rerank mode, and with no slots pinned by its adopted posture.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any, Literal

from blazar.context import Blazar
from blazar.errors import BlazarError
from blazar.events.reshapes import InstanceReshaped, InstanceReshapePlanned, InstanceReshapeRefused
from blazar.instances.live import Instance
from blazar.serving.admission import Admission
from blazar.serving.ports import SupervisorPort
from blazar.serving.slots_rule import Reshape, SlotsLook, SlotsRule, SlotsState, decide_slots

log = logging.getLogger("blazar.slots")

IDLE_TICK_S = 1.0  # how often a governor that is switched off (fit.adaptive_slots false) looks again
DRAIN_POLL_S = 0.02  # how often a reshape looks whether the model's slots have all been given back


@dataclass
class _Watch:
    """One instance: the rule's state, and whether a grow of it was refused (not asked again: its shape stays)."""

    state: SlotsState = field(default_factory=SlotsState)
    grow_refused: bool = False


def rule_of(app: Blazar) -> SlotsRule:
    f = app.settings().fit
    return SlotsRule(max_slots=f.adaptive_slots_max, grow_after=f.adaptive_grow_after,
                     shrink_after=f.adaptive_shrink_after)


class SlotsGovernor:
    def __init__(self, app: Blazar, supervisor: SupervisorPort, admission: Admission) -> None:
        self.app = app
        self.supervisor = supervisor
        self.admission = admission
        self._watches: dict[str, _Watch] = {}  # by instance id
        self._base: dict[str, int] = {}  # by instance id: the slots of the shape it was first loaded at
        self.reshaping: dict[str, asyncio.Task[None]] = {}  # by model: the reshape under way

    async def run(self) -> None:
        try:
            while True:
                fit = self.app.settings().fit
                if not fit.adaptive_slots:
                    self._watches.clear()
                    await asyncio.sleep(IDLE_TICK_S)
                    continue
                await asyncio.sleep(fit.adaptive_tick_s)
                try:
                    self.tick(rule_of(self.app))
                except Exception:  # NOTE: the governor must outlive any one bad look; the next tick tries again
                    log.exception("adaptive slots tick failed")
        finally:
            for task in list(self.reshaping.values()):
                task.cancel()

    def tick(self, rule: SlotsRule) -> None:
        """One look at every local instance's lane; a reshape started (as a task of its own) where the rule says."""
        by_model: dict[str, list[Instance]] = {}
        for inst in self.supervisor.instances():
            if not inst.remote and inst.kind == "llama-server":
                by_model.setdefault(inst.model, []).append(inst)
        present = {i.instance_id for insts in by_model.values() for i in insts}
        for gone in set(self._watches) - present:
            del self._watches[gone]
        for gone in set(self._base) - present:
            del self._base[gone]
        lanes = self.admission.snapshot()
        for model, insts in by_model.items():
            inst = insts[0]
            lane = lanes.get(inst.lane)
            if (model in self.reshaping or len(insts) != 1 or lane is None or inst.rerank
                    or (inst.posture is not None and inst.posture.slots is not None)):
                continue
            watch = self._watches.setdefault(inst.instance_id, _Watch())
            look = SlotsLook(slots=inst.slots, busy=int(lane["busy"]), queued=int(lane["queued"]))
            base = self._base.setdefault(inst.instance_id, inst.slots)
            watch.state, reshape = decide_slots(watch.state, look, rule, base)
            if reshape is None or (reshape.direction == "grow" and watch.grow_refused):
                continue
            task = asyncio.create_task(self.reshape(inst, reshape, look), name=f"blazar-reshape-{model}")
            self.reshaping[model] = task
            task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        for model, t in list(self.reshaping.items()):
            if t is task:
                del self.reshaping[model]
        if not task.cancelled() and task.exception() is not None:
            log.error("adaptive slots: a reshape failed", exc_info=task.exception())

    async def reshape(self, inst: Instance, r: Reshape, look: SlotsLook) -> None:
        """Plan, record, hold, drain, relaunch, release, record (the module's docstring)."""
        reshaper = self.supervisor.reshaper
        plan = await reshaper.plan(inst.instance_id, r.to_slots)
        if plan is None:
            return  # it is on its way out already
        facts: dict[str, Any] = dict(instance_id=inst.instance_id, model=inst.model, direction=r.direction,
                                     from_slots=r.from_slots, to_slots=r.to_slots)
        if not plan.fits:
            self._watches.setdefault(inst.instance_id, _Watch()).grow_refused |= r.direction == "grow"
            await self.app.record(InstanceReshapeRefused(
                **facts, reason="does_not_fit", detail=plan.detail,
                observations={"planned_bytes": plan.planned_bytes, "had_bytes": plan.had_bytes,
                              "host_free_bytes": plan.host_free_bytes, "queued": look.queued, "busy": look.busy}))
            return
        (planned,) = await self.app.record(InstanceReshapePlanned(
            **facts, ctx_tokens=inst.ctx_tokens, looks=r.looks, queued=look.queued, busy=look.busy,
            peak_demand=r.peak_demand, planned_bytes=plan.planned_bytes, had_bytes=plan.had_bytes,
            host_free_bytes=plan.host_free_bytes))
        drain_s = self.app.settings().fit.adaptive_drain_s
        held_at = self.app.clock.monotonic()
        self.admission.reshaping(inst.lane, slots=None)
        new: Instance | None = None
        refusal: tuple[Literal["busy", "failed"], str] | None = None
        try:
            if not await self._drained(inst.lane, drain_s):
                refusal = ("busy", f"the requests in flight did not end within {drain_s:g} s")
            else:
                new = await reshaper.relaunch(inst.instance_id, r.to_slots, drain_s)
                self._base[new.instance_id] = self._base.get(inst.instance_id, r.from_slots)
        except BlazarError as e:
            refusal = ("failed", e.message)
        finally:
            released = self.admission.depth(inst.lane)
            self.admission.reshaping(inst.lane, slots=new.slots if new is not None else inst.slots)
        held_ms = round((self.app.clock.monotonic() - held_at) * 1000)
        if new is None:
            reason, detail = refusal or ("failed", "no instance")
            await self.app.record(InstanceReshapeRefused(
                **facts, reason=reason, detail=detail, observations={"held_ms": held_ms, "released": released}),
                cause=planned.seq)
            return
        await self.app.record(InstanceReshaped(
            instance_id=inst.instance_id, model=inst.model, new_instance_id=new.instance_id, from_slots=r.from_slots,
            to_slots=new.slots, released=released, held_ms=held_ms), cause=planned.seq)

    async def _drained(self, lane: str, drain_s: float) -> bool:
        """Whether every slot of `lane` was given back within `drain_s` (counted in polls: bounded on any clock)."""
        for _ in range(max(1, round(drain_s / DRAIN_POLL_S))):
            if int(self.admission.snapshot().get(lane, {}).get("busy", 0)) == 0:
                return True
            await asyncio.sleep(DRAIN_POLL_S)
        return False

