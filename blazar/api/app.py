"""`create_app`: the one place the HTTP app is assembled: media handlers, error rendering, routes."""

from __future__ import annotations

import falcon
import falcon.asgi
import falcon.media
import orjson

from blazar.api import admin, errors
from blazar.bootstrap import Blazar


class HealthResource:
    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.media = {"status": "ok"}


def create_app(app: Blazar, supervisor: admin.SupervisorPort) -> falcon.asgi.App:
    api = falcon.asgi.App()
    json_handler = falcon.media.JSONHandler(dumps=orjson.dumps, loads=orjson.loads)
    api.req_options.media_handlers.update({falcon.MEDIA_JSON: json_handler})
    api.resp_options.media_handlers.update({falcon.MEDIA_JSON: json_handler})
    # A body sent without a Content-Type is read as JSON.
    api.req_options.default_media_type = falcon.MEDIA_JSON
    errors.register(api)
    api.add_route("/health", HealthResource())
    admin.add_routes(api, app, supervisor)
    return api
