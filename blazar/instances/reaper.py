"""The idle reaper: evicts the children whose keep-alive has run out (decide_idle picks them) and sleeps until the
next one is due. A request that ends or a child that comes or goes pokes it awake; it also wakes every
REAPER_MAX_SLEEP_S to notice a settings change."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from blazar.context import Blazar
from blazar.instances import decide
from blazar.instances.live import Live, LiveSet
from blazar.instances.stopping import Stopper

if TYPE_CHECKING:
    from blazar.instances.kv_bank import KvBank

log = logging.getLogger("blazar.supervisor")

REAPER_MAX_SLEEP_S = 30.0


class Reaper:
    def __init__(self, app: Blazar, live: LiveSet, kv_bank: KvBank | None, stopper: Stopper,
                 poke: asyncio.Event) -> None:
        self.app = app
        self.live = live
        self.kv_bank = kv_bank
        self.stopper = stopper
        self.poke = poke
        self.due: float | None = None  # the loop time it next wakes at (None: it is awake)
        self.closed = False

    async def reap_once(self) -> float | None:
        """Evict instances whose keep-alive has run out; returns seconds until the next one is due (None: none)."""
        now = self.app.clock.now()
        views = [decide.IdleView(instance_id=lv.instance.instance_id, idle_s=max(0.0, now - lv.last_used),
                                 in_flight=lv.in_flight, pinned=lv.pinned, keep_alive_s=self.idle_keep_s(lv))
                 for lv in self.live if lv.state == "ready"]
        due = decide.decide_idle(views, now)
        for iid, idle_s in due:
            lv = self.live.get(iid)
            if lv is not None:
                # idle_keep_s: what it was allowed, its keep-alive or longer while a slot held a session
                await self.stopper.evict(lv, "idle", observations={"idle_s": round(idle_s, 3),
                                                                   "keep_alive_s": lv.keep_alive_s,
                                                                   "idle_keep_s": self.idle_keep_s(lv)})
        remaining = [v for v in views if v.instance_id not in {i for i, _ in due}]
        return decide.next_wakeup(remaining, now)

    def idle_keep_s(self, lv: Live) -> float | None:
        """How long `lv` may sit idle: its keep-alive, or longer while one of its slots holds a session (a session
        pins its model against idle eviction for session_keep_s; memory pressure still evicts it)."""
        if self.kv_bank is None or lv.keep_alive_s is None or self.kv_bank.last_session_use(
                lv.instance.instance_id) is None:
            return lv.keep_alive_s
        return max(lv.keep_alive_s, self.app.settings().sessions.session_keep_s)

    def wake_for(self, lv: Live) -> None:
        """Wake the reaper only when `lv` now runs out before its next wake-up: a request that ends moves its
        instance's deadline later, so on the common path the reaper sleeps on (it re-reads every deadline when it
        wakes)."""
        if lv.in_flight or lv.pinned or lv.keep_alive_s is None:
            return
        due = asyncio.get_running_loop().time() + max(0.0, lv.keep_alive_s)
        if self.due is None or due < self.due:
            self.poke.set()

    async def run(self) -> None:
        """Reap until `closed` (or the task is cancelled)."""
        while not self.closed:
            try:
                wait = await self.reap_once()
            except Exception:
                log.exception("idle reaper")
                wait = 1.0
            self.poke.clear()
            timeout = REAPER_MAX_SLEEP_S if wait is None else min(REAPER_MAX_SLEEP_S, max(0.05, wait))
            self.due = asyncio.get_running_loop().time() + timeout
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self.poke.wait()
            self.due = None
