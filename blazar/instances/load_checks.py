"""What may stop a load before any room is made, and how a refusal is recorded: a model's crash circuit (opened after
repeated crashes, closed by time or `blazar ps --reset`), the restart backoff after a crash, the active engine and its
files verified before each spawn. A refusal is a decision: `instance.load_refused` is recorded, then its error raised.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Literal

from blazar.adapters.engines.kinds import engine_kind
from blazar.context import Blazar
from blazar.errors import BlazarError, CircuitOpen, EngineError, EngineExtraMissing, EngineVerifyFailed
from blazar.events.instances import InstanceLoadRefused, ModelCircuitOpened, ModelCircuitReset
from blazar.instances.decide import decide_circuit
from blazar.projections.residency import circuit, recent_crashes
from blazar.store.engine_verify import verify_for_spawn
from blazar.store.engines import ActiveEngine

log = logging.getLogger("blazar.supervisor")

RefusalReason = Literal["does_not_fit", "circuit_open", "no_engine", "no_room", "engine_incompatible",
                        "engine_unverified", "untrusted_path", "extra_missing", "draft_missing"]

# Restart backoff after a crash: 0.5 s doubling per crash in the window, at most this.
BACKOFF_MAX_S = 10.0


async def record_refusal(app: Blazar, model: str, reason: RefusalReason, detail: str,
                         exc: type[BlazarError] | BlazarError,
                         observations: dict[str, Any] | None = None) -> BlazarError:
    """Record the refusal (a decision), then hand back the error to raise: `exc` itself when it is one."""
    await app.record(InstanceLoadRefused(model=model, reason=reason, detail=detail, observations=observations or {}))
    return exc if isinstance(exc, BlazarError) else exc(detail)


def restart_delay(crash_ts: list[float], now: float, *, window_s: float) -> float:
    """Seconds to wait before starting a model that crashed: 0.5 s doubling per crash in the window, from the
    last crash, at most BACKOFF_MAX_S."""
    recent = [t for t in crash_ts if now - t <= window_s]
    if not recent:
        return 0.0
    delay = min(BACKOFF_MAX_S, 0.5 * 2 ** (len(recent) - 1))
    return max(0.0, delay - (now - recent[-1]))


async def check_load(app: Blazar, engine_of: Callable[[Blazar], ActiveEngine], name: str,
                     kind: str = "llama-server") -> ActiveEngine | None:
    """The engine to start `name` with (None for a whisper or piper model: its runtime is Python's). Refuses
    (recorded) while the model's crash circuit is open, or no engine is active or its files changed, or a speech
    kind's extra is not installed; after a recent crash, waits out the restart backoff."""
    now = app.clock.now()
    settings = app.settings()
    residency = app.runner.state("residency")
    opened = circuit(residency, name, now)
    if opened is not None:
        until = opened.open_until
        raise await record_refusal(
            app, name, "circuit_open",
            f"{name} crashed {opened.crashes} times within {settings.engine.crash_window_s:.0f} s; loads are refused "
            f"for {until - now:.0f} s more "
            f"or until `blazar ps --reset {name}`", CircuitOpen, {"open_until": until})
    engine: ActiveEngine | None = None
    try:
        engine_kind(kind).check_runtime()
    except EngineExtraMissing as e:
        raise await record_refusal(app, name, "extra_missing", e.message, e, {"kind": kind}) from None
    try:
        if kind == "llama-server":
            engine = engine_of(app)
            # NOTE: before every spawn, not only at activation: a file changed since is never executed. Hashed in a
            # thread, and only when a file's (inode, size, mtime, ctime) changed since it was last hashed.
            await asyncio.to_thread(verify_for_spawn, app.paths.engines, engine.tag, engine.files)
    except EngineVerifyFailed as e:
        raise await record_refusal(app, name, "engine_unverified", e.message, e,
                                   {"engine": e.tag, "problems": e.problems}) from None
    except EngineError as e:
        raise await record_refusal(app, name, "no_engine", e.message, e) from None
    delay = restart_delay(recent_crashes(residency, name), now, window_s=settings.engine.crash_window_s)
    if delay > 0:
        log.info("%s crashed recently; waiting %.1f s before restarting it", name, delay)
        await asyncio.sleep(delay)
    return engine


async def open_circuit_if_due(app: Blazar, model: str, code: int | None) -> None:
    """After a crash or a failed load: open `model`'s circuit when crash_limit crashes fell within crash_window_s."""
    settings = app.settings()
    now = app.clock.now()
    residency = app.runner.state("residency")
    crashes = recent_crashes(residency, model)
    if circuit(residency, model, now) is None and decide_circuit(
            crashes, now, limit=settings.engine.crash_limit, window_s=settings.engine.crash_window_s):
        n = sum(1 for t in crashes if now - t <= settings.engine.crash_window_s)
        await app.record(ModelCircuitOpened(model=model, crashes=n, window_s=settings.engine.crash_window_s,
                                            open_until=now + settings.engine.circuit_open_s, last_exit_code=code))


async def reset_circuit(app: Blazar, model: str) -> bool:
    """Close `model`'s circuit (`blazar ps --reset`): True when one was open. Works with or without a daemon:
    the daemon's projections follow the log."""
    await app.runner.catch_up()
    if circuit(app.runner.state("residency"), model, app.clock.now()) is None:
        return False
    await app.record(ModelCircuitReset(model=model))
    return True
