"""The supervisor: one engine child per loaded model. It decides (through the pure deciders in instances/decide.py)
what to load, where it fits and what to evict, records each decision and outcome as a control event, and watches
the children it started until they exit.

Flow of a load: resolve the model → circuit and engine checks → (capacity lock) budget, plan, evict victims,
spawn, record `instance.started` → (outside the lock) wait for /health → `instance.ready` and the calibration
measurement; or `instance.exited` with the reason and the log tail.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from blazar.adapters.engines import process
from blazar.adapters.engines.llama_server import build_argv, engine_key, redact_argv
from blazar.adapters.gpu import probe_devices
from blazar.confine import inside
from blazar.context import Blazar
from blazar.durations import keep_alive_seconds
from blazar.errors import (
    BlazarError,
    CircuitOpen,
    DoesNotFit,
    EngineError,
    EngineIncompatible,
    EngineVerifyFailed,
    LoadFailed,
    ModelNotFound,
    ModelNotLoaded,
    ModelPinned,
    OutsideHome,
)
from blazar.events.instances import (
    ExitReason,
    InstanceEvicted,
    InstanceExited,
    InstanceKeepAliveSet,
    InstanceLoadRefused,
    InstanceReady,
    InstanceStarted,
    InstanceStarting,
    ModelCircuitOpened,
    ModelCircuitReset,
)
from blazar.events.model_settings import ModelSettings
from blazar.events.models import ModelMetadata
from blazar.events.requests import Evicted
from blazar.events.sessions import KvIdentity, SaveReason
from blazar.fit import Device, FitPlan, FitRequest
from blazar.fit.planner import MIN_AUTO_CTX
from blazar.instances import decide
from blazar.instances.bank_leftovers import remove_at_start
from blazar.instances.calibration import record_measurement
from blazar.instances.placement import (
    Resident,
    budget_devices,
    shortfall_bytes,
    try_plan,
    worker_bytes_needed,
    worker_devices,
)
from blazar.instances.worker import idle_workers, rpc_capable
from blazar.projections.calibration import correction_for
from blazar.projections.catalog import stored
from blazar.projections.residency import circuit, instance, ps_rows, recent_crashes
from blazar.sentinels import UNSET
from blazar.store.engine_verify import verify_for_spawn
from blazar.store.engines import ActiveEngine, active_engine
from blazar.store.model_settings import template_flags, template_key
from blazar.store.models import slot_dir

if TYPE_CHECKING:
    from blazar.instances.kv_bank import KvBank

log = logging.getLogger("blazar.supervisor")

RefusalReason = Literal["does_not_fit", "circuit_open", "no_engine", "no_room", "engine_incompatible",
                        "engine_unverified", "untrusted_path"]
EvictionReason = Literal["idle", "max_loaded_models", "memory", "reshape"]

LOG_TAIL_LINES = 20
# Restart backoff after a crash: 0.5 s doubling per crash in the window, at most this.
BACKOFF_MAX_S = 10.0
# The reaper also wakes this often when nothing is due, to notice settings changes.
REAPER_MAX_SLEEP_S = 30.0


@dataclass
class Instance:
    """A live handle to one running child."""

    instance_id: str
    model: str
    port: int
    slots: int
    ctx_tokens: int
    engine_tag: str
    load_ms: int | None = None
    embeddings: bool = False  # started with the engine's embeddings endpoint on
    # The child's own secret (llama-server's --api-key-file): in memory and in a 0600 file, never in an event.
    api_key: str | None = field(default=None, repr=False)
    served_as: str = ""  # what the engine writes in an answer's `model` (its --alias, else its file's path)
    template: str = ""  # the model's chat template it was started with (`template_key`): "" for the GGUF's own
    # What a slot saved from this instance is valid for (None: the engine cannot save slots), and whether a restore
    # would help (a sliding-window model needs its full window cache for that: session_swa_full).
    kv_identity: KvIdentity | None = None
    kv_restorable: bool = False
    url: str = ""  # a remote engine's API root; "" for a child of ours (loopback, `port`)
    # Sent with every request to a remote: a forwarded request's hop and trace (another node's gateway).
    headers: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def base_url(self) -> str:
        return self.url or f"http://127.0.0.1:{self.port}"

    @property
    def remote(self) -> bool:
        return bool(self.url)

    @property
    def lane(self) -> str:
        """Where admission counts its requests: a child's model (its slots), a remote's or another node's own
        concurrency (for every model it serves)."""
        return self.instance_id if self.url else self.model


@dataclass(frozen=True)
class ResolvedModel:
    """The store's model a request named, resolved once: its name, its file and its GGUF summary, as far as the argv."""

    name: str
    path: Path
    metadata: ModelMetadata
    settings: ModelSettings | None = None  # its template (on the argv), system prompt and default parameters
    sha256: str = ""  # the file's, as recorded: part of a saved slot's identity

    @property
    def template(self) -> str:
        return template_key(self.settings)


@dataclass
class Route:
    """What `ensure` did for one caller: whether it waited for a load, how long that took, what made room."""

    cold: bool = False
    load_ms: int | None = None
    evicted: list[Evicted] = field(default_factory=list)


@dataclass
class _Live:
    instance: Instance
    proc: asyncio.subprocess.Process
    plan: FitPlan
    log_path: Path
    started_seq: int
    started_mono: float
    keep_alive_s: float | None
    pinned: bool
    state: str = "starting"  # starting | ready | exiting (its process is on its way out) | stopping
    in_flight: int = 0
    last_used: float = 0.0
    exit_recorded: bool = False
    ready: asyncio.Future[Instance] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    watcher: asyncio.Task[None] | None = None

    def charged_bytes(self, measured: int | None) -> int:
        return max(self.plan.local_bytes, measured or 0)


def restart_delay(crash_ts: list[float], now: float, *, window_s: float) -> float:
    """Seconds to wait before starting a model that crashed: 0.5 s doubling per crash in the window, from the
    last crash, at most BACKOFF_MAX_S."""
    recent = [t for t in crash_ts if now - t <= window_s]
    if not recent:
        return 0.0
    delay = min(BACKOFF_MAX_S, 0.5 * 2 ** (len(recent) - 1))
    return max(0.0, delay - (now - recent[-1]))


class Supervisor:
    def __init__(self, app: Blazar, *, devices: Callable[[], list[Device]] = probe_devices,
                 engine: Callable[[Blazar], ActiveEngine] = active_engine, kv_bank: KvBank | None = None) -> None:
        self.app = app
        self.kv_bank = kv_bank  # saves the session slots of an instance before its child is stopped
        self._devices = devices
        self._engine = engine
        self._live: dict[str, _Live] = {}
        self._capacity = asyncio.Lock()
        self._loading: dict[str, asyncio.Task[Instance]] = {}
        self._poke = asyncio.Event()
        self._reaper_due: float | None = None  # the loop time the idle reaper next wakes at (None: it is awake)
        self._reaper: asyncio.Task[None] | None = None
        self._closed = False
        self._tasks: set[asyncio.Task[Any]] = set()

    # -- lifecycle of the supervisor ------------------------------------------------------------------------

    async def start(self) -> None:
        from blazar.instances.reconcile import reconcile  # reconcile imports this module's helpers

        await reconcile(self.app)
        await remove_at_start(self.app)  # KV-bank saves a crash left unrecorded: no save is under way yet
        self._reaper = asyncio.create_task(self._reap_loop(), name="blazar-reaper")

    async def close(self) -> None:
        """Stop every child (reason `shutdown`) and the reaper."""
        self._closed = True
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*(self._save_sessions(lv, "shutdown") for lv in list(self._live.values())),
                             return_exceptions=True)
        await asyncio.gather(*(self._terminate(lv, "shutdown") for lv in list(self._live.values())),
                             return_exceptions=True)

    # -- queries ----------------------------------------------------------------------------------------------

    def ps(self) -> list[dict[str, Any]]:
        live = {iid: {"in_flight": lv.in_flight, "last_used": lv.last_used or None} for iid, lv in self._live.items()}
        return [r.to_json() for r in ps_rows(self.app.runner.state("residency"), now=self.app.clock.now(), live=live)]

    def instances(self, model: str | None = None) -> list[Instance]:
        return [lv.instance for lv in self._live.values() if model is None or lv.instance.model == model]

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
                     route: Route | None = None, session: bool = False) -> Instance:
        """A ready instance of `model` whose context per slot covers `ctx` (and that serves embeddings when asked):
        reused, awaited, or started. `route`, when given, is filled with what it took (cold load, evictions). A
        `session` request starts a sliding-window model with its full window cache (session_swa_full), which
        restoring a saved slot needs."""
        name = model.name
        started = self.app.clock.monotonic()
        while True:
            lv = self._ready_for(name, ctx, embeddings, model.template)
            if lv is not None:
                if route is not None and route.cold is False and self.app.clock.monotonic() - started > 0.001:
                    route.cold = True  # it waited for another caller's load
                    route.load_ms = lv.instance.load_ms
                await self._apply_keep_alive(lv, keep_alive, pinned)
                lv.last_used = self.app.clock.now()
                self._wake_reaper_for(lv)
                return lv.instance
            pending = self._loading.get(name)
            if pending is None:
                break
            # One load per model at a time: wait for it (its failure is every waiter's), then look again, since it
            # may have been for a smaller context than this caller needs.
            await asyncio.shield(pending)
        # NOTE: the load runs in a task of its own: a caller that goes away (a client hanging up) never leaves a
        # half-started child or an unrecorded spawn behind; the load finishes and the next caller finds it ready.
        task = asyncio.create_task(self._start(model, ctx=ctx, keep_alive=keep_alive, pinned=bool(pinned),
                                               reason=reason, embeddings=embeddings, route=route, session=session),
                                   name=f"blazar-load-{name}")
        self._loading[name] = task
        task.add_done_callback(lambda t: self._loading.pop(name, None) if self._loading.get(name) is t else None)
        task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved: callers re-raise it
        return await asyncio.shield(task)

    async def stop(self, model: str) -> list[str]:
        name = self._resolve(model)
        victims = [lv for lv in self._live.values() if lv.instance.model == name and lv.state != "stopping"]
        if not victims:
            raise ModelNotLoaded(f"{name} is not loaded (blazar ps lists what is)")
        await asyncio.gather(*(self._save_sessions(lv, "stopped") for lv in victims))
        await asyncio.gather(*(self._terminate(lv, "stopped") for lv in victims))
        return [lv.instance.instance_id for lv in victims]

    async def reset(self, model: str) -> bool:
        return await reset_circuit(self.app, self._resolve(model))

    @contextlib.asynccontextmanager
    async def lease(self, instance: Instance) -> AsyncIterator[Instance]:
        """Count one request in flight on `instance` (never evicted while any is), and mark the use at the end."""
        lv = self._live.get(instance.instance_id)
        if lv is None:
            raise LoadFailed(f"instance {instance.instance_id} of {instance.model} is gone")
        lv.in_flight += 1
        try:
            yield instance
        finally:
            lv.in_flight -= 1
            lv.last_used = self.app.clock.now()
            self._wake_reaper_for(lv)

    # -- the load path ----------------------------------------------------------------------------------------

    def resolve(self, model: str) -> ResolvedModel:
        """The store's model `model` names (exact, `name` for `name:latest`, or an alias); ModelNotFound names the
        fix. Once per request: the record goes down to the argv."""
        got = stored(self.app.runner.state("catalog"), model)
        if got is None:
            raise ModelNotFound(f"no model named {model!r} in the store (blazar list shows them; blazar pull adds one)")
        return ResolvedModel(name=got.name, path=self.app.paths.models / got.file,
                             metadata=got.metadata.model_copy(update={"name": got.name}), settings=got.settings,
                             sha256=got.sha256)

    def _resolve(self, model: str) -> str:
        """The store's name for `model`, or `model` itself (stop and reset act on names that may be gone)."""
        got = stored(self.app.runner.state("catalog"), model)
        return got.name if got is not None else model

    def _ready_for(self, name: str, ctx: int | None, embeddings: bool = False, template: str = "") -> _Live | None:
        """A ready instance that serves this request as the model is set now: one started with another template
        (the model's was changed since) is never reused."""
        for lv in self._live.values():
            inst = lv.instance
            if (inst.model == name and lv.state == "ready" and (ctx is None or inst.ctx_tokens >= ctx)
                    and (inst.embeddings or not embeddings) and inst.template == template):
                return lv
        return None

    def hold(self, instance: Instance) -> None:
        """One more request in flight on `instance` (never evicted while any is); `unhold` ends it."""
        lv = self._live.get(instance.instance_id)
        if lv is None:
            raise LoadFailed(f"instance {instance.instance_id} of {instance.model} is gone")
        lv.in_flight += 1

    def unhold(self, instance: Instance) -> None:
        lv = self._live.get(instance.instance_id)
        if lv is not None and lv.in_flight > 0:
            lv.in_flight -= 1
            lv.last_used = self.app.clock.now()
            self._wake_reaper_for(lv)

    async def gone(self, instance: Instance) -> bool:
        """Asked when `instance`'s port refused or dropped a request before any answer: True when its child is gone
        (its exit recorded, or it is being stopped) or on its way out (then nothing more is routed to it, and this
        waits, at most KILL_WAIT_S, for the watcher to record the exit); False while it runs, when the failure is the
        engine's own answer to that request."""
        lv = self._live.get(instance.instance_id)
        if lv is None or lv.state == "stopping":
            return True
        if lv.proc.returncode is None and not process.pid_dying(lv.proc.pid):
            return False
        if lv.state == "ready":
            lv.state = "exiting"  # a SIGKILLed child's port closes before it can be reaped: route nothing more to it
        if lv.watcher is not None:
            await asyncio.wait([lv.watcher], timeout=process.KILL_WAIT_S)  # never cancels the watcher
        return True

    def _wake_reaper_for(self, lv: _Live) -> None:
        """Wake the idle reaper only when `lv` now runs out before the reaper's next wake-up: a request that ends
        moves its instance's deadline later, so on the common path the reaper sleeps on (it re-reads every
        deadline when it wakes)."""
        if lv.in_flight or lv.pinned or lv.keep_alive_s is None:
            return
        due = asyncio.get_running_loop().time() + max(0.0, lv.keep_alive_s)
        if self._reaper_due is None or due < self._reaper_due:
            self._poke.set()

    async def _refuse(self, model: str, reason: RefusalReason, detail: str, exc: type[BlazarError] | BlazarError,
                      observations: dict[str, Any] | None = None) -> BlazarError:
        """Record the refusal (a decision), then hand back the error to raise: `exc` itself when it is one."""
        await self.app.record(InstanceLoadRefused(model=model, reason=reason, detail=detail,
                                                   observations=observations or {}))
        return exc if isinstance(exc, BlazarError) else exc(detail)

    async def _start(self, model: ResolvedModel, *, ctx: int | None, keep_alive: Any, pinned: bool, reason: str,
                     embeddings: bool = False, route: Route | None = None, session: bool = False) -> Instance:
        """Check, make room, record the intent, spawn, await ready: each step its own method."""
        engine = await self._check(model.name)
        settings = self.app.settings()
        keep = keep_alive_seconds(settings.keep_alive) if keep_alive is UNSET else keep_alive
        swa_full = session and settings.session_swa_full and bool(model.metadata.sliding_window)
        async with self._capacity:
            await self._reshape(model.name, ctx, embeddings, route, model.template)
            fit, free_observed = await self._place(model.name, model.metadata, ctx, settings, route,
                                                   swa_full=swa_full, engine=engine)
            lv = await self._launch(model, engine, fit, free_observed=free_observed, keep_alive_s=keep,
                                    pinned=pinned, reason=reason, embeddings=embeddings)
        return await self._await_ready(lv, route)

    async def _check(self, name: str) -> ActiveEngine:
        """Refuse (recorded) while the model's crash circuit is open or no engine is active; after a recent crash,
        wait out the restart backoff."""
        app = self.app
        now = app.clock.now()
        settings = app.settings()
        residency = app.runner.state("residency")
        opened = circuit(residency, name, now)
        if opened is not None:
            until = opened.open_until
            raise await self._refuse(
                name, "circuit_open",
                f"{name} crashed {opened.crashes} times within {settings.crash_window_s:.0f} s; loads are refused "
                f"for {until - now:.0f} s more "
                f"or until `blazar ps --reset {name}`", CircuitOpen, {"open_until": until})
        try:
            engine = self._engine(app)
            # NOTE: before every spawn, not only at activation: a file changed since is never executed. Hashed in a
            # thread, and only when a file's (inode, size, mtime, ctime) changed since it was last hashed.
            await asyncio.to_thread(verify_for_spawn, app.paths.engines, engine.tag, engine.files)
        except EngineVerifyFailed as e:
            raise await self._refuse(name, "engine_unverified", e.message, e,
                                     {"engine": e.tag, "problems": e.problems}) from None
        except EngineError as e:
            raise await self._refuse(name, "no_engine", e.message, e) from None
        delay = restart_delay(recent_crashes(residency, name), now, window_s=settings.crash_window_s)
        if delay > 0:
            log.info("%s crashed recently; waiting %.1f s before restarting it", name, delay)
            await asyncio.sleep(delay)
        return engine

    async def _reshape(self, name: str, ctx: int | None, embeddings: bool, route: Route | None,
                       template: str = "") -> None:
        """A smaller-context instance of this model gives way to the new shape (it is idle, or it would have been
        reused); a pinned one refuses the load instead. One started with the model's old template gives way once
        idle, pinned or not: the user changed the model."""
        for lv in [lv for lv in self._live.values() if lv.instance.model == name and lv.state == "ready"]:
            if lv.instance.template != template:
                if lv.in_flight == 0:
                    await self._evict(lv, "reshape", for_model=name, route=route,
                                      observations={"template_wanted": template, "template_had": lv.instance.template})
                continue
            if lv.pinned:
                had = lv.instance.ctx_tokens
                want = (f"{ctx} were asked for" if ctx is not None and ctx > had
                        else "this request needs the embeddings endpoint it was started without")
                raise await self._refuse(
                    name, "no_room", f"{name} is pinned at {had} tokens per slot and {want}; unpin it "
                    f"(blazar load {name} --unpin) or stop it first", ModelPinned,
                    {"ctx_wanted": ctx, "ctx_had": had, "embeddings_wanted": embeddings,
                     "pinned": lv.instance.instance_id})
            if lv.in_flight == 0:
                await self._evict(lv, "reshape", for_model=name, route=route,
                                  observations={"ctx_wanted": ctx, "ctx_had": lv.instance.ctx_tokens,
                                                "embeddings_wanted": embeddings})

    async def _launch(self, model: ResolvedModel, engine: ActiveEngine, fit: FitPlan, *, free_observed: int,
                      keep_alive_s: float | None, pinned: bool, reason: str, embeddings: bool) -> _Live:
        """Record the intent (`instance.starting`, with the argv and port), then spawn, then record the spawn
        (`instance.started`, with the pid). A spawn that fails is recorded as the intent's exit."""
        app, name = self.app, model.name
        instance_id = secrets.token_hex(6)
        port = process.free_port()
        log_path = app.paths.log / "instances" / f"{instance_id}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        argv, api_key = await self._argv(model, engine, fit, instance_id=instance_id, port=port,
                                         embeddings=embeddings)
        facts: dict[str, Any] = dict(
                     instance_id=instance_id, model=name, engine_tag=engine.tag, port=port, argv=redact_argv(argv),
                     log_path=str(log_path.relative_to(app.paths.log)), ctx_tokens=fit.ctx_per_slot,
                     engine_ctx=fit.engine_ctx, slots=fit.slots, cache_type_k=fit.cache_type_k,
                     cache_type_v=fit.cache_type_v, flash_attn=fit.flash_attn, gpu_layers=fit.gpu_layers,
                     planned_bytes=fit.local_bytes, estimate_bytes=fit.local_estimate_bytes, keep_alive_s=keep_alive_s,
                     pinned=pinned, reason="load" if reason == "load" else "request",
                     free_bytes_observed=free_observed, workers=_plan_workers(fit),
                     node=app.node)
        (intent,) = await app.record(InstanceStarting(**facts))
        try:
            proc = await process.spawn(argv, log_path=log_path)
        except EngineError as e:
            _keyfile(app, instance_id).unlink(missing_ok=True)
            await app.record(InstanceExited(instance_id=instance_id, model=name, reason="spawn_failed",
                                            detail=e.message), cause=intent.seq)
            raise
        pidfile = _pidfile(app, instance_id)
        pidfile.parent.mkdir(parents=True, exist_ok=True)
        pidfile.write_text(f"{proc.pid} {port}\n")
        (started,) = await app.record(InstanceStarted(pid=proc.pid, **facts), cause=intent.seq)
        inst = Instance(instance_id=instance_id, model=name, port=port, slots=fit.slots, ctx_tokens=fit.ctx_per_slot,
                        engine_tag=engine.tag, embeddings=embeddings, api_key=api_key,
                        served_as=name if engine.caps.has("--alias") else str(model.path), template=model.template,
                        kv_identity=_kv_identity(engine, model, fit),
                        kv_restorable=fit.swa_full or not model.metadata.sliding_window)
        lv = _Live(instance=inst, proc=proc, plan=fit, log_path=log_path, started_seq=started.seq,
                   started_mono=app.clock.monotonic(), keep_alive_s=keep_alive_s, pinned=pinned)
        self._live[instance_id] = lv
        lv.watcher = asyncio.create_task(self._watch(lv), name=f"blazar-watch-{instance_id}")
        return lv

    async def _argv(self, model: ResolvedModel, engine: ActiveEngine, fit: FitPlan, *, instance_id: str, port: int,
                    embeddings: bool) -> tuple[list[str], str | None]:
        """The child's argv and its own key (written 0600 beside its pid file). An engine that lacks a flag the plan
        needs refuses the load (recorded)."""
        app, name = self.app, model.name
        settings = app.settings()
        # Slot saves (llama-server's /slots?action=save) land per model, so a later instance of it finds them.
        slots = slot_dir(app.paths.data_dir, name)
        slots.mkdir(parents=True, exist_ok=True)
        os.chmod(slots, 0o700)  # slot dumps hold conversations: for the owner only, whatever made the dir
        try:  # the engine opens the model's file (and its other parts beside it): only inside the store
            model_file = inside(app.paths.models, model.path, what=f"the catalog's entry for {name}")
        except OutsideHome as e:
            raise await self._refuse(name, "untrusted_path", e.message, e) from None
        api_key, key_flags = engine_key(engine.caps, _keyfile(app, instance_id))
        try:
            argv = build_argv(engine.binary, model_file, fit, engine.caps, port=port,
                              threads=settings.engine_threads or None, load_mode=settings.load_mode,
                              slot_save_path=slots if engine.caps.slot_save_path else None,
                              extra=[*key_flags, *_alias_flags(engine, name),
                                     *template_flags(engine.caps, model.settings, app.paths.data_dir / "templates"),
                                     *(_embedding_flags(engine, model.metadata) if embeddings else ())])
        except EngineIncompatible as e:
            _keyfile(app, instance_id).unlink(missing_ok=True)
            raise await self._refuse(name, "engine_incompatible", e.message, e) from None
        return argv, api_key

    async def _await_ready(self, lv: _Live, route: Route | None) -> Instance:
        """Wait for /health; record ready (or the reason it never was)."""
        app, inst = self.app, lv.instance
        name, settings = inst.model, app.settings()
        try:
            waited = await process.wait_healthy(lv.proc, inst.port, timeout_s=settings.load_timeout_s)
        except process.LoadTimeout as e:
            await self._terminate(lv, "load_timeout", detail=f"not healthy after {e.waited_s:.1f} s")
            raise LoadFailed(f"{name} did not become ready within {settings.load_timeout_s:.0f} s (load_timeout_s); "
                             f"the engine log: {lv.log_path}") from None
        except process.ProcessExited:
            assert lv.watcher is not None
            await lv.watcher  # the watcher records the exit (load_failed, or stopped when a user stopped it)
            tail = process.log_tail(lv.log_path, 5)
            raise LoadFailed(f"{name} exited while loading (code {lv.proc.returncode}): "
                             + (" | ".join(tail) or "no output") + f"; the engine log: {lv.log_path}") from None
        if lv.state == "stopping":
            raise LoadFailed(f"{name} was stopped while it loaded")
        lv.state = "ready"
        lv.last_used = app.clock.now()
        inst.load_ms = int(waited * 1000)
        if route is not None:
            route.cold, route.load_ms = True, inst.load_ms
        await app.record(InstanceReady(instance_id=inst.instance_id, model=name, load_ms=inst.load_ms),
                         cause=lv.started_seq)
        if not lv.ready.done():
            lv.ready.set_result(inst)
        # The measurement reads the whole engine log and appends one more event: off the caller's path.
        self._background(self._measure(lv), f"blazar-measure-{inst.instance_id}")
        self._poke.set()
        return inst

    async def drain(self) -> None:
        """Wait for the background work started so far (memory measurements after loads)."""
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _background(self, coro: Any, name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _place(self, name: str, meta: ModelMetadata, ctx: int | None, settings: Any,
                     route: Route | None = None, *, swa_full: bool = False,
                     engine: ActiveEngine | None = None) -> tuple[FitPlan, int]:
        """A plan that fits, evicting what must go, else spilling layers to idle RPC workers; DoesNotFit (recorded)
        when nothing can make room."""
        explicit_ctx = ctx is not None
        request = FitRequest(ctx=ctx or settings.ctx or None, slots=settings.slots or None, swa_full=swa_full)
        limit = settings.memory_limit_mib * (1 << 20)
        devices = await asyncio.to_thread(self._devices)
        measured = self._measured()
        budget = budget_devices(devices, self._residents(measured), memory_limit_bytes=limit)
        fit = self._plan(name, meta, budget, request)
        if fit.fits and not explicit_ctx and fit.ctx_per_slot < min(MIN_AUTO_CTX, meta.ctx_train or MIN_AUTO_CTX):
            # It fits here only with a cramped context: idle workers may give it the context it would get anywhere.
            spread = await self._on_workers(name, meta, budget, request, engine)
            if spread is not None and spread.ctx_per_slot > fit.ctx_per_slot:
                fit = spread
        need_count = 0
        if settings.max_loaded_models:
            need_count = max(0, sum(1 for lv in self._live.values() if lv.state not in ("stopping", "exiting"))
                             - settings.max_loaded_models + 1)
        need_bytes = 0 if fit.fits else shortfall_bytes(meta, budget, request.model_copy(
            update={"correction": fit.correction_bytes}))
        if need_count or need_bytes:
            cands = self._candidates(measured)
            victims = decide.decide_victims(cands, need_bytes=need_bytes, free_bytes=0, need_count=need_count)
            if victims is None and need_count == 0:
                spread = await self._on_workers(name, meta, budget, request, engine)
                if spread is not None:
                    return spread, _host_free(budget)
            if victims is None and not fit.fits and not explicit_ctx and need_count == 0:
                # Nothing can go for the default shape: take the largest context that fits in what is free.
                fallback = self._plan(name, meta, budget, FitRequest(ctx=None, slots=None, swa_full=swa_full))
                if fallback.fits:
                    return fallback, _host_free(budget)
            if victims is None:
                obs = {"need_bytes": need_bytes, "need_count": need_count, "loaded": len(self._live),
                       "max_loaded_models": settings.max_loaded_models, "host_free_bytes": _host_free(budget),
                       "busy_or_pinned": [c.instance_id for c in cands if c.in_flight or c.pinned]}
                why = (fit.summary + self._workers_lever(meta, budget, request, engine) if not fit.fits else
                       f"{len(self._live)} instances loaded (max_loaded_models {settings.max_loaded_models}) "
                       "and none can be evicted: every one is busy or pinned")
                raise await self._refuse(name, "does_not_fit" if need_bytes else "no_room", why, DoesNotFit, obs)
            reason: EvictionReason = "memory" if need_bytes else "max_loaded_models"
            obs = {"need_bytes": need_bytes, "need_count": need_count, "host_free_bytes": _host_free(budget),
                   "loaded": len(self._live), "max_loaded_models": settings.max_loaded_models,
                   "scores": victims.scores, "why": victims.why}
            await asyncio.gather(*(self._evict(self._live[v.instance_id], reason, for_model=name, observations=obs,
                                               route=route) for v in victims.victims))
            devices = await asyncio.to_thread(self._devices)
            measured = self._measured()
            budget = budget_devices(devices, self._residents(measured), memory_limit_bytes=limit)
            fit = self._plan(name, meta, budget, request)
            if not fit.fits and (spread := await self._on_workers(name, meta, budget, request, engine)) is not None:
                fit = spread
            if not fit.fits:
                raise await self._refuse(name, "does_not_fit",
                                         fit.summary + self._workers_lever(meta, budget, request, engine),
                                         DoesNotFit, {"host_free_bytes": _host_free(budget)})
        return fit, _host_free(budget)

    async def _on_workers(self, name: str, meta: ModelMetadata, budget: list[Device], request: FitRequest,
                          engine: ActiveEngine | None) -> FitPlan | None:
        """A plan that puts the layers the host cannot hold on idle RPC workers, when the engine can use workers
        and one fits. A worker serves one llama-server at a time (rpc-server takes one client), so a worker an
        instance already uses is not offered; one that does not accept a connection now is skipped."""
        if engine is None or not rpc_capable(engine):
            return None
        # Its own instances' workers (one starting may not be in the log yet); idle_workers adds every node's.
        offered = await idle_workers(self.app, {a for lv in self._live.values() for a in _plan_workers(lv.plan)})
        if not offered:
            return None
        fit = self._plan(name, meta, [*budget, *worker_devices(offered)],
                         request.model_copy(update={"offload": "fewest"}))
        return fit if fit.fits else None

    def _workers_lever(self, meta: ModelMetadata, budget: list[Device], request: FitRequest,
                       engine: ActiveEngine | None) -> str:
        """The RPC-worker lever for a refusal: how much idle workers would have to offer, and how to get them."""
        need = worker_bytes_needed(meta, budget, request)
        if need is None:
            return ""
        how = ("`blazar worker --mem MiB` on hosts with room" if engine is not None and rpc_capable(engine)
               else "an engine built with `blazar engine build --target rpc-server`, then `blazar worker --mem MiB` "
                    "on hosts with room")
        return f" Or spread it across RPC workers: idle workers offering {need / (1 << 20):.0f} MiB in all ({how})."

    def _plan(self, name: str, meta: ModelMetadata, budget: list[Device], request: FitRequest) -> FitPlan:
        first = try_plan(meta, budget, request)
        correction = correction_for(self.app.runner.state("calibration"), name, first.ctx_per_slot, first.slots,
                                    first.cache_type_k, first.cache_type_v)
        if correction == 0:
            return first
        return try_plan(meta, budget, request.model_copy(update={"correction": correction}))

    def _measured(self) -> dict[str, int | None]:
        residency = self.app.runner.state("residency")
        return {iid: inst.measured_bytes if (inst := instance(residency, iid)) is not None else None
                for iid in self._live}

    def _residents(self, measured: dict[str, int | None]) -> list[Resident]:
        return [Resident(iid, lv.charged_bytes(measured.get(iid))) for iid, lv in self._live.items()]

    def _candidates(self, measured: dict[str, int | None]) -> list[decide.Candidate]:
        now = self.app.clock.now()
        out = []
        for iid, lv in self._live.items():
            if lv.state != "ready":
                continue  # a loading instance is busy by definition; a stopping one is already going
            out.append(decide.Candidate(
                instance_id=iid, model=lv.instance.model, bytes=lv.charged_bytes(measured.get(iid)),
                idle_s=max(0.0, now - lv.last_used) if lv.in_flight == 0 else 0.0, in_flight=lv.in_flight,
                pinned=lv.pinned, keep_alive_s=lv.keep_alive_s, load_ms=lv.instance.load_ms))
        return out

    async def _measure(self, lv: _Live) -> None:
        """Record what the engine allocated beside the plan, for the next plan of this model. An instance split
        across RPC workers is not measured: its log lists the workers' buffers (on other hosts) and its RSS only
        this host's, so neither compares with a local plan."""
        if _plan_workers(lv.plan):
            return
        try:
            text = await asyncio.to_thread(lv.log_path.read_text, errors="replace")
            await record_measurement(
                self.app, model=lv.instance.model, ctx_tokens=lv.plan.ctx_per_slot, slots=lv.plan.slots,
                cache_type_k=lv.plan.cache_type_k, cache_type_v=lv.plan.cache_type_v,
                planned_bytes=lv.plan.estimate_bytes, log_text=text, rss_bytes=process.rss_bytes(lv.proc.pid),
                instance_id=lv.instance.instance_id)
        except (OSError, ValueError) as e:
            log.warning("no memory measurement for %s: %s", lv.instance.model, e)

    async def _apply_keep_alive(self, lv: _Live, keep_alive: Any, pinned: bool | None) -> None:
        keep = lv.keep_alive_s if keep_alive is UNSET else keep_alive
        pin = lv.pinned if pinned is None else pinned
        if keep == lv.keep_alive_s and pin == lv.pinned:
            return
        lv.keep_alive_s, lv.pinned = keep, pin
        await self.app.record(InstanceKeepAliveSet(instance_id=lv.instance.instance_id, model=lv.instance.model,
                                                    keep_alive_s=keep, pinned=pin))

    # -- stopping ---------------------------------------------------------------------------------------------

    async def _evict(self, lv: _Live, reason: EvictionReason, *, for_model: str | None = None,
                     observations: dict[str, Any] | None = None, route: Route | None = None) -> None:
        if lv.state == "stopping":
            return  # already going (the reaper and a load may pick the same victim)
        lv.state = "stopping"
        if route is not None:
            route.evicted.append(Evicted(model=lv.instance.model, instance_id=lv.instance.instance_id, reason=reason))
        idle = max(0.0, self.app.clock.now() - lv.last_used) if lv.last_used else 0.0
        await self._save_sessions(lv, "evicted")
        (ev,) = await self.app.record(InstanceEvicted(
            instance_id=lv.instance.instance_id, model=lv.instance.model, reason=reason, for_model=for_model,
            idle_s=round(idle, 3), bytes_freed=lv.charged_bytes(self._measured().get(lv.instance.instance_id)),
            observations=observations or {}), cause=lv.started_seq)
        await self._terminate(lv, "evicted", cause=ev.seq)

    async def _save_sessions(self, lv: _Live, reason: SaveReason) -> None:
        """Save the slots of `lv` that hold sessions to the KV bank before its child goes (bounded per slot by
        session_save_timeout_s); a failure is recorded and never stops the stop."""
        if self.kv_bank is None or lv.exit_recorded or lv.proc.returncode is not None:
            return
        try:
            await self.kv_bank.save_instance(lv.instance, reason)
        except Exception:
            log.exception("saving the sessions of %s failed", lv.instance.instance_id)

    async def _terminate(self, lv: _Live, reason: ExitReason, *, detail: str = "", cause: int | None = None) -> None:
        """Stop the child (SIGTERM, grace, SIGKILL) and record its exit with `reason`."""
        if lv.state == "stopping" and lv.exit_recorded:
            return
        lv.state = "stopping"
        code = await process.stop_process(lv.proc, grace_s=self.app.settings().stop_grace_s)
        if lv.watcher is not None and lv.watcher is not asyncio.current_task():
            with contextlib.suppress(asyncio.CancelledError):
                await lv.watcher
        await self._record_exit(lv, reason, code, detail=detail, cause=cause)

    async def _record_exit(self, lv: _Live, reason: ExitReason, code: int | None, *, detail: str = "",
                           cause: int | None = None) -> None:
        if lv.exit_recorded:
            return
        lv.exit_recorded = True
        self._live.pop(lv.instance.instance_id, None)
        if self.kv_bank is not None:
            self.kv_bank.forget(lv.instance.instance_id)
        uptime = int((self.app.clock.monotonic() - lv.started_mono) * 1000)
        tail = process.log_tail(lv.log_path, LOG_TAIL_LINES)
        await self.app.record(InstanceExited(
            instance_id=lv.instance.instance_id, model=lv.instance.model, reason=reason, exit_code=code,
            uptime_ms=uptime, log_tail=tail, detail=detail), cause=cause or lv.started_seq)
        _pidfile(self.app, lv.instance.instance_id).unlink(missing_ok=True)
        _keyfile(self.app, lv.instance.instance_id).unlink(missing_ok=True)
        if not lv.ready.done():
            lv.ready.set_exception(LoadFailed(f"{lv.instance.model} exited ({reason})"))
            lv.ready.exception()
        if reason in ("crashed", "load_failed", "load_timeout"):
            await self._maybe_open_circuit(lv.instance.model, code)
        self._poke.set()

    async def _watch(self, lv: _Live) -> None:
        """Wait for the child to exit; an exit nobody asked for is a crash (or a failed load)."""
        code = await lv.proc.wait()
        if lv.state == "stopping":
            return  # _terminate records it, with the reason it was stopped for
        reason: ExitReason = "load_failed" if lv.state == "starting" else "crashed"
        lv.state = "stopping"
        await self._record_exit(lv, reason, code, detail=f"exited on its own with code {code}")

    async def _maybe_open_circuit(self, model: str, code: int | None) -> None:
        settings = self.app.settings()
        now = self.app.clock.now()
        residency = self.app.runner.state("residency")
        crashes = recent_crashes(residency, model)
        if circuit(residency, model, now) is None and decide.decide_circuit(
                crashes, now, limit=settings.crash_limit, window_s=settings.crash_window_s):
            n = sum(1 for t in crashes if now - t <= settings.crash_window_s)
            await self.app.record(ModelCircuitOpened(model=model, crashes=n, window_s=settings.crash_window_s,
                                                      open_until=now + settings.circuit_open_s, last_exit_code=code))

    # -- idle eviction ----------------------------------------------------------------------------------------

    async def reap_once(self) -> float | None:
        """Evict instances whose keep-alive has run out; returns seconds until the next one is due (None: none)."""
        now = self.app.clock.now()
        views = [decide.IdleView(instance_id=iid, idle_s=max(0.0, now - lv.last_used), in_flight=lv.in_flight,
                                 pinned=lv.pinned, keep_alive_s=self._idle_keep_s(lv))
                 for iid, lv in self._live.items() if lv.state == "ready"]
        due = decide.decide_idle(views, now)
        for iid, idle_s in due:
            lv = self._live.get(iid)
            if lv is not None:
                # idle_keep_s: what it was allowed, its keep-alive or longer while a slot held a session
                await self._evict(lv, "idle", observations={"idle_s": round(idle_s, 3),
                                                            "keep_alive_s": lv.keep_alive_s,
                                                            "idle_keep_s": self._idle_keep_s(lv)})
        remaining = [v for v in views if v.instance_id not in {i for i, _ in due}]
        return decide.next_wakeup(remaining, now)

    def _idle_keep_s(self, lv: _Live) -> float | None:
        """How long `lv` may sit idle: its keep-alive, or longer while one of its slots holds a session (a session
        pins its model against idle eviction for session_keep_s; memory pressure still evicts it)."""
        if self.kv_bank is None or lv.keep_alive_s is None or self.kv_bank.last_session_use(
                lv.instance.instance_id) is None:
            return lv.keep_alive_s
        return max(lv.keep_alive_s, self.app.settings().session_keep_s)

    async def _reap_loop(self) -> None:
        while not self._closed:
            try:
                wait = await self.reap_once()
            except Exception:
                log.exception("idle reaper")
                wait = 1.0
            self._poke.clear()
            timeout = REAPER_MAX_SLEEP_S if wait is None else min(REAPER_MAX_SLEEP_S, max(0.05, wait))
            self._reaper_due = asyncio.get_running_loop().time() + timeout
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._poke.wait()
            self._reaper_due = None


def _kv_identity(engine: ActiveEngine, model: ResolvedModel, fit: FitPlan) -> KvIdentity | None:
    """What a slot saved from this instance is valid for; None when the engine cannot save slots."""
    if not engine.caps.slot_save_path:
        return None
    return KvIdentity(engine=engine.tag, model_sha256=model.sha256, ctx_tokens=fit.ctx_per_slot,
                      cache_type_k=fit.cache_type_k, cache_type_v=fit.cache_type_v, swa_full=fit.swa_full)


def _embedding_flags(engine: ActiveEngine, meta: ModelMetadata) -> list[str]:
    """Turn on llama-server's embeddings endpoint; a generative model (no pooling type of its own) pools by mean.
    NOTE: this build keeps chat and completions working with the flag on, so one instance serves both."""
    flags = ["--embeddings"] if engine.caps.has("--embeddings", "--embedding") else []
    if flags and not meta.pooling_type and engine.caps.has("--pooling"):
        flags += ["--pooling", "mean"]
    return flags


def _alias_flags(engine: ActiveEngine, name: str) -> list[str]:
    """The engine answers with the store's name in `model`, not its file's path (which would leak where the store
    is); the gateway puts the client's own name there when it asked by another (`name:latest`, an alias)."""
    return ["--alias", name] if engine.caps.has("--alias") else []


def _keyfile(app: Blazar, instance_id: str) -> Path:
    return app.paths.run / "instances" / f"{instance_id}.key"


def _pidfile(app: Blazar, instance_id: str) -> Path:
    """Written between spawn and `instance.started`: reconcile finds a child whose start never reached the log."""
    return app.paths.run / "instances" / f"{instance_id}.pid"


def _plan_workers(fit: FitPlan) -> dict[str, int]:
    """The RPC workers a plan puts layers on (address: layers, the output layer counted), in --rpc order."""
    return {u.name: n for u in fit.devices if u.kind == "rpc" and (n := u.offloaded)}


def _host_free(budget: list[Device]) -> int:
    return next((d.free_bytes for d in budget if d.kind == "host"), 0)


async def reset_circuit(app: Blazar, model: str) -> bool:
    """Close `model`'s circuit (`blazar ps --reset`): True when one was open. Works with or without a daemon:
    the daemon's projections follow the log."""
    await app.runner.catch_up()
    if circuit(app.runner.state("residency"), model, app.clock.now()) is None:
        return False
    await app.record(ModelCircuitReset(model=model))
    return True
