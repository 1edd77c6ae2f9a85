"""The admin routes under /api/blazar/ (what `blazar load`, `stop` and `ps` speak to a running daemon): validate the
body, call the supervisor, render. Errors are raised and rendered by blazar/api/errors.py."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any

import falcon.asgi
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    WithJsonSchema,
    field_validator,
)

from blazar.api.auth import Access, principal_of
from blazar.api.bounds import MAX_NAME_CHARS
from blazar.api.routes import ENGINE, Op, Route
from blazar.api.schemas import BOOL, DURATION, INT, STR, obj, ref
from blazar.context import Blazar
from blazar.durations import keep_alive_seconds
from blazar.instances.supervisor import UNSET
from blazar.queries.ps import open_circuits
from blazar.serving.ports import SupervisorPort
from blazar.serving.principal import is_admin

# What of an instance only an admin principal sees: where its engine listens and how it was started.
ENGINE_ONLY = frozenset({"port", "base_url", "argv"})
# What of an instance never leaves: the engine's key, what it calls the model (a file path without --alias), the
# Unix socket a child without a port listens on (port 0 says so).
PRIVATE = frozenset({"api_key", "served_as", "template", "kv_identity", "kv_restorable", "url", "headers",
                     "stops", "sampling", "loop_guard", "per_request_budget", "load_budget", "socket"})  # internal


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LoadBody(_Body):
    model: StrictStr = Field(min_length=1, max_length=MAX_NAME_CHARS)
    # Ollama's convention: a duration string or seconds; negative = forever; absent = the setting (or, for a loaded
    # instance, what it has).
    keep_alive: Annotated[StrictStr | StrictInt | StrictFloat | None, WithJsonSchema(DURATION)] = None
    # Absent leaves a loaded instance's pin as it is; a new one starts unpinned.
    pin: StrictBool | None = None
    ctx: StrictInt | None = Field(None, ge=1, description="context tokens per slot")
    # A new instance ready for sessions: a sliding-window model's full window cache (session_swa_full).
    sessions: StrictBool | None = None

    @field_validator("keep_alive")
    @classmethod
    def _duration(cls, v: str | int | float | None) -> str | int | float | None:
        if v is not None:
            keep_alive_seconds(v)  # a ValueError here is a 400 naming the accepted forms
        return v

    def keep_alive_s(self) -> Any:
        return UNSET if self.keep_alive is None else keep_alive_seconds(self.keep_alive)


class ModelBody(_Body):
    model_config = ConfigDict(extra="forbid", frozen=True, title="AdminModelBody")
    model: StrictStr = Field(min_length=1, max_length=MAX_NAME_CHARS)


async def _body(req: falcon.asgi.Request, model: type[_Body]) -> Any:
    media = await req.get_media()
    return model.model_validate(media)


class PsResource:
    def __init__(self, app: Blazar, supervisor: SupervisorPort) -> None:
        self.app, self.supervisor = app, supervisor

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        circuits = open_circuits(self.app, now=self.app.clock.now())
        rows = self.supervisor.ps()
        if not is_admin(principal_of(req)):  # NOTE: the engine port is for admins only (the route is admin's anyway)
            rows = [{k: v for k, v in r.items() if k not in ENGINE_ONLY} for r in rows]
        resp.media = {"instances": rows, "circuits": circuits}


class LoadResource:
    def __init__(self, supervisor: SupervisorPort) -> None:
        self.supervisor = supervisor

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        body: LoadBody = await _body(req, LoadBody)
        inst = await self.supervisor.load(body.model, keep_alive=body.keep_alive_s(), pinned=body.pin, ctx=body.ctx,
                                          session=bool(body.sessions))
        resp.media = {k: v for k, v in asdict(inst).items() if k not in PRIVATE} | {
            "posture": inst.posture.label() if inst.posture is not None else "defaults"}  # as blazar ps says it


class StopResource:
    def __init__(self, supervisor: SupervisorPort) -> None:
        self.supervisor = supervisor

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        body: ModelBody = await _body(req, ModelBody)
        resp.media = {"stopped": await self.supervisor.stop(body.model)}


class ResetResource:
    def __init__(self, supervisor: SupervisorPort) -> None:
        self.supervisor = supervisor

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        body: ModelBody = await _body(req, ModelBody)
        resp.media = {"reset": await self.supervisor.reset(body.model)}


class SyncResource:
    """Fold what other processes appended, now: `blazar keys` calls it so that a key change counts on the very next
    request (the live tail alone would see it within its poll interval)."""

    def __init__(self, app: Blazar) -> None:
        self.app = app

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        await self.app.runner.catch_up()
        resp.media = {"seq": self.app.runner.seq}


_M = "gemma3-270m"  # the packaged demo model, in the document's examples
_MODEL_EXAMPLE = ({"model": _M},)
ROUTES = (
    Route("/api/blazar/ps", Access.ADMIN, lambda d: PsResource(d.app, d.supervisor), needs_gateway=False, ops={
        "get": Op("Running instances and open circuits", ref("Ps"))}),
    Route("/api/blazar/load", Access.ADMIN, lambda d: LoadResource(d.supervisor), needs_gateway=False, ops={
        "post": Op("Load a model (or change a loaded one's keep_alive/pin)", ref("Instance"), statuses=ENGINE,
                   body=LoadBody, examples=({"model": _M, "keep_alive": "10m", "pin": False},))}),
    Route("/api/blazar/stop", Access.ADMIN, lambda d: StopResource(d.supervisor), needs_gateway=False, ops={
        "post": Op("Stop a model's instances", obj(["stopped"], stopped={"type": "array", "items": STR}),
                   statuses=(404,), body=ModelBody, examples=_MODEL_EXAMPLE)}),
    Route("/api/blazar/reset", Access.ADMIN, lambda d: ResetResource(d.supervisor), needs_gateway=False, ops={
        "post": Op("Close a model's crash circuit", obj(["reset"], reset=BOOL), statuses=(404,), body=ModelBody,
                   examples=_MODEL_EXAMPLE)}),
    Route("/api/blazar/sync", Access.ADMIN, lambda d: SyncResource(d.app), needs_gateway=False, ops={
        "post": Op("Fold what other processes appended (a key change), now", obj(["seq"], seq=INT))}),
)
