"""The supervisor: one engine child per loaded model. The front of the instances package: callers (the gateway, the
api, the CLI) ask it for a ready instance, hold one while a request runs, stop and reset models; it holds the live
children (instances/live.py) and hands each job to one collaborator: the pure deciders decide (placement_decision,
decide), the RoomMaker makes room and chooses the plan, the Spawner starts a child, the Stopper ends one, the Reaper
evicts idle ones.

Flow of a load: resolve the model → circuit and engine checks (load_checks) → (capacity lock) the same model's other
shapes give way, the load decided and carried out (victims evicted), spawn, record `instance.started` →
(outside the lock) wait for /health → `instance.ready` and the calibration measurement; or `instance.exited` with
the reason and the log tail.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from blazar.adapters.engines import process
from blazar.adapters.gpu import probe_devices
from blazar.adapters.machine import this_machine
from blazar.context import Blazar
from blazar.durations import keep_alive_seconds
from blazar.errors import CircuitOpen, DoesNotFit, LoadFailed, ModelNotFound, ModelNotLoaded
from blazar.events.instances import InstanceKeepAliveSet
from blazar.events.tuning import Machine
from blazar.fit import Device
from blazar.instances.bank_leftovers import remove_at_start
from blazar.instances.live import Instance, Live, LiveSet, LoadReport, ResolvedModel
from blazar.instances.load_checks import RefusalReason, check_load, reset_circuit, restart_delay
from blazar.instances.posture_choice import PostureChoice
from blazar.instances.postures import Postures
from blazar.instances.reaper import Reaper
from blazar.instances.reconcile import reconcile
from blazar.instances.reshape import Reshaper
from blazar.instances.room import RoomMaker
from blazar.instances.spawn import Spawner
from blazar.instances.stopping import EvictionReason, Stopper
from blazar.instances.template_probe import probe_instance
from blazar.projections.catalog import stored
from blazar.projections.residency import ps_rows
from blazar.sentinels import UNSET
from blazar.store.chat_templates import probe_candidates
from blazar.store.engines import ActiveEngine, active_engine
from blazar.store.turn_formats import TurnFormat

if TYPE_CHECKING:
    from blazar.instances.kv_bank import KvBank

# Importable from here as they always were: the handles, the errors a caller catches, the reasons and helpers.
__all__ = [
    "UNSET",
    "CircuitOpen",
    "DoesNotFit",
    "EvictionReason",
    "Instance",
    "LoadFailed",
    "LoadReport",
    "ModelNotLoaded",
    "RefusalReason",
    "ResolvedModel",
    "Supervisor",
    "reset_circuit",
    "restart_delay",
]

log = logging.getLogger("blazar.supervisor")


class Supervisor:
    """One engine child per loaded model: what callers ask of the instances, each job handed to a collaborator."""

    def __init__(self, app: Blazar, *, devices: Callable[[], list[Device]] = probe_devices,
                 engine: Callable[[Blazar], ActiveEngine] = active_engine, kv_bank: KvBank | None = None,
                 machine: Callable[[], Machine] = this_machine) -> None:
        self.app = app
        self.postures = Postures(app, machine)  # the adopted profile's, where it applies on this machine
        self.kv_bank = kv_bank  # saves the session slots of an instance before its child is stopped
        self._engine = engine
        self.live = LiveSet()
        poke = asyncio.Event()  # wakes the idle reaper: a child came or went, or a request ended
        self.stopper = Stopper(app, self.live, kv_bank, poke)
        self.reaper = Reaper(app, self.live, kv_bank, self.stopper, poke)
        self.spawner = Spawner(app, self.live, self.stopper, poke)
        self.room = RoomMaker(app, self.live, self.stopper, devices)
        self.reshaper = Reshaper(self)  # adaptive slots: a ready instance relaunched at another -np
        self._capacity = asyncio.Lock()
        self._loading: dict[str, asyncio.Task[Instance]] = {}
        self._reaper_task: asyncio.Task[None] | None = None

    @property
    def _live(self) -> dict[str, Live]:
        """The live children by instance id (the table the collaborators share)."""
        return self.live.by_id

    # -- lifecycle of the supervisor ------------------------------------------------------------------------

    async def start(self) -> None:
        await reconcile(self.app)
        await remove_at_start(self.app)  # KV-bank saves a crash left unrecorded: no save is under way yet
        self._reaper_task = asyncio.create_task(self.reaper.run(), name="blazar-reaper")

    async def close(self) -> None:
        """Stop every child (reason `shutdown`) and the reaper."""
        self.reaper.closed = True
        if self._reaper_task is not None:
            self._reaper_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper_task
        await self.spawner.drain()
        await asyncio.gather(*(self.stopper.save_sessions(lv, "shutdown") for lv in self.live),
                             return_exceptions=True)
        await asyncio.gather(*(self.stopper.terminate(lv, "shutdown") for lv in self.live), return_exceptions=True)

    # -- queries ----------------------------------------------------------------------------------------------

    def ps(self) -> list[dict[str, Any]]:
        live = {iid: {"in_flight": lv.in_flight, "last_used": lv.last_used or None} for iid, lv in self._live.items()}
        return [r.to_json() for r in ps_rows(self.app.runner.state("residency"), now=self.app.clock.now(), live=live)]

    def instances(self, model: str | None = None) -> list[Instance]:
        return self.live.instances(model)

    def in_flight(self, model: str) -> int:
        """The requests running (held) on `model`'s instances now."""
        return sum(lv.in_flight for lv in self.live if lv.instance.model == model)

    # -- commands ---------------------------------------------------------------------------------------------

    async def load(self, model: str, *, keep_alive: Any = UNSET, pinned: bool | None = None,
                   ctx: int | None = None, session: bool = False) -> Instance:
        """Warm `model` (start it, or reuse a running instance that covers `ctx`), then apply keep_alive/pin.
        `session`: a new instance is started ready for sessions (see `ensure`)."""
        await self.app.runner.catch_up()  # a command: see what the CLI recorded a moment ago (an import, a config)
        inst = await self.ensure(self.resolve(model), ctx=ctx, keep_alive=keep_alive, pinned=pinned, reason="load",
                                 session=session)
        return inst

    async def ensure(self, model: ResolvedModel, *, ctx: int | None = None, keep_alive: Any = UNSET,
                     pinned: bool | None = None, reason: str = "request", embeddings: bool = False,
                     report: LoadReport | None = None, session: bool = False, rerank: bool = False,
                     may_wait: bool = False, slots: int | None = None) -> Instance:
        """A ready instance of `model` whose context per slot covers `ctx` (and that serves embeddings when asked;
        in rerank mode for a rerank request, never otherwise): reused, awaited, or started. `report`, when given, is
        filled with what it took (cold load, evictions). A `session` request starts a sliding-window model with its
        full window cache (session_swa_full), which restoring a saved slot needs. `may_wait`: where only busy
        instances could make room, VictimsBusy names them (the swap order waits for them), not a refusal. `slots`:
        that -np (a reshape)."""
        name = model.name
        if not model.gguf:  # a speech child has no context, embeddings or rerank mode: one shape serves every request
            ctx, embeddings, rerank = None, False, False
        started = self.app.clock.monotonic()
        while True:
            lv = self.live.ready_for(name, ctx, embeddings, model.template, rerank, slots)
            if lv is not None:
                if report is not None and report.cold is False and self.app.clock.monotonic() - started > 0.001:
                    report.cold = True  # it waited for another caller's load
                    report.load_ms = lv.instance.load_ms
                await self._apply_keep_alive(lv, keep_alive, pinned)
                lv.last_used = self.app.clock.now()
                self.reaper.wake_for(lv)
                return lv.instance
            pending = self._loading.get(name)
            if pending is None:
                break
            # One load per model at a time: wait for it (its failure is every waiter's), then look again, since it
            # may have been for a smaller context than this caller needs.
            await asyncio.shield(pending)
            model = self._probed(model)
        # NOTE: the load runs in a task of its own: a caller that goes away (a client hanging up) never leaves a
        # half-started child or an unrecorded spawn behind; the load finishes and the next caller finds it ready.
        task = asyncio.create_task(self._start(model, ctx=ctx, keep_alive=keep_alive, pinned=bool(pinned),
                                               reason=reason, embeddings=embeddings, report=report, session=session,
                                               rerank=rerank, may_wait=may_wait, slots=slots),
                                   name=f"blazar-load-{name}")
        self._loading[name] = task
        task.add_done_callback(lambda t: self._loading.pop(name, None) if self._loading.get(name) is t else None)
        task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved: callers re-raise it
        return await asyncio.shield(task)

    async def stop(self, model: str) -> list[str]:
        name = self._resolve(model)
        victims = [lv for lv in self.live if lv.instance.model == name and lv.state != "stopping"]
        if not victims:
            raise ModelNotLoaded(f"{name} is not loaded (blazar ps lists what is)")
        await asyncio.gather(*(self.stopper.save_sessions(lv, "stopped") for lv in victims))
        await asyncio.gather(*(self.stopper.terminate(lv, "stopped") for lv in victims))
        return [lv.instance.instance_id for lv in victims]

    async def reset(self, model: str) -> bool:
        return await reset_circuit(self.app, self._resolve(model))

    @contextlib.asynccontextmanager
    async def lease(self, instance: Instance) -> AsyncIterator[Instance]:
        """Count one request in flight on `instance` (never evicted while any is), and mark the use at the end."""
        lv = self.live.get(instance.instance_id)
        if lv is None:
            raise LoadFailed(f"instance {instance.instance_id} of {instance.model} is gone")
        lv.in_flight += 1
        try:
            yield instance
        finally:
            lv.in_flight -= 1
            lv.last_used = self.app.clock.now()
            self.reaper.wake_for(lv)

    # -- the load path ----------------------------------------------------------------------------------------

    def resolve(self, model: str) -> ResolvedModel:
        """The store's model `model` names (exact, `name` for `name:latest`, or an alias); ModelNotFound names the
        fix. Once per request: the record goes down to the argv."""
        got = stored(self.app.runner.state("catalog"), model)
        if got is None:
            raise ModelNotFound(f"no model named {model!r} in the store (blazar list shows them; blazar pull adds one)")
        return ResolvedModel(name=got.name, path=self.app.paths.models / got.file,
                             metadata=got.metadata.model_copy(update={"name": got.name}), settings=got.settings,
                             sha256=got.sha256, projector=got.projector, kind=got.kind, bytes=got.bytes,
                             loras=got.loras,
                             template_probe=got.template_probe.chosen if got.template_probe is not None else None)

    def _probed(self, model: ResolvedModel) -> ResolvedModel:
        """`model` with its file's template probe, when one was recorded since it was resolved (by the load it
        waited for): the instance that load started runs the template the probe chose."""
        if model.template_probe is not None or not model.gguf:
            return model
        got = stored(self.app.runner.state("catalog"), model.name)
        if got is None or got.template_probe is None or got.sha256 != model.sha256:
            return model
        return replace(model, template_probe=got.template_probe.chosen)

    def _resolve(self, model: str) -> str:
        """The store's name for `model`, or `model` itself (stop and reset act on names that may be gone)."""
        got = stored(self.app.runner.state("catalog"), model)
        return got.name if got is not None else model

    def hold(self, instance: Instance) -> None:
        """One more request in flight on `instance` (never evicted while any is); `unhold` ends it."""
        lv = self.live.get(instance.instance_id)
        if lv is None:
            raise LoadFailed(f"instance {instance.instance_id} of {instance.model} is gone")
        lv.in_flight += 1

    def unhold(self, instance: Instance) -> None:
        lv = self.live.get(instance.instance_id)
        if lv is not None and lv.in_flight > 0:
            lv.in_flight -= 1
            lv.last_used = self.app.clock.now()
            self.reaper.wake_for(lv)

    async def gone(self, instance: Instance) -> bool:
        """Asked when `instance`'s port refused or dropped a request before any answer: True when its child is gone
        (its exit recorded, or it is being stopped) or on its way out (then nothing more is routed to it, and this
        waits, at most KILL_WAIT_S, for the watcher to record the exit); False while it runs, when the failure is the
        engine's own answer to that request."""
        lv = self.live.get(instance.instance_id)
        if lv is None or lv.state == "stopping":
            await self.stopper.recorded(instance.instance_id, process.KILL_WAIT_S)  # its exit may be in writing
            return True
        if lv.proc.returncode is None and not process.pid_dying(lv.proc.pid):
            return False
        if lv.state == "ready":
            lv.state = "exiting"  # a SIGKILLed child's port closes before it can be reaped: route nothing more to it
        if lv.watcher is not None:
            await asyncio.wait([lv.watcher], timeout=process.KILL_WAIT_S)  # never cancels the watcher
        return True

    async def _start(self, model: ResolvedModel, *, ctx: int | None, keep_alive: Any, pinned: bool, reason: str,
                     embeddings: bool = False, report: LoadReport | None = None, session: bool = False,
                     rerank: bool = False, may_wait: bool = False,
                     slots: int | None = None) -> Instance:
        """Check, make room, record the intent, spawn, await ready: each step its collaborator's. The instances of
        the model that give way hand their shape on (RoomMaker.reshape): the new one serves what they served."""
        engine = await check_load(self.app, self._engine, model.name, model.kind)
        settings = self.app.settings()
        keep = keep_alive_seconds(settings.engine.keep_alive) if keep_alive is UNSET else keep_alive
        swa_full = session and settings.sessions.session_swa_full and bool(model.metadata.sliding_window)
        choice = self.postures.for_load(model.name, engine)
        async with self._capacity:
            ctx, embeddings = await self.room.reshape(model.name, ctx, embeddings, report, model.template, rerank)
            start = await self.room.make_room(model, ctx, settings, report, swa_full=swa_full, engine=engine,
                                              posture=choice.posture, may_evict=reason != "preload",
                                              may_wait=may_wait, slots=slots)
            if choice.posture is not None and start.posture is None:
                log.warning("%s: the posture of profile.adopted seq %s does not fit now; loading at the defaults",
                            model.name, choice.profile_seq)
                choice = PostureChoice()
            candidates = self._probe_candidates(model, engine, rerank)
            if candidates:  # started with the first candidate: the probe keeps it unless another ends turns better
                model = replace(model, template_probe=candidates[0].name)
            lv = await self.spawner.launch(model, engine, start.fit, free_observed=start.host_free_bytes,
                                           keep_alive_s=keep, pinned=pinned, reason=reason, embeddings=embeddings,
                                           rerank=rerank, posture=choice)
        if not candidates:
            return await self.spawner.await_ready(lv, report)
        await self.spawner.await_healthy(lv)
        chosen = await probe_instance(self.app, lv.instance, model, candidates)
        if chosen is None:  # nothing recorded: it serves as a model with no probe yet would be served
            lv.instance.template = replace(model, template_probe=None).template
            lv.instance.sampling = {}  # the probe's sampling goes with a template the probe chose
        elif chosen != candidates[0].name:
            await self.stopper.terminate(lv, "template_probed", detail=f"its template probe chose {chosen}")
            model = replace(model, template_probe=chosen)
            async with self._capacity:
                lv = await self.spawner.launch(model, engine, start.fit, free_observed=start.host_free_bytes,
                                               keep_alive_s=keep, pinned=pinned, reason=reason,
                                               embeddings=embeddings, rerank=rerank, posture=choice)
            return await self.spawner.await_ready(lv, report)
        return await self.spawner.mark_ready(lv, report)

    def _probe_candidates(self, model: ResolvedModel, engine: ActiveEngine | None, rerank: bool) -> list[TurnFormat]:
        """The templates to probe on this load: none once the file was probed, for a rerank instance, or on an
        engine that takes no template file (it keeps its own fallback)."""
        if (not model.gguf or rerank or model.template_probe is not None or engine is None
                or not engine.caps.has("--chat-template-file")):
            return []
        return probe_candidates(model.metadata, model.settings)

    async def _apply_keep_alive(self, lv: Live, keep_alive: Any, pinned: bool | None) -> None:
        keep = lv.keep_alive_s if keep_alive is UNSET else keep_alive
        pin = lv.pinned if pinned is None else pinned
        if keep == lv.keep_alive_s and pin == lv.pinned:
            return
        lv.keep_alive_s, lv.pinned = keep, pin
        await self.app.record(InstanceKeepAliveSet(instance_id=lv.instance.instance_id, model=lv.instance.model,
                                                    keep_alive_s=keep, pinned=pin))

    async def drain(self) -> None:
        """Wait for the background work started so far (memory measurements after loads)."""
        await self.spawner.drain()

    async def reap_once(self) -> float | None:
        """Evict instances whose keep-alive has run out; returns seconds until the next one is due (None: none)."""
        return await self.reaper.reap_once()

    async def _watch(self, lv: Live) -> None:
        """Wait for the child to exit and record it (the Stopper's watcher; tests start one for a child of theirs)."""
        await self.stopper.watch(lv)
