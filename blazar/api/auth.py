"""API keys at the door: a Falcon middleware that finds the caller's principal from `Authorization: Bearer <secret>`
or `x-api-key: <secret>` (one dict look-up by prefix in the live keys projection, one HMAC, a constant-time compare;
never SQLite), refuses what it may not do (401, 403), and leaves `req.context.principal` for the gateway (scope,
limits, actor). Auth is on as soon as one key is not revoked; until then every request passes as before. Open even
then: /health, /openapi.json, the console's page and files (/console: no secret in them; what they call is not
open) and CORS preflights (OPTIONS).

    AuthRefused (blazar/errors.py)   rendered in the route's dialect by blazar/api/errors.py
    ├── Unauthenticated  401  no secret, an unknown or wrong one, a revoked or expired key (WWW-Authenticate: Bearer)
    └── Forbidden        403  a key that is not --admin on an admin route
"""

from __future__ import annotations

import hmac
from collections.abc import Callable

import falcon.asgi

from blazar.clock import Clock
from blazar.errors import Forbidden, Unauthenticated
from blazar.handlers.keys import digest, prefix_of
from blazar.handlers.principal import Principal
from blazar.projections.base import State
from blazar.projections.keys import auth_on, live_by_prefix

# Routes that need an --admin key: the admin API, model management, per-key figures, the readiness probe.
ADMIN_ROUTES = frozenset({"/api/pull", "/api/delete", "/api/copy", "/api/create", "/api/push", "/metrics", "/ready"})
# What another node may ask of this one besides inference (`blazar pull --node`): a download into this node's store.
CLUSTER_ROUTES = frozenset({"/api/pull"})
# NOTE: /openapi.json describes the routes and no secret (blazar/api/openapi.py keeps the same list as OPEN_PATHS).
OPEN_ROUTES = frozenset({"/health", "/openapi.json", "/console"})
OPEN_PREFIXES = ("/console/static/",)








def admin_route(path: str) -> bool:
    return path.startswith("/api/blazar/") or path.rstrip("/") in ADMIN_ROUTES or path == "/api/blazar"


def presented(req: falcon.asgi.Request) -> str | None:
    """The secret the caller sent, if any."""
    auth = req.get_header("Authorization")
    if auth:
        scheme, _, token = auth.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    key = req.get_header("x-api-key")
    return key.strip() if key and key.strip() else None


class Authenticator:
    """Secret -> principal, against the keys projection's live state (read through `keys`, never copied, so a key
    created, rotated or revoked by another process counts as soon as the daemon folds its event)."""

    def __init__(self, keys: Callable[[], State], clock: Clock, *, admin_token: str | None = None,
                 admin_actor: str = "cli:admin", cluster_key: str | None = None) -> None:
        self._keys = keys
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

    def check(self, method: str, path: str, secret: str | None) -> Principal | None:
        """The principal a request runs as (None: auth is off or the route is open); raises AuthRefused."""
        if method == "OPTIONS" or path in OPEN_ROUTES or path.startswith(OPEN_PREFIXES) or not self.on():
            return None
        principal = self.principal(secret)
        if not principal.admin and admin_route(path) and not (principal.cluster and path in CLUSTER_ROUTES):
            raise Forbidden(f"{path} needs an admin key; {principal.actor} is not one (`blazar keys create NAME "
                            "--admin`)")
        return principal


class Auth:
    """Falcon middleware around an Authenticator."""

    def __init__(self, authenticator: Authenticator) -> None:
        self.authenticator = authenticator

    async def process_request(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        req.context.principal = None
        req.context.principal = self.authenticator.check(req.method, req.path, presented(req))


def admin_actor(daemon_actor: str) -> str:
    """The CLI's principal: the daemon's OS user ("daemon:alice" -> "cli:alice"), who alone can read the token."""
    _, _, user = daemon_actor.partition(":")
    return f"cli:{user or daemon_actor}"


def principal_of(req: falcon.asgi.Request) -> Principal | None:
    return getattr(req.context, "principal", None)
