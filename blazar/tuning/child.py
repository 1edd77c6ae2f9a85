"""A private llama-server for measuring a model at one posture (blazar/tuning/measure.py, the tuner, the engine gate):
planned like a daemon's instance (fit_model with the posture pinned), started with the posture's flags and its own
key on a free loopback port, never registered with the daemon's supervisor and never recorded as an instance. On
exit its process group is stopped and its scratch directory (key file, engine log) removed.

    async with engine_child(app, "gemma", Posture(spec_type="ngram-simple")) as child:
        ... child.base_url, child.api_key, child.metrics(), child.peak_rss_bytes()
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import secrets
import shutil
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx2

from blazar.adapters.engines import process
from blazar.adapters.engines.llama_server import build_argv, engine_key, redact_argv
from blazar.adapters.engines.posture import posture_flags
from blazar.confine import inside
from blazar.context import Blazar
from blazar.errors import DoesNotFit, EngineError, LoadFailed, ModelNotFound, WrongModelKind
from blazar.events.tuning import Posture
from blazar.fit import FitPlan, FitRequest
from blazar.fit.posture import with_posture
from blazar.instances.planning import fit_model
from blazar.projections.catalog import StoredModel, stored
from blazar.store.chat_templates import served_settings
from blazar.store.engine_verify import verify_for_spawn
from blazar.store.engines import ActiveEngine, active_engine
from blazar.store.model_settings import template_flags

STOP_GRACE_S = 5.0


@dataclass
class EngineChild:
    """A running private engine: where it listens, its key, what it was started with."""

    model: str  # the store's name (the engine's --alias where it has one)
    posture: Posture
    engine: ActiveEngine
    plan: FitPlan
    argv: list[str]  # redacted (no key value)
    base_url: str
    api_key: str | None
    pid: int
    log_path: Path
    proc: asyncio.subprocess.Process

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def peak_rss_bytes(self) -> int | None:
        """The child's peak resident memory so far (VmHWM); None once it is gone."""
        return _status_bytes(self.pid, "VmHWM:")

    async def metrics(self) -> dict[str, float]:
        """The engine's /metrics, parsed: {"llamacpp:tokens_predicted_total": 40.0, ...}; a labelled series keeps
        its labels in the name (`...per_pos_total{position="0"}`)."""
        async with httpx2.AsyncClient(trust_env=False, timeout=10.0) as client:
            resp = await client.get(f"{self.base_url}/metrics", headers=self.headers)
        if resp.status_code != 200:
            raise EngineError(f"the bench child's /metrics answered {resp.status_code}: {resp.text[:200]}")
        return parse_metrics(resp.text)

    def log_tail(self, lines: int = 12) -> list[str]:
        return process.log_tail(self.log_path, lines)


_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*(?:\{[^}]*\})?)\s+(\S+)")


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text exposition to {series: value}; comments, blank lines and unparsable values are skipped (an
    engine's odd line must not fail a measurement of everything else)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line.strip())
        if m is None:
            continue
        try:
            out[m.group(1)] = float(m.group(2))
        except ValueError:
            continue
    return out


def _status_bytes(pid: int, field: str) -> int | None:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    for line in text.splitlines():
        if line.startswith(field):
            value, *unit = line.split()[1:3]
            return int(value) * 1024 if unit == ["kB"] else int(value)
    return None


def resolve_model(app: Blazar, name: str) -> StoredModel:
    """The store's llama-server model `name`; ModelNotFound for a missing one, WrongModelKind for a whisper or piper
    model (there is nothing of llama-server's to measure)."""
    got = stored(app.runner.state("catalog"), name)
    if got is None:
        raise ModelNotFound(f"no model named {name!r} in the store (blazar list shows them; blazar pull adds one)")
    if got.kind != "llama-server":
        raise WrongModelKind(f"{got.name} is a {got.kind} model: bench and tune measure llama-server models only")
    return got


async def plan_child(app: Blazar, model: StoredModel, posture: Posture, *, ctx: int | None,
                     slots: int | None) -> FitPlan:
    """The fit a daemon's load would make (its settings' context and slots), with the posture's fields pinned.
    `slots` (the bench's concurrency) applies where the posture pins none."""
    s = app.settings()
    request = FitRequest(ctx=ctx or s.fit.ctx or None, slots=slots or s.fit.slots or None)
    plan = await fit_model(app, model.name, with_posture(request, posture))
    if not plan.fits:
        raise DoesNotFit(f"{model.name} at {posture.label()} does not fit: {plan.summary}")
    return plan


@contextlib.asynccontextmanager
async def engine_child(app: Blazar, model: str, posture: Posture, *, engine: ActiveEngine | None = None,
                       ctx: int | None = None, slots: int | None = None,
                       timeout_s: float | None = None) -> AsyncIterator[EngineChild]:
    """A private llama-server for `model` at `posture` on `engine` (the active one by default), healthy on entry,
    stopped (its process group) and cleaned up on exit. LoadFailed carries the engine log's tail."""
    got = resolve_model(app, model)
    engine = engine or active_engine(app)
    await asyncio.to_thread(verify_for_spawn, app.paths.engines, engine.tag, engine.files)
    plan = await plan_child(app, got, posture, ctx=ctx, slots=slots)
    scratch = app.paths.run / "bench" / f"{os.getpid()}-{secrets.token_hex(4)}"
    scratch.mkdir(mode=0o700, parents=True, exist_ok=True)
    proc: asyncio.subprocess.Process | None = None
    try:
        argv, api_key = _argv(app, got, posture, engine, plan, scratch, port := process.free_port())
        log_path = scratch / "engine.log"
        proc = await process.spawn(argv, log_path=log_path, env=process.child_env(app.env))
        limit = timeout_s if timeout_s is not None else app.settings().engine.load_timeout_s
        try:
            await process.wait_healthy(proc, port, timeout_s=limit)
        except process.LoadTimeout:
            raise LoadFailed(_failure(f"{got.name} at {posture.label()} was not healthy within {limit:.0f} s",
                                       log_path)) from None
        except process.ProcessExited:
            raise LoadFailed(_failure(f"{got.name} at {posture.label()} {process.describe_exit(proc.returncode)} "
                                       "while loading", log_path)) from None
        yield EngineChild(model=got.name, posture=posture, engine=engine, plan=plan, argv=redact_argv(argv),
                          base_url=f"http://127.0.0.1:{port}", api_key=api_key, pid=proc.pid, log_path=log_path,
                          proc=proc)
    finally:
        if proc is not None:
            await _stop_group(proc)
        shutil.rmtree(scratch, ignore_errors=True)


def _argv(app: Blazar, model: StoredModel, posture: Posture, engine: ActiveEngine, plan: FitPlan, scratch: Path,
          port: int) -> tuple[list[str], str | None]:
    """The daemon's argv for this plan (blazar/instances/spawn.py) plus the posture's speculation flags; the model
    file and any draft model confined to the store. No slot save path: a bench child keeps nothing."""
    model_file = inside(app.paths.models, app.paths.models / model.file, what=f"the catalog's entry for {model.name}")
    draft = None
    if posture.draft_model is not None:
        d = resolve_model(app, posture.draft_model)
        draft = inside(app.paths.models, app.paths.models / d.file,
                       what=f"the catalog's entry for {d.name} (the posture's draft model)")
    api_key, key_flags = engine_key(engine.caps, scratch / "engine.key")
    probed = model.template_probe.chosen if model.template_probe is not None else None
    served = served_settings(model.metadata, model.settings, probed,
                             jinja_files=engine.caps.has("--chat-template-file"))
    alias = ["--alias", model.name] if engine.caps.has("--alias") else []
    argv = build_argv(engine.binary, model_file, plan, engine.caps, port=port,
                      threads=posture.threads or app.settings().engine.engine_threads or None,
                      extra=[*key_flags, *alias,
                             *template_flags(engine.caps, served, app.paths.data_dir / "templates"),
                             *posture_flags(engine.caps, posture, draft)])
    return argv, api_key


# A crashed engine ends its log with the debugger's backtrace (frames, thread lines, missing-source notes): the
# assertion or error before it is what says why.
_BACKTRACE = re.compile(r"^(#\d+\s|\d+\s|\[|0x[0-9a-f]+ in |Using host libthread_db)")


def _failure(what: str, log_path: Path) -> str:
    tail = [line for line in process.log_tail(log_path, 400) if line.strip() and not _BACKTRACE.match(line)][-6:]
    return what + (": " + " | ".join(tail) if tail else " (the engine wrote nothing)")


async def _stop_group(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM the child's whole process group (spawn starts a new session: the group is the child's own), then
    SIGKILL after the grace. NOTE: only while the leader is unreaped: once reaped its pid (the group's id) may be
    another's."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), timeout=STOP_GRACE_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await asyncio.wait_for(proc.wait(), timeout=process.KILL_WAIT_S)
