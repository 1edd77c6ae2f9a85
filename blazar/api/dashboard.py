"""`GET /api/blazar/dashboard`: what `blazar watch` shows, as JSON, from the daemon's memory (the residency
projection, the supervisor's live slots, admission's queues and the request events this process commits). An
admin route like every /api/blazar/* one. The shape is documented in blazar/queries/dashboard.py."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING

import falcon
import falcon.asgi

from blazar.api.auth import Access
from blazar.api.routes import Op, Route
from blazar.api.schemas import INT, OBJ, obj
from blazar.context import Blazar
from blazar.events.base import Recorded
from blazar.queries.dashboard import REQUEST_TYPES, SEED_EVENTS, Activity, DaemonStatus, fold, read_recent, snapshot
from blazar.queries.metrics import queue_depth
from blazar.queries.prefix_clients import client_rows
from blazar.queries.ps import ps_rows
from blazar.serving.ports import SupervisorPort

if TYPE_CHECKING:
    from blazar.serving.gateway import Gateway

_FOLDED = frozenset(REQUEST_TYPES)
PREFIX_CLIENTS = 10  # the flagged clients the console lists at most (`blazar why --clients` has them all)


class DashboardFeed:
    """The request events this process commits, kept in a bounded buffer by the commit listener (one deque append
    per batch: nothing on the token path) and folded when a dashboard is asked for. The first ask reads the log's
    tail so the lists are not empty after a restart."""

    def __init__(self, app: Blazar) -> None:
        self.app = app
        self.activity = Activity()
        self._pending: deque[Recorded] = deque(maxlen=SEED_EVENTS)
        self._seeded = False
        self._lock = asyncio.Lock()
        self.unsubscribe = app.log.subscribe(self._on_commit)

    def _on_commit(self, batch: list[Recorded]) -> None:
        self._pending.extend(r for r in batch if r.type in _FOLDED)

    async def current(self) -> Activity:
        async with self._lock:
            if not self._seeded:
                # The buffer holds what was committed since the listener was set; seeding covers what came before.
                first = self._pending[0].seq - 1 if self._pending else None
                await read_recent(self.app.log, self.activity, upto=first)
                self._seeded = True
            while self._pending:
                fold(self.activity, self._pending.popleft())
            return self.activity


class DashboardResource:
    def __init__(self, app: Blazar, supervisor: SupervisorPort, gateway: Gateway | None) -> None:
        self.app, self.supervisor, self.gateway = app, supervisor, gateway
        self.feed = DashboardFeed(app)

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        activity = await self.feed.current()
        now = self.app.clock.now()
        if self.gateway is not None:
            live = self.gateway.admission.snapshot()
            queues = {m: int(s.get("queued", 0)) for m, s in live.items() if not m.startswith("_")}
            rows = self.supervisor.ps()
        else:  # an admin-only app (tests): the log's figures
            queues = queue_depth(self.app)
            rows = [r.to_json() for r in ps_rows(self.app, now=now)]
        dash = snapshot(activity, rows=rows, now=now, daemon=DaemonStatus(up=True, url=req.prefix), queues=queues,
                        live_rows=self.gateway is not None,
                        prefix_clients=client_rows(self.app.runner.state("prefix"), only_flagged=True,
                                                   limit=PREFIX_CLIENTS))
        resp.media = dash.model_dump(mode="json")


_ROWS = {"type": "array", "items": OBJ}
ROUTES = (
    Route("/api/blazar/dashboard", Access.ADMIN, lambda d: DashboardResource(d.app, d.supervisor, d.gateway_or_none),
          needs_gateway=False, ops={"get": Op(
              "What `blazar watch` shows (its shape: blazar/queries/dashboard.py)",
              obj(["version", "at", "seq", "instances", "queues", "tokens_per_s", "requests", "failures"],
                  version=INT, seq=INT, instances=_ROWS, requests=_ROWS, failures=_ROWS, queues=OBJ,
                  tokens_per_s=OBJ, prefix_clients=_ROWS))}),
)
