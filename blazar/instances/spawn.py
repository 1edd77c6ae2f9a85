"""Starting one child with the plan the room chose: record the intent (`instance.starting`, with the argv and the
port), spawn llama-server, record the spawn (`instance.started`, with the pid), then wait for /health and record
`instance.ready` (or the reason it never was) and, off the caller's path, the memory measurement for calibration."""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import shutil
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from blazar.adapters.engines import process
from blazar.adapters.engines.kinds import EngineKind, Launch, engine_kind, write_key
from blazar.adapters.engines.llama_server import build_argv, engine_key, redact_argv
from blazar.adapters.engines.lora import lora_flags
from blazar.adapters.engines.posture import posture_flags
from blazar.adapters.engines.reasoning_flags import load_budget, per_request_budget, reasoning_flags
from blazar.confine import inside
from blazar.context import Blazar
from blazar.errors import OWNER_SEES, EngineError, EngineIncompatible, LoadFailed, ModelNotFound, OutsideHome
from blazar.events.instances import InstanceExited, InstanceReady, InstanceStarted, InstanceStarting
from blazar.events.models import InstanceMemoryMeasured, ModelMetadata
from blazar.events.sessions import KvIdentity
from blazar.fit import FitPlan
from blazar.instances.calibration import record_measurement
from blazar.instances.live import (
    Instance,
    Live,
    LiveSet,
    LoadReport,
    ResolvedModel,
    keyfile,
    pidfile,
    plan_workers,
    scratchdir,
    socketfile,
)
from blazar.instances.load_checks import record_refusal
from blazar.instances.posture_choice import PostureChoice
from blazar.instances.stopping import Stopper
from blazar.projections.catalog import stored
from blazar.store.chat_templates import ServedTemplate, served_settings, served_template
from blazar.store.engines import ActiveEngine
from blazar.store.model_settings import template_flags
from blazar.store.models import slot_dir

log = logging.getLogger("blazar.supervisor")
# The longest path a Unix socket may have on Linux (sun_path holds 108 bytes with its NUL).
MAX_SOCKET_PATH = 107


class Spawner:
    """Starts children into `live`; `stopper` watches them and stops one whose load times out; `poke` wakes the
    idle reaper once one is ready. Owns the background work a load leaves (its memory measurement)."""

    def __init__(self, app: Blazar, live: LiveSet, stopper: Stopper, poke: asyncio.Event) -> None:
        self.app = app
        self.live = live
        self.stopper = stopper
        self.poke = poke
        self.tasks: set[asyncio.Task[Any]] = set()

    async def launch(self, model: ResolvedModel, engine: ActiveEngine | None, fit: FitPlan, *, free_observed: int,
                     keep_alive_s: float | None, pinned: bool, reason: str, embeddings: bool,
                     rerank: bool = False, posture: PostureChoice | None = None) -> Live:
        """Record the intent (`instance.starting`, with the argv and port), then spawn, then record the spawn
        (`instance.started`, with the pid). A spawn that fails is recorded as the intent's exit. A llama-server
        model runs `engine` (at `posture`, the adopted profile's, whose fit `fit` already is); a whisper or piper
        model its kind's child (`engine` None)."""
        chosen = posture or PostureChoice()
        app, name = self.app, model.name
        kind = engine_kind(model.kind)
        instance_id = secrets.token_hex(6)
        # A kind that listens on a Unix socket (piper: it checks no key) has no TCP port at all: port 0.
        socket = socketfile(app, instance_id) if kind.unix_socket else None
        port = 0 if socket is not None else process.free_port()
        log_path = app.paths.log / "instances" / f"{instance_id}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        cwd: Path | None = None
        if engine is not None:
            argv, api_key = await self._argv(model, engine, fit, instance_id=instance_id, port=port,
                                             embeddings=embeddings, rerank=rerank, posture=chosen)
            engine_tag = engine.tag
        else:
            argv, api_key, cwd = await self._child_argv(model, kind, instance_id=instance_id, port=port,
                                                        socket=socket)
            engine_tag = kind.name
        facts: dict[str, Any] = dict(
                     instance_id=instance_id, model=name, engine_tag=engine_tag, kind=kind.name, port=port,
                     argv=redact_argv(argv),
                     log_path=str(log_path.relative_to(app.paths.log)), ctx_tokens=fit.ctx_per_slot,
                     engine_ctx=fit.engine_ctx, slots=fit.slots, cache_type_k=fit.cache_type_k,
                     cache_type_v=fit.cache_type_v, flash_attn=fit.flash_attn, gpu_layers=fit.gpu_layers,
                     planned_bytes=fit.local_bytes, estimate_bytes=fit.local_estimate_bytes, keep_alive_s=keep_alive_s,
                     pinned=pinned, reason=reason if reason in ("load", "preload", "reshape") else "request",
                     free_bytes_observed=free_observed, workers=plan_workers(fit),
                     node=app.node, posture=chosen.posture, profile_seq=chosen.profile_seq,
                     profile_stale_seq=chosen.stale_seq)
        (intent,) = await app.record(InstanceStarting(**facts))
        try:
            proc = await process.spawn(argv, log_path=log_path, env=process.child_env(app.env), cwd=cwd)
        except EngineError as e:
            keyfile(app, instance_id).unlink(missing_ok=True)
            socketfile(app, instance_id).unlink(missing_ok=True)
            shutil.rmtree(scratchdir(app, instance_id), ignore_errors=True)
            await app.record(InstanceExited(instance_id=instance_id, model=name, reason="spawn_failed",
                                            detail=e.message), cause=intent.seq)
            raise
        pid_path = pidfile(app, instance_id)
        pid_path.parent.mkdir(parents=True, exist_ok=True)
        pid_path.write_text(f"{proc.pid} {port}\n")
        (started,) = await app.record(InstanceStarted(pid=proc.pid, **facts), cause=intent.seq)
        if engine is not None:
            served = _served(engine, model)
            inst = Instance(instance_id=instance_id, model=name, port=port, slots=fit.slots,
                            ctx_tokens=fit.ctx_per_slot, engine_tag=engine.tag, embeddings=embeddings and not rerank,
                            rerank=rerank, api_key=api_key,
                            served_as=name if engine.caps.has("--alias") else str(model.path),
                            template=model.template, kv_identity=_kv_identity(engine, model, fit),
                            kv_restorable=fit.swa_full or not model.metadata.sliding_window,
                            posture=chosen.posture, profile_seq=chosen.profile_seq, stops=served.stops,
                            sampling=served.sampling, loop_guard=served.guards_loops,
                            per_request_budget=per_request_budget(engine.caps),
                            load_budget=load_budget(engine.caps, _model_budget(model)))
        else:
            inst = Instance(instance_id=instance_id, model=name, port=port, slots=fit.slots, ctx_tokens=0,
                            engine_tag=engine_tag, api_key=api_key, served_as=name, template=model.template,
                            kind=kind.name, socket=str(socket or ""))
        lv = Live(instance=inst, proc=proc, plan=fit, log_path=log_path, started_seq=started.seq,
                  started_mono=app.clock.monotonic(), keep_alive_s=keep_alive_s, pinned=pinned)
        self.live.add(lv)
        lv.watcher = asyncio.create_task(self.stopper.watch(lv), name=f"blazar-watch-{instance_id}")
        return lv

    async def _argv(self, model: ResolvedModel, engine: ActiveEngine, fit: FitPlan, *, instance_id: str, port: int,
                    embeddings: bool, rerank: bool = False,
                    posture: PostureChoice = PostureChoice()) -> tuple[list[str], str | None]:
        """The child's argv and its own key (written 0600 beside its pid file). An engine that lacks a flag the plan
        or the posture needs refuses the load (recorded)."""
        tuned = posture.posture
        app, name = self.app, model.name
        settings = app.settings()
        # Slot saves (llama-server's /slots?action=save) land per model, so a later instance of it finds them.
        slots = slot_dir(app.paths.data_dir, name)
        slots.mkdir(parents=True, exist_ok=True)
        os.chmod(slots, 0o700)  # slot dumps hold conversations: for the owner only, whatever made the dir
        try:  # the engine opens the model's file (and its other parts beside it): only inside the store
            model_file = inside(app.paths.models, model.path, what=f"the catalog's entry for {name}")
            proj = model.projector
            projector = None if proj is None else inside(
                app.paths.models, proj.path, what=f"model.projector_set (seq {proj.seq}) of {name}")
            # LoRA: each adapter confined to the store too, in the model's order (their ids on the engine).
            adapters = [inside(app.paths.models, a.path, what=f"lora.added {a.name} (seq {a.seq}) of {name}")
                        for a in model.loras] if not rerank else []
            draft = draft_file(app, name, posture)
        except OutsideHome as e:
            raise await record_refusal(app, name, "untrusted_path", e.message, e) from None
        except ModelNotFound as e:
            raise await record_refusal(app, name, "draft_missing", e.message, e) from None
        api_key, key_flags = engine_key(engine.caps, keyfile(app, instance_id))
        try:
            argv = build_argv(engine.binary, model_file, fit, engine.caps, port=port, projector=projector,
                              threads=(tuned.threads if tuned else None) or settings.engine.engine_threads or None,
                              load_mode=settings.engine.load_mode,
                              slot_save_path=slots if engine.caps.slot_save_path else None,
                              extra=[*key_flags, *_alias_flags(engine, name),
                                     *template_flags(engine.caps, served_settings(
                                         model.metadata, model.settings, model.template_probe,
                                         jinja_files=engine.caps.has("--chat-template-file")),
                                         app.paths.data_dir / "templates"),
                                     *_mode_flags(engine, model.metadata, embeddings=embeddings, rerank=rerank),
                                     *lora_flags(engine.caps, adapters),
                                     *reasoning_flags(engine.caps, _model_budget(model)),
                                     *posture_flags(engine.caps, tuned, draft)])
        except EngineIncompatible as e:
            keyfile(app, instance_id).unlink(missing_ok=True)
            raise await record_refusal(app, name, "engine_incompatible", e.message, e) from None
        return argv, api_key

    async def _child_argv(self, model: ResolvedModel, kind: EngineKind, *, instance_id: str, port: int,
                          socket: Path | None = None) -> tuple[list[str], str | None, Path | None]:
        """A whisper or piper child's argv, its key (written 0600 beside its pid file; None for a kind whose child
        checks none) and its working directory. What it opens stays inside the store."""
        app, name = self.app, model.name
        if socket is not None and len(os.fsencode(socket)) > MAX_SOCKET_PATH:
            raise EngineError(f"{name}'s child would listen on {socket}, a path of {len(os.fsencode(socket))} bytes: "
                              f"a Unix socket's path has at most {MAX_SOCKET_PATH}; give Blazar a home with a shorter "
                              "path (BLAZAR_HOME)")
        try:  # whisper opens its model's directory, piper its .onnx (and the .onnx.json beside it)
            first = inside(app.paths.models, model.path, what=f"the catalog's entry for {name}")
            opened = inside(app.paths.models, first.parent, what=f"the catalog's entry for {name}") \
                if kind.name == "whisper" else first
        except OutsideHome as e:
            raise await record_refusal(app, name, "untrusted_path", e.message, e) from None
        key_path = keyfile(app, instance_id)
        api_key = write_key(key_path) if kind.keyed else None
        scratch = scratchdir(app, instance_id)
        scratch.mkdir(mode=0o700, parents=True, exist_ok=True)
        launch = Launch(model=opened, port=port, key_file=key_path if kind.keyed else None,
                        threads=app.settings().engine.engine_threads or None, scratch=scratch, socket=socket)
        return kind.argv(launch), api_key, kind.cwd(launch)

    async def await_ready(self, lv: Live, report: LoadReport | None) -> Instance:
        """Wait for /health; record ready (or the reason it never was)."""
        await self.await_healthy(lv)
        return await self.mark_ready(lv, report)

    async def await_healthy(self, lv: Live) -> None:
        """Wait for /health (nothing is routed to the child yet); LoadFailed, recorded, when it never answers."""
        app, inst = self.app, lv.instance
        name, settings = inst.model, app.settings()
        try:
            waited = await process.wait_healthy(lv.proc, inst.port, timeout_s=settings.engine.load_timeout_s,
                                                path=engine_kind(inst.kind).probe_path,
                                                socket=Path(inst.socket) if inst.socket else None)
        except process.LoadTimeout as e:
            await self.stopper.terminate(lv, "load_timeout", detail=f"not healthy after {e.waited_s:.1f} s")
            raise LoadFailed(f"{name} did not become ready within {settings.engine.load_timeout_s:.0f} s "
                             "(engine.load_timeout_s); "
                             f"the engine log: {lv.log_path}",
                             public=f"{name} could not be loaded: it was not ready in time. Try again later; if it "
                                    f"keeps failing, {OWNER_SEES}") from None
        except process.ProcessExited:
            assert lv.watcher is not None
            await lv.watcher  # the watcher records the exit (load_failed, or stopped when a user stopped it)
            tail = process.log_tail(lv.log_path, 5)
            # NOTE: the engine's own words name the model's file, and a Python child's a traceback with the venv's
            # paths: the owner's (the CLI, `blazar why`, the daemon log), never a key's.
            raise LoadFailed(f"{name} exited while loading (code {lv.proc.returncode}): "
                             + (" | ".join(tail) or "no output") + f"; the engine log: {lv.log_path}",
                             public=f"{name} could not be loaded: its engine exited while loading (exit code "
                                    f"{lv.proc.returncode}). Try again later; if it keeps failing, {OWNER_SEES}"
                             ) from None
        if lv.state == "stopping":
            raise LoadFailed(f"{name} was stopped while it loaded")
        inst.load_ms = int(waited * 1000)

    async def mark_ready(self, lv: Live, report: LoadReport | None) -> Instance:
        """The healthy child serves from now on: recorded (`instance.ready`), its waiters woken."""
        app, inst, name = self.app, lv.instance, lv.instance.model
        if lv.state == "stopping":
            raise LoadFailed(f"{name} was stopped while it loaded")
        lv.state = "ready"
        lv.last_used = app.clock.now()
        if report is not None:
            report.cold, report.load_ms = True, inst.load_ms
        await app.record(InstanceReady(instance_id=inst.instance_id, model=name, load_ms=inst.load_ms or 0),
                         cause=lv.started_seq)
        if not lv.ready.done():
            lv.ready.set_result(inst)
        # The measurement reads the whole engine log and appends one more event: off the caller's path.
        self._background(self._measure(lv), f"blazar-measure-{inst.instance_id}")
        self.poke.set()
        return inst

    async def drain(self) -> None:
        """Wait for the background work started so far (memory measurements after loads)."""
        await asyncio.gather(*self.tasks, return_exceptions=True)

    def _background(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _measure(self, lv: Live) -> None:
        """Record what the engine allocated beside the plan, for the next plan of this model. An instance split
        across RPC workers is not measured: its log lists the workers' buffers (on other hosts) and its RSS only
        this host's, so neither compares with a local plan."""
        if plan_workers(lv.plan):
            return
        if lv.instance.kind != "llama-server":
            await self._measure_rss(lv)
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


    async def _measure_rss(self, lv: Live) -> None:
        """A whisper or piper child logs no buffers: its resident memory after the load is the measurement, charged
        when it is above its memory model's figure."""
        rss = process.rss_bytes(lv.proc.pid)
        if rss is None:
            return
        await self.app.record(InstanceMemoryMeasured(
            model=lv.instance.model, instance_id=lv.instance.instance_id, ctx_tokens=0, slots=lv.plan.slots,
            planned_bytes=lv.plan.estimate_bytes, measured_bytes=rss, rss_bytes=rss))


def draft_file(app: Blazar, name: str, posture: PostureChoice) -> Path | None:
    """The draft model's file a posture names (a model in the store), confined to the store like the model's own;
    ModelNotFound when it is not in the store."""
    tuned = posture.posture
    if tuned is None or not tuned.speculative or tuned.draft_model is None:
        return None
    what = f"the draft model {tuned.draft_model!r} of {name}'s profile.adopted (seq {posture.profile_seq})"
    got = stored(app.runner.state("catalog"), tuned.draft_model)
    if got is None:
        raise ModelNotFound(f"{what} is not in the store (blazar list shows what is; blazar tune {name} again)")
    return inside(app.paths.models, app.paths.models / got.file, what=what)


def _served(engine: ActiveEngine, model: ResolvedModel) -> ServedTemplate:
    """The template the instance runs, for its stop strings and default sampling: a template Blazar ships only when
    the engine took it (one without --chat-template-file keeps its own fallback)."""
    served = served_template(model.metadata, model.settings, model.template_probe)
    if served.source in ("probe", "architecture") and not engine.caps.has("--chat-template-file"):
        return ServedTemplate("fallback")
    return served


def _kv_identity(engine: ActiveEngine, model: ResolvedModel, fit: FitPlan) -> KvIdentity | None:
    """What a slot saved from this instance is valid for; None when the engine cannot save slots."""
    if not engine.caps.slot_save_path:
        return None
    return KvIdentity(engine=engine.tag, model_sha256=model.sha256, ctx_tokens=fit.ctx_per_slot,
                      cache_type_k=fit.cache_type_k, cache_type_v=fit.cache_type_v, swa_full=fit.swa_full)


def _mode_flags(engine: ActiveEngine, meta: ModelMetadata, *, embeddings: bool, rerank: bool) -> list[str]:
    """The flags of the instance's mode: rerank (llama-server's --reranking: its rerank endpoint, pooling by the
    model's classifier head; refused by an engine without it), embeddings, or neither."""
    if rerank:
        if not engine.caps.has("--reranking", "--rerank"):
            raise EngineIncompatible("--reranking", "rerank requests need it (a newer llama-server has it)")
        return ["--reranking"]
    return _embedding_flags(engine, meta) if embeddings else []


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


def _model_budget(model: ResolvedModel) -> int | None:
    """The model's thinking budget (`blazar model set --reasoning-budget`): its instance's load flag."""
    return model.settings.reasoning_budget if model.settings is not None else None
