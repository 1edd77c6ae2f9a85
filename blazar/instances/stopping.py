"""How the supervisor's children end, each end recorded: an eviction (a decision, `instance.evicted` with what it
relied on) saves the child's sessions to the KV bank and stops it; a stop is SIGTERM, grace, SIGKILL; every exit is
`instance.exited` with its reason and log tail, and a crash may open the model's circuit. The watcher notices an
exit nobody asked for."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from typing import TYPE_CHECKING, Any, Literal

from blazar.adapters.engines import process
from blazar.context import Blazar
from blazar.errors import LoadFailed
from blazar.events.instances import ExitReason, InstanceEvicted, InstanceExited
from blazar.events.requests import Evicted
from blazar.events.sessions import SaveReason
from blazar.instances.live import Live, LiveSet, LoadReport, keyfile, pidfile, scratchdir, socketfile
from blazar.instances.load_checks import open_circuit_if_due

if TYPE_CHECKING:
    from blazar.instances.kv_bank import KvBank

log = logging.getLogger("blazar.supervisor")

EvictionReason = Literal["idle", "max_loaded_models", "memory", "reshape"]

LOG_TAIL_LINES = 20


class Stopper:
    """Stops the children in `live` and records why; `poke` wakes the idle reaper when one is gone."""

    def __init__(self, app: Blazar, live: LiveSet, kv_bank: KvBank | None, poke: asyncio.Event) -> None:
        self.app = app
        self.live = live
        self.kv_bank = kv_bank
        self.poke = poke
        # Exits dropped from `live` whose `instance.exited` is still being written: `gone` waits for one, so a
        # caller told "gone" finds the exit in the log (and the residency without the instance).
        self._recording: dict[str, asyncio.Event] = {}

    async def evict(self, lv: Live, reason: EvictionReason, *, for_model: str | None = None,
                    observations: dict[str, Any] | None = None, report: LoadReport | None = None) -> None:
        if lv.state == "stopping":
            return  # already going (the reaper and a load may pick the same victim)
        lv.state = "stopping"
        if report is not None:
            report.evicted.append(Evicted(model=lv.instance.model, instance_id=lv.instance.instance_id, reason=reason))
        idle = max(0.0, self.app.clock.now() - lv.last_used) if lv.last_used else 0.0
        await self.save_sessions(lv, "evicted")
        measured = self.live.measured(self.app.runner.state("residency")).get(lv.instance.instance_id)
        (ev,) = await self.app.record(InstanceEvicted(
            instance_id=lv.instance.instance_id, model=lv.instance.model, reason=reason, for_model=for_model,
            idle_s=round(idle, 3), bytes_freed=lv.charged_bytes(measured),
            observations=observations or {}), cause=lv.started_seq)
        await self.terminate(lv, "evicted", cause=ev.seq)

    async def save_sessions(self, lv: Live, reason: SaveReason) -> None:
        """Save the slots of `lv` that hold sessions to the KV bank before its child goes (bounded per slot by
        session_save_timeout_s); a failure is recorded and never stops the stop."""
        if self.kv_bank is None or lv.exit_recorded or lv.proc.returncode is not None:
            return
        try:
            await self.kv_bank.save_instance(lv.instance, reason)
        except Exception:
            log.exception("saving the sessions of %s failed", lv.instance.instance_id)

    async def terminate(self, lv: Live, reason: ExitReason, *, detail: str = "", cause: int | None = None) -> None:
        """Stop the child (SIGTERM, grace, SIGKILL) and record its exit with `reason`."""
        if lv.state == "stopping" and lv.exit_recorded:
            return
        lv.state = "stopping"
        code = await process.stop_process(lv.proc, grace_s=self.app.settings().engine.stop_grace_s)
        if lv.watcher is not None and lv.watcher is not asyncio.current_task():
            with contextlib.suppress(asyncio.CancelledError):
                await lv.watcher
        await self.record_exit(lv, reason, code, detail=detail, cause=cause)

    async def record_exit(self, lv: Live, reason: ExitReason, code: int | None, *, detail: str = "",
                          cause: int | None = None) -> None:
        if lv.exit_recorded:
            return
        lv.exit_recorded = True
        written = self._recording[lv.instance.instance_id] = asyncio.Event()
        try:
            await self._record_exit(lv, reason, code, detail, cause)
        finally:
            written.set()
            self._recording.pop(lv.instance.instance_id, None)

    async def recorded(self, instance_id: str, timeout_s: float) -> None:
        """Wait (at most `timeout_s`) for the exit of `instance_id` being recorded now, if one is."""
        written = self._recording.get(instance_id)
        if written is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(written.wait(), timeout_s)

    async def _record_exit(self, lv: Live, reason: ExitReason, code: int | None, detail: str,
                           cause: int | None) -> None:
        self.live.drop(lv)
        if self.kv_bank is not None:
            self.kv_bank.forget(lv.instance.instance_id)
        uptime = int((self.app.clock.monotonic() - lv.started_mono) * 1000)
        tail = process.log_tail(lv.log_path, LOG_TAIL_LINES)
        await self.app.record(InstanceExited(
            instance_id=lv.instance.instance_id, model=lv.instance.model, reason=reason, exit_code=code,
            uptime_ms=uptime, log_tail=tail, detail=detail), cause=cause or lv.started_seq)
        pidfile(self.app, lv.instance.instance_id).unlink(missing_ok=True)
        keyfile(self.app, lv.instance.instance_id).unlink(missing_ok=True)
        socketfile(self.app, lv.instance.instance_id).unlink(missing_ok=True)
        shutil.rmtree(scratchdir(self.app, lv.instance.instance_id), ignore_errors=True)
        if not lv.ready.done():
            lv.ready.set_exception(LoadFailed(f"{lv.instance.model} exited ({reason})"))
            lv.ready.exception()
        if reason in ("crashed", "load_failed", "load_timeout"):
            await open_circuit_if_due(self.app, lv.instance.model, code)
        self.poke.set()

    async def watch(self, lv: Live) -> None:
        """Wait for the child to exit; an exit nobody asked for is a crash (or a failed load)."""
        code = await lv.proc.wait()
        if lv.state == "stopping":
            return  # terminate records it, with the reason it was stopped for
        reason: ExitReason = "load_failed" if lv.state == "starting" else "crashed"
        lv.state = "stopping"
        await self.record_exit(lv, reason, code, detail=f"exited on its own with code {code}")
