"""The edge, after routing and before auth: what a web page in the user's browser or a rebinding DNS name could make
the gateway do. A Host guard (DNS rebinding), an Origin check (cross-site requests), JSON-only bodies (HTML forms
and "simple" cross-origin requests, which need no CORS preflight), and CORS answers for the origins in
`cors_origins` only.

    EdgeRefused (BlazarError)   rendered in the route's dialect by blazar/api/errors.py
    ├── 403 host_not_allowed     a Host that is not this server's (DNS rebinding)
    ├── 403 origin_not_allowed   a request from a web page whose origin is not in cors_origins
    └── 415 unsupported_media_type   a body that is not declared JSON
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import falcon.asgi

from blazar.addresses import is_loopback
from blazar.errors import EdgeRefused

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
# Methods that change state or run a model: their bodies must be JSON.
BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
ALLOW_METHODS = "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"
# Asked for by a preflight and echoed for an allowed origin (the SDKs send their own x-stainless-* headers); these
# when the browser names none.
ALLOW_HEADERS = ("authorization, content-type, x-api-key, anthropic-version, x-blazar-trace-id, x-blazar-priority, "
                 "traceparent, x-blazar-session, x-blazar-deadline-ms, x-blazar-best-of, x-blazar-cascade, "
                 "x-blazar-spec")
EXPOSE_HEADERS = ("x-blazar-trace-id, x-blazar-queue-position, retry-after, x-blazar-shared, x-blazar-best-of, "
                  "x-blazar-cascade, x-blazar-ignored")
PREFLIGHT_MAX_AGE_S = 600


def host_name(header: str) -> str:
    """The name part of a Host header: `[::1]:11435` -> `::1`, `Localhost.:80` -> `localhost`."""
    value = header.strip().lower()
    if value.startswith("["):
        name = value[1:value.find("]")] if "]" in value else value[1:]
    else:
        name = value.rsplit(":", 1)[0] if value.count(":") == 1 else value
    return name.rstrip(".")


@dataclass(frozen=True)
class EdgePolicy:
    """Who may be served: the bound address, extra Host names, and the web origins allowed to call."""

    bind_host: str
    allowed_hosts: frozenset[str]
    cors_origins: frozenset[str]
    any_origin: bool = False  # cors_origins = ["*"], honoured only while keys are on

    @classmethod
    def of(cls, bind_host: str, allowed_hosts: Iterable[str], cors_origins: Iterable[str]) -> EdgePolicy:
        origins = frozenset(o.rstrip("/").lower() for o in cors_origins)
        return cls(bind_host=bind_host.strip("[]").lower(),
                   allowed_hosts=frozenset(host_name(h) for h in allowed_hosts),
                   cors_origins=origins - {"*"}, any_origin="*" in origins)

    def host_allowed(self, header: str | None) -> bool:
        if not header:
            return False
        name = host_name(header)
        if name in self.allowed_hosts or name in LOOPBACK_NAMES:
            return True
        if is_loopback(self.bind_host):
            return False  # NOTE: a loopback bind answers only to loopback names: the DNS-rebinding defence
        if self.bind_host in ("0.0.0.0", "::", ""):
            # A wildcard bind answers any Host unless allowed_hosts narrows it; keys are required there anyway.
            return not self.allowed_hosts
        return name == self.bind_host

    def origin_allowed(self, origin: str, *, own: str, keys_on: bool) -> bool:
        origin = origin.rstrip("/").lower()
        return origin == own or origin in self.cors_origins or (self.any_origin and keys_on)

    def cors(self, origin: str, *, keys_on: bool) -> bool:
        """Whether CORS headers go to this origin (its own origin needs none)."""
        origin = origin.rstrip("/").lower()
        return origin in self.cors_origins or (self.any_origin and keys_on)


def json_content_type(value: str | None) -> bool:
    """A body declared JSON (`application/json`, `application/*+json`, with any parameters), or not declared."""
    if value is None or not value.strip():
        return True
    media = value.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


class Edge:
    """Falcon middleware: Host guard, Origin check, JSON bodies, CORS (preflights answered here, before auth). It
    decides after routing, on the route that will serve the request, as auth does: a request no route serves is
    answered 404 and nothing else (CORS headers on the way out aside)."""

    def __init__(self, policy: EdgePolicy, keys_on: Callable[[], bool], *, scheme: str = "http") -> None:
        self.policy = policy
        self.keys_on = keys_on
        self.scheme = scheme

    async def process_resource(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, resource: object,
                               params: dict[str, Any]) -> None:
        host = req.get_header("Host")
        if not self.policy.host_allowed(host):
            shown = (host or "")[:100]
            raise EdgeRefused(f"Host {shown!r} is not served here (a DNS-rebinding defence); add it to allowed_hosts "
                              "(`blazar config set server.allowed_hosts NAME`) if it is yours", status=403,
                              code="host_not_allowed")
        origin = req.get_header("Origin")
        if origin is not None:
            own = f"{self.scheme}://{(host or '').lower()}"
            if req.method == "OPTIONS" and req.get_header("Access-Control-Request-Method"):
                self._preflight(req, resp, origin)
                return
            if not self.policy.origin_allowed(origin, own=own, keys_on=self.keys_on()):
                raise EdgeRefused(f"requests from the web origin {origin[:100]!r} are refused: add it to cors_origins "
                                  "(`blazar config set server.cors_origins ORIGIN`) to allow it", status=403,
                                  code="origin_not_allowed")
        # NOTE: a file upload (blazar/api/files.py: `multipart = True`) is a form; a browser sends one cross-site only
        # with an Origin, refused above unless allowed.
        multipart = getattr(resource, "multipart", False) and (req.content_type or "").startswith(
            "multipart/form-data")
        if req.method in BODY_METHODS and not json_content_type(req.content_type) and not multipart:
            raise EdgeRefused(f"the request body must be JSON (Content-Type: application/json), not "
                              f"{(req.content_type or '')[:100]!r}", status=415, code="unsupported_media_type")

    async def process_resource_ws(self, req: falcon.asgi.Request, ws: falcon.asgi.WebSocket, resource: object,
                                  params: dict[str, Any]) -> None:
        """A WebSocket's upgrade meets the same Host guard and Origin check (a browser opens one cross-site with its
        page's Origin); the refusal is left for the route to tell over the socket, as auth's."""
        host, origin = req.get_header("Host"), req.get_header("Origin")
        if not self.policy.host_allowed(host):
            req.context.refused = EdgeRefused(f"Host {(host or '')[:100]!r} is not served here (a DNS-rebinding "
                                              "defence)", status=403, code="host_not_allowed")
        elif origin is not None and not self.policy.origin_allowed(
                origin, own=f"{self.scheme}://{(host or '').lower()}", keys_on=self.keys_on()):
            req.context.refused = EdgeRefused(f"connections from the web origin {origin[:100]!r} are refused: add it "
                                              "to cors_origins to allow it", status=403, code="origin_not_allowed")

    def _preflight(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, origin: str) -> None:
        """A CORS preflight: 204, with the CORS headers only for an allowed origin (the browser then refuses)."""
        resp.status = 204
        resp.complete = True
        resp.vary = ("Origin",)
        if self.policy.cors(origin, keys_on=self.keys_on()):
            resp.set_header("Access-Control-Allow-Origin", origin)
            resp.set_header("Access-Control-Allow-Methods", ALLOW_METHODS)
            asked = req.get_header("Access-Control-Request-Headers")
            resp.set_header("Access-Control-Allow-Headers", asked[:2000] if asked else ALLOW_HEADERS)
            resp.set_header("Access-Control-Max-Age", str(PREFLIGHT_MAX_AGE_S))

    async def process_response(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, resource: object,
                               req_succeeded: bool) -> None:
        origin = req.get_header("Origin")
        if origin is None or req.method == "OPTIONS":
            return
        resp.vary = ("Origin",)
        if self.policy.cors(origin, keys_on=self.keys_on()):
            resp.set_header("Access-Control-Allow-Origin", origin)
            resp.set_header("Access-Control-Expose-Headers", EXPOSE_HEADERS)
