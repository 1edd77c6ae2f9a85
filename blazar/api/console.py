"""The web console at /console: one HTML page, its stylesheet and ES module (blazar/api/console_static/, no build
step), served with a strict Content-Security-Policy; and the read routes it needs beyond the admin API's: the event
log (a tail, and a live server-sent-events follow in console_follow.py), a trace's `why`, the model store with each
model's fit on this machine, and the engines with their verify status (and a verify action).

The page and its files hold no secret, so they are open like /health (`ROUTES` below); everything they call is an
admin route that needs an admin key once keys exist. The page sends that key as `Authorization: Bearer`.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import falcon
import falcon.asgi
from pydantic import BaseModel, ConfigDict, Field, StrictStr

from blazar.api import console_follow
from blazar.api.auth import Access
from blazar.api.bounds import MAX_NAME_CHARS
from blazar.api.console_follow import MAX_SEQ, event_json, query_params
from blazar.api.routes import Op, Route
from blazar.api.schemas import BOOL, INT, NULLABLE_STR, OBJ, SSE, STR, Schema, obj
from blazar.context import Blazar
from blazar.errors import BlazarError, EngineVerifyFailed, TraceNotFound
from blazar.fit import FitRequest
from blazar.instances.planning import devices_now, fit_model
from blazar.queries.catalog import aliases, models
from blazar.queries.engines import active_tag, engine, engine_json, installed_engines
from blazar.queries.event_tail import tail
from blazar.queries.nodes import where
from blazar.queries.traces import last_failed
from blazar.queries.why import resolve_trace
from blazar.queries.why_turn import load_story
from blazar.serving.ports import SupervisorPort
from blazar.store.engines import verify_engine

STATIC_DIR = Path(__file__).with_name("console_static")
PAGE = "index.html"
CONTENT_TYPES = {".html": "text/html; charset=utf-8", ".css": "text/css; charset=utf-8",
                 ".js": "text/javascript; charset=utf-8", ".png": "image/png"}
# NOTE: no 'unsafe-inline' anywhere: the page has no inline script, style or event-handler attribute, and renders
# every value with textContent, so a model name or an error text from the log can never run as code.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
SECURITY_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
                    "Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY",
                    "Cross-Origin-Opener-Policy": "same-origin", "Cross-Origin-Resource-Policy": "same-origin"}
_STATIC_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_TRACE = re.compile(r"[A-Za-z0-9._-]{1,64}")
EVENTS_LIMIT = 500
MODELS_SHOWN = 500  # the store listing is bounded like every other answer


@dataclass(frozen=True)
class StaticFile:
    body: bytes
    content_type: str
    etag: str


@cache
def static_file(name: str) -> StaticFile | None:
    """A file of the console (read once; the package's files do not change under a running daemon)."""
    path = STATIC_DIR / name
    suffix = path.suffix.lower()
    if not _STATIC_NAME.fullmatch(name) or suffix not in CONTENT_TYPES or not path.is_file():
        return None
    body = path.read_bytes()
    return StaticFile(body=body, content_type=CONTENT_TYPES[suffix], etag=hashlib.sha256(body).hexdigest()[:32])


def secure(resp: falcon.asgi.Response) -> None:
    for name, value in SECURITY_HEADERS.items():
        resp.set_header(name, value)


def _serve(req: falcon.asgi.Request, resp: falcon.asgi.Response, name: str) -> None:
    found = static_file(name)
    if found is None:
        raise falcon.HTTPNotFound(description=f"no console file {name[:64]!r}")
    secure(resp)
    # Revalidated on every load (an upgraded daemon serves new files at the same names), answered 304 when unchanged.
    resp.cache_control = ["no-cache"]
    resp.etag = found.etag
    if req.get_header("If-None-Match") == f'"{found.etag}"':
        resp.status = 304
        return
    resp.content_type = found.content_type
    resp.data = found.body


class Page:
    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        _serve(req, resp, PAGE)


class Static:
    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, name: str) -> None:
        _serve(req, resp, name)


class EventsQuery(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    type: list[StrictStr] = Field(default_factory=list, max_length=32)
    stream: StrictStr | None = Field(None, min_length=1, max_length=MAX_NAME_CHARS)
    trace: StrictStr | None = Field(None, min_length=1, max_length=64)
    before: int | None = Field(None, ge=0, le=MAX_SEQ)
    limit: int = Field(200, ge=1, le=EVENTS_LIMIT)


class Events:
    """GET /api/blazar/events: the newest events matching the filters, oldest first, and the log's last seq (where
    the live follow starts)."""

    def __init__(self, app: Blazar) -> None:
        self.app = app

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        q = EventsQuery.model_validate(query_params(req))
        last = await self.app.log.last_seq()
        rows = await tail(self.app.log, limit=q.limit, types=q.type, stream=q.stream, trace_id=q.trace,
                          before=last if q.before is None else min(q.before, last))
        resp.media = {"events": [event_json(r) for r in rows], "last_seq": last}


class Why:
    """GET /api/blazar/why/{trace}: `blazar why --json` (a full trace id, a unique prefix, or `last` for the last
    request that failed or was rejected)."""

    def __init__(self, app: Blazar) -> None:
        self.app = app

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, trace: str) -> None:
        if trace == "last":
            found = last_failed(self.app)
            if found is None:
                raise TraceNotFound("no request has failed or been rejected yet")
            trace = found
        if not _TRACE.fullmatch(trace):
            raise TraceNotFound(f"{trace[:64]!r} is not a trace id (the x-blazar-trace-id response header)")
        trace_id = await resolve_trace(self.app.log, trace)
        resp.media = (await load_story(self.app.log, trace_id)).to_json()


def _fit_json(plan: Any) -> dict[str, Any]:
    return {"fits": plan.fits, "summary": plan.summary, "ctx_per_slot": plan.ctx_per_slot, "slots": plan.slots,
            "total_bytes": plan.total_bytes, "cache_type_k": plan.cache_type_k, "cache_type_v": plan.cache_type_v,
            "gpu_layers": plan.gpu_layers, "offloadable_layers": plan.offloadable_layers,
            "devices": [{"key": d.key, "total_bytes": d.total_bytes, "budget_bytes": d.budget_bytes}
                        for d in plan.devices]}


class Models:
    """GET /api/blazar/models: the store, each model with what is loaded of it and its fit on this machine now
    (planned as a load would be: the ctx and slots settings, the devices' free memory, the calibration)."""

    def __init__(self, app: Blazar, supervisor: SupervisorPort) -> None:
        self.app, self.supervisor = app, supervisor

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        settings = self.app.settings()
        request = FitRequest(ctx=settings.fit.ctx or None, slots=settings.fit.slots or None)
        devices = await asyncio.to_thread(devices_now)
        loaded: dict[str, list[dict[str, Any]]] = {}
        for row in self.supervisor.ps():
            loaded.setdefault(row["model"], []).append({"instance_id": row["instance_id"], "state": row["state"],
                                                        "pinned": row["pinned"], "kind": row.get("kind")})
        rows = []
        for m in models(self.app)[:MODELS_SHOWN]:
            md = m.metadata
            try:
                fit: dict[str, Any] = _fit_json(await fit_model(self.app, m.name, request, devices))
            except BlazarError as e:  # a file that no longer reads: said on its row, the rest still listed
                fit = {"fits": False, "summary": e.message, "error": e.code}
            rows.append({"name": m.name, "kind": m.kind, "bytes": m.bytes, "sha256": m.sha256, "source": m.source,
                         "added_ts": m.added_ts, "architecture": md.architecture,
                         "parameter_count": md.parameter_count, "file_type": md.file_type, "ctx_train": md.ctx_train,
                         "instances": loaded.get(m.name, []), "fit": fit})
        resp.media = {"models": rows, "aliases": aliases(self.app)}


class Engines:
    """GET /api/blazar/engines: `blazar engine list`, with each engine's last verify and smoke results."""

    def __init__(self, app: Blazar) -> None:
        self.app = app

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        rows = [engine_json(self.app, e) for e in installed_engines(self.app)]
        resp.media = {"active": active_tag(self.app), "engines": rows}


class VerifyBody(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    tag: StrictStr | None = Field(None, min_length=1, max_length=80)


class Verify:
    """POST /api/blazar/engines/verify: `blazar engine verify [TAG]`. Files that differ are an answer, not an
    error: the result is recorded (`engine.verified`) either way and shown with its problems."""

    def __init__(self, app: Blazar) -> None:
        self.app = app

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        media = await req.get_media(default_when_empty={})
        body = VerifyBody.model_validate(media)
        if body.tag is not None and engine(self.app, body.tag) is None:
            raise falcon.HTTPNotFound(description=f"no engine tagged {body.tag!r} (see: blazar engine list)")
        try:
            ev = await verify_engine(self.app, body.tag)
            resp.media = {"tag": ev.tag, "ok": ev.ok, "checked_files": ev.checked_files, "problems": ev.problems}
        except EngineVerifyFailed as e:
            resp.media = {"tag": e.tag, "ok": False, "problems": e.problems}


class Nodes:
    """GET /api/blazar/nodes: the gateways sharing this log, where each model is (loaded, and in whose store)."""

    def __init__(self, app: Blazar) -> None:
        self.app = app

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.media = await where(self.app)


def _query(name: str, schema: Schema, description: str) -> Schema:
    param: Schema = {"name": name, "in": "query", "required": False, "schema": schema, "description": description}
    if schema.get("type") == "array":
        param |= {"style": "form", "explode": True}
    return param


_ROWS = {"type": "array", "items": OBJ}
_SEQ = {"type": "integer", "minimum": 0, "maximum": MAX_SEQ}
_FILTERS = (_query("type", {"type": "array", "items": STR, "maxItems": 32}, "event types (repeat, or a,b)"),
            _query("stream", {"type": "string", "maxLength": 256}, "one stream, e.g. model:gemma3-270m"),
            _query("trace", {"type": "string", "maxLength": 64}, "one trace id"))
ROUTES = (
    # The page and its files hold no secret: open, like /health.
    Route("/console", Access.OPEN, lambda d: Page(), needs_gateway=False, ops={"get": Op(
        "The web console", ok_types=("text/html",))}),
    Route("/console/static/{name}", Access.OPEN, lambda d: Static(), needs_gateway=False, ops={"get": Op(
        "A file of the console page", statuses=(404,), ok_types=("text/css", "text/javascript", "image/png"))}),
    Route("/api/blazar/events", Access.ADMIN, lambda d: Events(d.app), needs_gateway=False, ops={"get": Op(
        "The newest events matching the filters, oldest first", obj(["events", "last_seq"], events=_ROWS,
                                                                   last_seq=INT),
        statuses=(400,), parameters=(*_FILTERS, _query("before", _SEQ, "seq at most"),
                                     _query("limit", {"type": "integer", "minimum": 1, "maximum": EVENTS_LIMIT},
                                            "at most (200)")))}),
    Route("/api/blazar/events/follow", Access.ADMIN, lambda d: console_follow.Follow(d.app), needs_gateway=False,
          ops={"get": Op(
              "The event log live (server-sent events; ends after timeout_s)", statuses=(400, 503), ok_types=(SSE,),
              parameters=(*_FILTERS, _query("after", _SEQ, "resume after this seq (the last)"),
                          _query("timeout_s", {"type": "number", "exclusiveMinimum": 0, "maximum": 600},
                                 "end the stream after this long (300)")))}),
    Route("/api/blazar/why/{trace}", Access.ADMIN, lambda d: Why(d.app), needs_gateway=False, ops={"get": Op(
        "One request's story (blazar why --json); `last`: the last failed",
        obj(["trace_id", "verdict", "steps"], trace_id=STR, verdict=STR, steps=_ROWS), statuses=(404,))}),
    Route("/api/blazar/models", Access.ADMIN, lambda d: Models(d.app, d.supervisor), needs_gateway=False, ops={
        "get": Op("The model store, each model's fit here now", obj(["models", "aliases"], models=_ROWS,
                                                                    aliases=OBJ))}),
    Route("/api/blazar/engines", Access.ADMIN, lambda d: Engines(d.app), needs_gateway=False, ops={"get": Op(
        "The engines with their verify and smoke results", obj(["active", "engines"], active=NULLABLE_STR,
                                                               engines=_ROWS))}),
    Route("/api/blazar/engines/verify", Access.ADMIN, lambda d: Verify(d.app), needs_gateway=False, ops={"post": Op(
        "Hash an engine's files (default: the active one) against its install record",
        obj(["tag", "ok", "problems"], tag=STR, ok=BOOL, problems={"type": "array", "items": STR}),
        statuses=(404, 503), body=VerifyBody)}),
    Route("/api/blazar/nodes", Access.ADMIN, lambda d: Nodes(d.app), needs_gateway=False, ops={"get": Op(
        "The gateways sharing this log, and where each model is (loaded, and in whose store)",
        obj(["this_node", "nodes"], this_node=NULLABLE_STR, nodes=_ROWS))}),
)
