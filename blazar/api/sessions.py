"""The session routes under /api/blazar/sessions (what `blazar session` speaks to a running daemon): list and show
read the sessions projection; save, restore and rm act through blazar/serving/session_commands.py.

Sessions live in their tenant's namespace (blazar/serving/tenancy.py). A key sees and acts on its own (its cache
group's); the machine's owner (keys off, the CLI's token) and admin keys list everyone's, and name another tenant's
session with `?key=NAME` or `?group=NAME`."""

from __future__ import annotations

from typing import Any

import falcon.asgi
from pydantic import BaseModel, ConfigDict, Field, StrictStr

from blazar.api.auth import Access, principal_of
from blazar.api.bounds import MAX_NAME_CHARS
from blazar.api.request_options import session_name
from blazar.api.routes import Op, Route
from blazar.api.schemas import INT, OBJ, STR, obj
from blazar.errors import DialectError, Forbidden
from blazar.queries.sessions import EVERYONE, session_detail, session_list
from blazar.serving import session_commands
from blazar.serving.gateway import Gateway
from blazar.serving.principal import is_admin
from blazar.serving.tenancy import qualify, tenant_named, tenant_of


class RestoreBody(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, title="SessionRestoreBody")

    model: StrictStr | None = Field(None, min_length=1, max_length=MAX_NAME_CHARS)


def _tenant(req: falcon.asgi.Request) -> str | None:
    """Whose sessions the caller means: its own tenant's, or (the owner and admins only) `?key=` / `?group=`'s."""
    principal = principal_of(req)
    own = tenant_of(principal)
    key, group = req.get_param("key"), req.get_param("group")
    if key is None and group is None:
        return own
    try:
        asked = tenant_named(key=key, group=group)
    except ValueError as e:
        raise DialectError(f"?key / ?group: {e}") from None
    if asked != own and not is_admin(principal):
        raise Forbidden(f"{principal.actor if principal else 'this caller'} may see only its own sessions (another "
                        "key's need an admin key)")
    return asked


def _session(req: falcon.asgi.Request, name: str) -> str:
    """The full name of the session the path names, in the caller's (or the asked) tenant's namespace."""
    qualified = qualify(_tenant(req), session_name(name, "session"))
    assert qualified is not None
    return qualified


class SessionsResource:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        asked = req.get_param("key") is not None or req.get_param("group") is not None
        everyone = is_admin(principal_of(req)) and not asked
        resp.media = session_list(self.gateway.app, EVERYONE if everyone else _tenant(req))


class SessionResource:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, name: str) -> None:
        resp.media = session_detail(self.gateway.app, _session(req, name))

    async def on_delete(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, name: str) -> None:
        session = _session(req, name)
        rec = await session_commands.remove_session(self.gateway.app, session, self.gateway.kv)
        resp.media = {**rec.event.model_dump(mode="json"), "removed": name, "session": name,
                      "tenant": _tenant(req)}


class SaveResource:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, name: str) -> None:
        recs = await session_commands.save_session(self.gateway, _session(req, name))
        resp.media = {"events": [r.to_json() for r in recs]}


class RestoreResource:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, name: str) -> None:
        media: Any = await req.get_media(default_when_empty={})
        body = RestoreBody.model_validate(media)
        resp.media = await session_commands.restore_session(self.gateway, _session(req, name), body.model)


_PREFIX = "/api/blazar/sessions"
ROUTES = (
    # A key's own sessions (its namespace: the handlers show and touch nothing else); an admin's, every key's.
    Route(_PREFIX, Access.KEY, lambda d: SessionsResource(d.gateway), {"get": Op(
        "Every session and the KV bank's size", obj(["sessions", "bank_bytes"], sessions={
            "type": "array", "items": OBJ}, bank_bytes=INT, bank_limit_bytes=INT))}),
    Route(f"{_PREFIX}/{{name}}", Access.KEY, lambda d: SessionResource(d.gateway), {
        "get": Op("One session and its saves", OBJ, statuses=(400, 404)),
        "delete": Op("Forget a session and delete its saves", OBJ, statuses=(400, 404))}),
    Route(f"{_PREFIX}/{{name}}/save", Access.KEY, lambda d: SaveResource(d.gateway), {"post": Op(
        "Save a session's live slot to the KV bank now", obj(["events"], events={"type": "array", "items": OBJ}),
        statuses=(400, 404, 409))}),
    Route(f"{_PREFIX}/{{name}}/restore", Access.KEY, lambda d: RestoreResource(d.gateway), {"post": Op(
        "Restore a session's newest save into a free slot",
        obj(["session", "model", "kv"], session=STR, model=STR, instance_id=STR, slot_id=INT, kv=STR),
        statuses=(400, 404, 409, 502, 503, 507), body=RestoreBody, body_required=False)}),
)
