"""Operational routes: `/ready` (can the gateway admit, load, generate and record right now?), `/metrics` (Prometheus
text, derived from projections plus the live admission figures), `/api/blazar/queue` (depth per model) and `/health`.

NOTE: `/health` (here too) stays a liveness probe: 200 while the process answers, even with events held in
memory, because restarting the daemon then would lose them. `/ready` is the one that says degraded."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import falcon
import falcon.asgi

from blazar.api.auth import Access
from blazar.api.routes import Op, Route
from blazar.api.schemas import JSON, OBJ, TEXT, obj
from blazar.context import Blazar
from blazar.errors import EngineError, EngineVerifyFailed
from blazar.queries.log_writer import writer_check
from blazar.queries.metrics import daemon_families, prometheus_text
from blazar.serving.gateway import Gateway
from blazar.store.engines import active_engine, prove_generates

# A passed generation proves readiness for this long; a failed one is retried at the next probe.
READY_PROOF_TTL_S = 30.0
READY_SMOKE_TIMEOUT_S = 30.0


class Ready:
    """Ready means: an engine is active and this machine can start it on a model and get tokens (the smoke model,
    proven at most READY_PROOF_TTL_S ago), admission is not refusing everything, and request events reach the log
    (none held in memory that a commit could not write: a full disk, the database away). Not only that we listen."""

    def __init__(self, app: Blazar, gateway: Gateway) -> None:
        self.app = app
        self.gateway = gateway
        self._proven_at = 0.0
        self._lock = asyncio.Lock()

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        checks: dict[str, Any] = {}
        ok = True
        try:
            engine = active_engine(self.app)
            checks["engine"] = {"ok": True, "tag": engine.tag}
        except EngineError as e:
            checks["engine"] = {"ok": False, "detail": e.message}
            ok = False
        if ok:
            async with self._lock:
                if time.monotonic() - self._proven_at > READY_PROOF_TTL_S:
                    try:
                        result = await prove_generates(self.app, engine, timeout_s=READY_SMOKE_TIMEOUT_S)
                    except EngineVerifyFailed as e:  # its files changed since install: never run
                        checks["generate"] = {"ok": False, "detail": e.message}
                        ok = False
                    else:
                        checks["generate"] = {"ok": result.passed, "tokens": result.tokens,
                                              "duration_ms": result.duration_ms, "detail": result.detail}
                        ok = result.passed
                        if result.passed:
                            self._proven_at = time.monotonic()
                else:
                    checks["generate"] = {"ok": True, "proven_s_ago": round(time.monotonic() - self._proven_at, 1)}
        snap = self.gateway.admission.snapshot()
        glob = snap.get("_global", {})
        cap, busy = glob.get("cap") or 0, glob.get("busy") or 0
        checks["admission"] = {"ok": not cap or busy < cap, "busy": busy, "cap": cap}
        ok = ok and checks["admission"]["ok"]
        checks["log"] = writer_check(self.app.writer, self.app.paths.data_dir, now_monotonic=self.app.clock.monotonic())
        ok = ok and checks["log"]["ok"]
        resp.status = 200 if ok else 503
        resp.media = {"status": "ready" if ok else "not_ready", "checks": checks}


class Metrics:
    def __init__(self, app: Blazar, gateway: Gateway) -> None:
        self.app = app
        self.gateway = gateway

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        text = prometheus_text(daemon_families(self.app, self.gateway.admission.snapshot()))
        resp.content_type = "text/plain; version=0.0.4; charset=utf-8"
        resp.text = text


class Queue:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.media = {"queues": self.gateway.admission.snapshot()}


class Health:
    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.media = {"status": "ok"}


_READINESS = obj(["status", "checks"], status={"const": "ready"}, checks=OBJ)
ROUTES = (
    Route("/health", Access.OPEN, lambda d: Health(), needs_gateway=False, ops={"get": Op(
        "The listener is up", obj(["status"], status={"const": "ok"}))}),
    Route("/ready", Access.ADMIN, lambda d: Ready(d.app, d.gateway), {"get": Op(
        "Can the gateway admit, load and generate now (a smoke generation)", _READINESS,
        responses={503: {"description": "not ready: the failing check says why", "content": {JSON: {
            "schema": {**_READINESS, "properties": {"status": {"const": "not_ready"}, "checks": OBJ}}}}}})}),
    Route("/metrics", Access.ADMIN, lambda d: Metrics(d.app, d.gateway), {"get": Op(
        "Prometheus text", ok_types=(TEXT,))}),
    Route("/api/blazar/queue", Access.ADMIN, lambda d: Queue(d.gateway), {"get": Op(
        "Admission per model", obj(["queues"], queues=OBJ))}),
)
