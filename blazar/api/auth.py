"""API keys at the door: a Falcon middleware that finds the caller's principal from `Authorization: Bearer <secret>`
or `x-api-key: <secret>` (on a WebSocket upgrade also the `openai-insecure-api-key.<secret>` subprotocol, as a
browser sends it; one dict look-up by prefix in the live keys projection, one HMAC, a constant-time compare;
never SQLite), refuses what it may not do (401, 403), and leaves `req.context.principal` for the gateway (scope,
limits, actor). Who may call what is one rule per route (its `Route.access` in the route table, blazar/api/table.py,
by URI template), read on the route falcon resolved, never on the raw path. Auth is on as soon as one key is not
revoked; until then every request passes as before. Open even then: the OPEN routes and OPTIONS (CORS preflights,
Allow).

    AuthRefused (blazar/errors.py)   rendered in the route's dialect by blazar/api/errors.py
    ├── Unauthenticated  401  no secret, an unknown or wrong one, a revoked or expired key (WWW-Authenticate: Bearer)
    └── Forbidden        403  a key that is not --admin on an admin route
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Iterable, Mapping
from enum import StrEnum
from typing import Any

import falcon.asgi

from blazar.clock import Clock
from blazar.errors import AuthRefused, Forbidden, Unauthenticated
from blazar.operations.keys import digest, prefix_of
from blazar.queries.keys import KeysState, auth_on, live_by_prefix
from blazar.serving.principal import Principal


class Access(StrEnum):
    """Who may call a route, once keys are on (until then everyone may)."""

    OPEN = "open"        # no key: the answer holds no secret (health, the OpenAPI document, the console's files)
    KEY = "key"          # any valid key; the handler serves the key's own view (its --models scope, its limits)
    CLUSTER = "cluster"  # an --admin key, or another node of the cluster (BLAZAR_CLUSTER_KEY)
    ADMIN = "admin"      # an --admin key, or the CLI's admin token


def access(rules: Mapping[str, Access], route: str | None) -> Access:
    """The rule of the route with this URI template; ADMIN for one without a rule (fail closed)."""
    return rules.get(route, Access.ADMIN) if route is not None else Access.ADMIN


def presented(req: falcon.asgi.Request) -> str | None:
    """The secret the caller sent, if any."""
    auth = req.get_header("Authorization")
    if auth:
        scheme, _, token = auth.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    key = req.get_header("x-api-key")
    return key.strip() if key and key.strip() else None


# A browser cannot set headers on a WebSocket: OpenAI's browser clients send the key as a subprotocol,
# `new WebSocket(url, ["realtime", "openai-insecure-api-key.KEY"])`, and the server answers `realtime`.
KEY_PROTOCOL = "openai-insecure-api-key."
REALTIME_PROTOCOL = "realtime"


def protocol_key(subprotocols: Iterable[str]) -> str | None:
    """The secret carried in a WebSocket upgrade's `Sec-WebSocket-Protocol` (never to be echoed back or logged)."""
    for protocol in subprotocols:
        if protocol.startswith(KEY_PROTOCOL) and protocol[len(KEY_PROTOCOL):].strip():
            return protocol[len(KEY_PROTOCOL):].strip()
    return None


class Authenticator:
    """Secret -> principal, against the keys projection's live state (read through `keys`, never copied, so a key
    created, rotated or revoked by another process counts as soon as the daemon folds its event)."""

    def __init__(self, keys: Callable[[], KeysState], clock: Clock, *, rules: Mapping[str, Access],
                 admin_token: str | None = None, admin_actor: str = "cli:admin", cluster_key: str | None = None
                 ) -> None:
        self._keys = keys
        # NOTE: the table's rules (blazar/api/table.py access_rules); a route without one is ADMIN (fail closed).
        # To open a route to every key (the sessions, say), its handler must first show and touch only what belongs
        # to `principal_of(req)`; then mark it KEY.
        self.rules = rules
        self.clock = clock
        self.admin_token = admin_token.encode() if admin_token else None
        self.admin = Principal(actor=admin_actor, admin=True)
        # Another node of the cluster forwarding a request (BLAZAR_CLUSTER_KEY): the caller's own key was checked
        # where the request came in, so no scope or limit again here; never an admin.
        self.cluster_key = cluster_key.encode() if cluster_key else None
        self.peer = Principal(actor="cluster:node", admin=False, cluster=True)

    def on(self) -> bool:
        return auth_on(self._keys())

    def principal(self, secret: str | None) -> Principal:
        """The caller's principal; raises Unauthenticated."""
        if secret is None:
            raise Unauthenticated("this Blazar needs an API key: send `Authorization: Bearer <key>` or `x-api-key: "
                                  "<key>` (keys are made with `blazar keys create NAME`)")
        if self.cluster_key is not None and hmac.compare_digest(secret.encode(), self.cluster_key):
            return self.peer
        prefix = prefix_of(secret)
        if prefix is None:
            if self.admin_token is not None and hmac.compare_digest(secret.encode(), self.admin_token):
                return self.admin
            raise Unauthenticated("invalid API key")
        key = live_by_prefix(self._keys(), prefix)
        if key is None or not hmac.compare_digest(digest(key.salt, secret), key.hash):
            raise Unauthenticated("invalid API key")  # NOTE: the same words for an unknown prefix and a wrong secret
        if key.expires_ts is not None and key.expires_ts <= self.clock.now():
            raise Unauthenticated(f"API key {key.name!r} has expired")
        return Principal(actor=f"key:{key.name}", admin=key.admin, key=key)

    def check(self, method: str, route: str | None, secret: str | None) -> Principal | None:
        """The principal a request to the route with URI template `route` runs as (None: auth is off, the route is
        open or the request a preflight); raises AuthRefused."""
        rule = access(self.rules, route)
        if rule is Access.OPEN or method == "OPTIONS" or not self.on():
            return None
        principal = self.principal(secret)
        if rule is Access.KEY or principal.admin or (rule is Access.CLUSTER and principal.cluster):
            return principal
        raise Forbidden(f"{route} needs an admin key; {principal.actor} is not one (`blazar keys create NAME "
                        "--admin`)")


class Auth:
    """Falcon middleware around an Authenticator: it decides after routing, on the route's URI template (a request
    no route serves is answered 404 by falcon and never decided on; blazar/api/paths.py has refused a path that is
    not canonical before that)."""

    def __init__(self, authenticator: Authenticator) -> None:
        self.authenticator = authenticator

    async def process_resource(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, resource: object,
                               params: dict[str, Any]) -> None:
        req.context.principal = self.authenticator.check(req.method, req.uri_template, presented(req))

    async def process_resource_ws(self, req: falcon.asgi.Request, ws: falcon.asgi.WebSocket, resource: object,
                                  params: dict[str, Any]) -> None:
        """A WebSocket's upgrade is decided by the same rule, its secret also read from the subprotocols a browser
        sends (`protocol_key`); a refusal is left for the route to tell over the socket (an `error` event, then the
        close): falcon's HTTP error rendering has no response to write to."""
        if getattr(req.context, "refused", None) is not None:  # the edge refused it first
            req.context.principal = None
            return
        try:
            secret = presented(req) or protocol_key(ws.subprotocols)  # NOTE: the headers first, as on any route
            req.context.principal = self.authenticator.check("GET", req.uri_template, secret)
        except AuthRefused as e:
            req.context.principal = None
            req.context.refused = e


def admin_actor(daemon_actor: str) -> str:
    """The CLI's principal: the daemon's OS user ("daemon:alice" -> "cli:alice"), who alone can read the token."""
    _, _, user = daemon_actor.partition(":")
    return f"cli:{user or daemon_actor}"


def principal_of(req: falcon.asgi.Request) -> Principal | None:
    return getattr(req.context, "principal", None)
