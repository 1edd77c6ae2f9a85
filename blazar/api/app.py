"""`create_app`: the one place the HTTP app is assembled: media handlers, error rendering, and the routes of the route
table (blazar/api/table.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import falcon
import falcon.asgi
import falcon.media
import orjson

from blazar.api import auth, bounds, edge, errors, files, paths, table
from blazar.api.audio import path_limits as audio_limits
from blazar.api.context import RequestContext
from blazar.api.routes import Deps
from blazar.cluster.nodes import cluster_key
from blazar.context import Blazar
from blazar.queries.keys import keys_on
from blazar.queries.traces import known
from blazar.serving.ports import SupervisorPort

if TYPE_CHECKING:
    from blazar.serving.gateway import Gateway


def create_app(app: Blazar, supervisor: SupervisorPort, gateway: Gateway | None = None, *,
               admin_token: str | None = None, bind_host: str = "127.0.0.1", scheme: str = "http") -> falcon.asgi.App:
    """The admin routes always; the API dialects when a gateway is given (the daemon gives one). `admin_token` is
    the CLI's credential (run/admin.token), accepted as an admin principal once keys are on. `bind_host` and
    `scheme` are what the daemon serves on (the Host guard and same-origin check need them).

    A request meets the trace id and body limit, then the path check (not canonical: 404), then the router, then the
    edge and auth, which decide on the route resolved (each route's access in the table)."""
    settings = app.settings()
    peers_key = cluster_key(app.env) if app.node else None  # forwarding between nodes sharing a log
    middleware: list[Any] = [RequestContext(max_body_bytes=settings.server.max_body_mib << 20,
                                               known=lambda t: known(app, t),
                                               seen=app.log.has_trace,
                                               cluster_key=peers_key,
                                               path_limits={**files.path_limits(settings),
                                                            **audio_limits(settings.inputs.max_audio_mib)})]
    middleware.append(paths.CanonicalPath())  # NOTE: before any decision: a path that is not canonical is 404
    policy = edge.EdgePolicy.of(bind_host, settings.server.allowed_hosts, settings.server.cors_origins)
    middleware.append(edge.Edge(policy, lambda: keys_on(app), scheme=scheme))
    middleware.append(auth.Auth(auth.Authenticator(lambda: app.runner.state("keys"), app.clock,
                                                   rules=table.access_rules(), admin_token=admin_token,
                                                   admin_actor=auth.admin_actor(app.actor), cluster_key=peers_key)))
    api = falcon.asgi.App(middleware=middleware)
    json_handler = falcon.media.JSONHandler(dumps=orjson.dumps, loads=bounds.loads)  # nesting bounded
    api.req_options.media_handlers.update({falcon.MEDIA_JSON: json_handler})
    api.resp_options.media_handlers.update({falcon.MEDIA_JSON: json_handler})
    # A body sent without a Content-Type is read as JSON.
    api.req_options.default_media_type = falcon.MEDIA_JSON
    errors.register(api, home=app.paths.data_dir, audience=errors.Audience.of(app))
    deps = Deps(app, supervisor, gateway, routes=table.ROUTES)
    for route in table.ROUTES:
        if gateway is not None or not route.needs_gateway:  # without one (tests): the admin routes alone
            api.add_route(route.path, route.make(deps))
    return api
