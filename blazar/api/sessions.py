"""The session routes under /api/blazar/sessions (what `blazar session` speaks to a running daemon): list and show
read the sessions projection; save, restore and rm act through blazar/handlers/session_commands.py."""

from __future__ import annotations

from typing import Any

import falcon.asgi
from pydantic import BaseModel, ConfigDict, Field, StrictStr

from blazar.api.bounds import MAX_NAME_CHARS
from blazar.api.request_options import session_name
from blazar.handlers import session_commands
from blazar.handlers.gateway import Gateway
from blazar.queries.sessions import session_detail, session_list


class RestoreBody(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: StrictStr | None = Field(None, min_length=1, max_length=MAX_NAME_CHARS)


def _name(name: str) -> str:
    return session_name(name, "session")


class SessionsResource:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.media = session_list(self.gateway.app)


class SessionResource:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, name: str) -> None:
        resp.media = session_detail(self.gateway.app, _name(name))

    async def on_delete(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, name: str) -> None:
        rec = await session_commands.remove_session(self.gateway.app, _name(name), self.gateway.kv)
        resp.media = {"removed": name, **rec.event.model_dump(mode="json")}


class SaveResource:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, name: str) -> None:
        recs = await session_commands.save_session(self.gateway, _name(name))
        resp.media = {"events": [r.to_json() for r in recs]}


class RestoreResource:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, name: str) -> None:
        media: Any = await req.get_media(default_when_empty={})
        body = RestoreBody.model_validate(media)
        resp.media = await session_commands.restore_session(self.gateway, _name(name), body.model)


def add_routes(api: falcon.asgi.App, gateway: Gateway, prefix: str = "/api/blazar/sessions") -> None:
    api.add_route(prefix, SessionsResource(gateway))
    api.add_route(f"{prefix}/{{name}}", SessionResource(gateway))
    api.add_route(f"{prefix}/{{name}}/save", SaveResource(gateway))
    api.add_route(f"{prefix}/{{name}}/restore", RestoreResource(gateway))
