"""Makes room for a load: carries out the load decisions (instances/load_decision.py) under the supervisor's capacity
lock: observes (the devices, the running instances, the idle RPC workers when the answer turns on them), asks the pure
decider, and acts on its answer: evicts the victims and decides again, records a refusal and raises it, or hands back
the plan to start. Before that, running instances of the same model that do not serve the new shape give way."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace

from blazar.adapters.engines.kinds import engine_kind
from blazar.config import Settings
from blazar.context import Blazar
from blazar.errors import VictimsBusy
from blazar.events.tuning import Posture
from blazar.fit import Device
from blazar.instances.live import Live, LiveSet, LoadReport, ResolvedModel
from blazar.instances.load_checks import record_refusal
from blazar.instances.load_decision import (
    Busy,
    Evict,
    GiveWay,
    LoadDecision,
    ProbeWorkers,
    Refuse,
    Running,
    Shape,
    Situation,
    Start,
    carried_shape,
    decide_give_way,
    decide_load,
)
from blazar.instances.stopping import Stopper
from blazar.instances.worker import idle_workers, rpc_capable
from blazar.store.engines import ActiveEngine

MiB = 1 << 20


class RoomMaker:
    """Makes room for a new instance of one model in `live`, through `stopper`, on the devices `devices` probes."""

    def __init__(self, app: Blazar, live: LiveSet, stopper: Stopper, devices: Callable[[], list[Device]]) -> None:
        self.app = app
        self.live = live
        self.stopper = stopper
        self.devices = devices

    async def reshape(self, name: str, ctx: int | None, embeddings: bool, report: LoadReport | None,
                      template: str = "", rerank: bool = False) -> tuple[int | None, bool]:
        """Ready instances of `name` give way to the new shape (decide_give_way), one by one: each is looked at as
        it is when its turn comes, since evicting the one before awaited. Returns the (ctx, embeddings) the new
        instance is started at: the request's, widened to what those that gave way served (carried_shape)."""
        gone: list[Shape] = []
        for lv in self.live.ready_of(name):
            inst = lv.instance
            shape = Shape(instance_id=inst.instance_id, ctx_tokens=inst.ctx_tokens, template=inst.template,
                          pinned=lv.pinned, in_flight=lv.in_flight, embeddings=inst.embeddings, rerank=inst.rerank)
            decision = decide_give_way(name, shape, ctx=ctx, embeddings=embeddings, template=template, rerank=rerank)
            if isinstance(decision, Refuse):
                raise await record_refusal(self.app, name, decision.reason, decision.detail, decision.error,
                                           decision.observations)
            if isinstance(decision, GiveWay):
                await self.stopper.evict(lv, "reshape", for_model=name, report=report,
                                         observations=decision.observations)
                gone.append(shape)
        return carried_shape(ctx, embeddings, gone)

    async def make_room(self, model: ResolvedModel, ctx: int | None, settings: Settings,
                        report: LoadReport | None = None, *, swa_full: bool = False,
                        engine: ActiveEngine | None = None, posture: Posture | None = None,
                        may_evict: bool = True, may_wait: bool = False, slots: int | None = None) -> Start:
        """The plan to start `model` with (at `posture` where it fits: `Start.posture` says), once its victims are
        evicted; DoesNotFit (recorded) when nothing can make room. Each decision is carried out, then decided again on
        what is true after it (at most: probe the workers, evict, probe them again). `may_evict` False: a load that
        would need victims is refused instead (a preload). `may_wait`: where only busy instances could make room,
        VictimsBusy (nothing recorded: the swap order waiting for them records it). `slots`: that -np (a reshape)."""
        seen = await self._observe(model, ctx, settings, swa_full=swa_full, engine=engine, posture=posture, slots=slots)
        seen = replace(seen, may_evict=may_evict, may_wait=may_wait)
        while True:
            decision = decide_load(seen)
            if isinstance(decision, Start):
                return decision
            if isinstance(decision, Busy):
                raise VictimsBusy(f"{model.name}: room only once {', '.join(decision.models)} "
                                  f"({', '.join(decision.victims)}) drained", victims=decision.victims,
                                  models=decision.models)
            if isinstance(decision, Refuse):
                raise await record_refusal(self.app, model.name, decision.reason, decision.detail, decision.error,
                                           decision.observations)
            if isinstance(decision, ProbeWorkers):
                # The probe awaited: the instances are looked at again (the devices are not probed again).
                offered = await idle_workers(self.app, self.live.workers_in_use())
                seen = replace(seen, workers=tuple(offered), running=self._running())
                continue
            await self._evict(decision, model.name, report)
            seen = await self._observe(model, ctx, settings, swa_full=swa_full, engine=engine, room_made=True,
                                       posture=posture, slots=slots)

    async def plan_slots(self, model: ResolvedModel, lv: Live, slots: int, settings: Settings) -> LoadDecision:
        """What a load of `lv`'s model at `slots` in its place would be decided: its context per slot kept, its own
        memory counted as free (the relaunch evicts it first). Adaptive slots grows only on a `Start` here."""
        inst = lv.instance
        seen = await self._observe(model, inst.ctx_tokens, settings, swa_full=lv.plan.swa_full, engine=None,
                                   posture=inst.posture, slots=slots)
        others = tuple(r for r in seen.running if r.candidate.instance_id != inst.instance_id)
        return decide_load(replace(seen, running=others))

    async def _evict(self, decision: Evict, name: str, report: LoadReport | None) -> None:
        # A victim that exited since it was seen is already gone: its memory is free.
        victims = [lv for v in decision.victims.victims if (lv := self.live.get(v.instance_id)) is not None]
        await asyncio.gather(*(self.stopper.evict(lv, decision.reason, for_model=name,
                                                  observations=decision.observations, report=report)
                               for lv in victims))

    async def _observe(self, model: ResolvedModel, ctx: int | None, settings: Settings, *, swa_full: bool,
                       engine: ActiveEngine | None, room_made: bool = False,
                       posture: Posture | None = None, slots: int | None = None) -> Situation:
        devices = await asyncio.to_thread(self.devices)
        return Situation(
            model=model.name, meta=model.metadata, ctx=ctx, swa_full=swa_full, default_ctx=settings.fit.ctx,
            default_slots=slots or settings.fit.slots, max_loaded_models=settings.fit.max_loaded_models,
            memory_limit_bytes=settings.fit.memory_limit_mib * MiB, devices=tuple(devices), running=self._running(),
            calibration=self.app.runner.state("calibration"),
            rpc_capable=engine is not None and rpc_capable(engine), room_made=room_made,
            projector=model.projector.metadata if model.projector is not None else None,
            lora_bytes=sum(a.metadata.tensor_bytes for a in model.loras),
            fixed_bytes=_charge(model), kind=model.kind, posture=posture)

    def _running(self) -> tuple[Running, ...]:
        return tuple(self.live.running(self.app.runner.state("residency"), self.app.clock.now()))


def _charge(model: ResolvedModel) -> int | None:
    """What a model that is no GGUF is charged: its kind's memory model over its files' bytes (None: a GGUF)."""
    memory = engine_kind(model.kind).memory
    return None if memory is None else memory.bytes_for(model.bytes)

