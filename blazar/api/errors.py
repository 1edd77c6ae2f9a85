"""Every error the HTTP app answers with, rendered once, in the OpenAI shape `{"error": {message, type, code, param}}`.
Resources raise (BlazarError, pydantic's ValidationError, falcon's HTTPError); the handlers registered here render.

    status  code                   raised as
    400     invalid_json           a body that is not JSON (falcon's MediaMalformedError / MediaNotFoundError)
    400     invalid_request        a body that does not validate (unknown field, bad keep_alive, ...)
    400     invalid_model_name     InvalidModelName
    401     invalid_api_key        Unauthenticated (blazar/api/auth.py; type authentication_error, WWW-Authenticate)
    403     admin_key_required     Forbidden (a key that is not --admin on an admin route; type permission_error)
    403     model_not_allowed      a model outside the key's --models scope (the gateway's refusal)
    429     rate_limit_exceeded    a key's rpm, tpm, daily_tokens, daily_audio_s or max_concurrent (Retry-After)
    404     model_not_found        ModelNotFound
    404     model_not_loaded       ModelNotLoaded
    503     circuit_open           CircuitOpen
    409     model_pinned           ModelPinned (a pinned instance of the model stands in the way of the load)
    507     insufficient_memory    DoesNotFit
    507     disk_full              DiskFull, or any failure no space caused (a control change the log had no room
                                   for, an engine's key file): names the disk and the space needed
    502     load_failed            LoadFailed
    503     no_engine              NoEngine
    503     engine_incompatible    EngineIncompatible (the active engine lacks a flag the plan needs)
    503     engine_error           any other EngineError (the engine cannot be started)
    4xx/5xx the refusal's code        a refusal (blazar/errors.py Refused: the gateway's, admission's, a key's): its own
                                   status and code, Retry-After when waiting helps (429 queue_full, 503
                                   queue_timeout, 400 context_length_exceeded, ...)
    500     its own code           any other BlazarError (log_error, ...); internal_error for an unexpected exception

The message is its caller's (`Audience`): the machine's owner (no keys, an admin key, the CLI) reads the whole of it;
any other key reads what blazar/redact.py lets it see (the error's public text, never a path of this machine, a log's
name or a traceback), and the owner finds the rest in `blazar why` and the daemon log.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from http import HTTPStatus
from pathlib import Path
from typing import Any

import falcon
import falcon.asgi
from pydantic import ValidationError

from blazar.api.auth import principal_of
from blazar.api.paths import route_of
from blazar.context import Blazar
from blazar.diskspace import explain
from blazar.errors import BlazarError
from blazar.queries.keys import keys_on
from blazar.redact import machine_roots, told

log = logging.getLogger("blazar.api")

def status_and_code(exc: BlazarError) -> tuple[int, str]:
    return exc.http_status, exc.code


def body(message: str, *, status: int, code: str, param: str | None = None, kind: str | None = None
         ) -> dict[str, Any]:
    kind = kind or ("rate_limit_error" if status == 429 else "invalid_request_error" if status < 500
                    else "server_error")
    return {"error": {"message": message, "type": kind, "code": code, "param": param}}


# Anthropic's error types by status (https://docs.anthropic.com: errors).
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error",
                    529: "overloaded_error"}


def in_dialect(req: falcon.asgi.Request, payload: dict[str, Any]) -> dict[str, Any]:
    """The OpenAI-shaped `payload` in the shape of the route's dialect: Anthropic's
    `{"type": "error", "error": {type, message}}` under /v1/messages, Ollama's `{"error": message}` under /api/
    (the admin routes under /api/blazar/ keep the OpenAI shape). Read from the route resolved, else the normalised
    path (`//v1/messages` is answered as /v1/messages would be), never the raw one."""
    err = payload["error"]
    path = route_of(req)
    if path.startswith("/v1/messages"):
        status = int(err.get("status") or 0)
        kind = _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
        return {"type": "error", "error": {"type": kind, "message": err["message"]}}
    if path.startswith("/api/") and not path.startswith("/api/blazar/"):
        return {"error": err["message"]}
    err.pop("status", None)
    return payload


def _render(resp: falcon.asgi.Response, status: int, payload: dict[str, Any],
            req: falcon.asgi.Request | None = None) -> None:
    resp.status = status
    if req is not None:
        payload["error"]["status"] = status
        payload = in_dialect(req, payload)
    resp.media = payload


class Audience:
    """Who an error is told to, in what words: the machine's owner (no keys yet, or an admin key and the CLI's token)
    gets its whole message; any other caller (a key that is not an admin's, another node, a caller no key was found
    for) what blazar/redact.py lets it see: never a path of this machine, a log's name or a traceback."""

    def __init__(self, keys_on: Callable[[], bool], roots: Sequence[str] = ()) -> None:
        self.keys_on = keys_on
        self.roots = tuple(roots)

    @classmethod
    def of(cls, app: Blazar) -> Audience:
        return cls(lambda: keys_on(app), machine_roots(app.paths.data_dir, app.paths.config_dir))

    def detail(self, req: falcon.asgi.Request) -> bool:
        principal = principal_of(req)
        return principal.admin if principal is not None else not self.keys_on()

    def told(self, req: falcon.asgi.Request, exc: BaseException) -> str:
        """`exc` in the words its caller may read. What a key is not told goes to the daemon log, with the trace."""
        detail = self.detail(req)
        words = told(exc, detail=detail, roots=self.roots)
        if not detail and isinstance(exc, BlazarError) and words != exc.message:
            log.warning("%s %s (trace %s) failed: %s", req.method, req.path,
                        getattr(req.context, "trace_id", "-"), exc.message)
        return words


# Before keys are known (a test's bare app): every caller is the owner.
OWNER = Audience(lambda: False)


def render_error(req: falcon.asgi.Request, resp: falcon.asgi.Response, ex: BlazarError,
                 audience: Audience = OWNER) -> None:
    """`ex` as the answer, in the route's dialect and in its caller's words; Retry-After and its own headers."""
    status, code = status_and_code(ex)
    _render(resp, status, body(audience.told(req, ex), status=status, code=code, kind=ex.error_type), req)
    if ex.retry_after_s is not None:
        resp.set_header("Retry-After", str(max(1, math.ceil(ex.retry_after_s))))
    for name, value in ex.headers.items():  # an auth refusal's WWW-Authenticate
        resp.set_header(name, value)


async def _socket_closed(ws: falcon.asgi.WebSocket | None, status: int) -> None:
    """An error met by a WebSocket (falcon gives no response then): the socket closed with falcon's code for the
    status, 3000 + status (before its accept, the server answers the upgrade with a 403). /v1/realtime tells its own
    refusals over the socket first (blazar/api/realtime.py); this is any other path's upgrade, or a failure."""
    if ws is not None:
        await ws.close(3000 + status if status < 1000 else 1011)


async def _validation_error(req: falcon.asgi.Request, resp: falcon.asgi.Response | None, ex: ValidationError,
                            params: Any, ws: falcon.asgi.WebSocket | None = None) -> None:
    if resp is None:
        await _socket_closed(ws, 400)
        return
    first = ex.errors(include_url=False)[0]
    param = ".".join(str(p) for p in first["loc"]) or None
    # NOTE: pydantic's own words for the first problem, prefixed with the field: "keep_alive: Value error, not a
    # duration: '5x' (...)". Every problem is in the log line; one is enough for a client to fix its request.
    message = f"{param}: {first['msg']}" if param else first["msg"]
    _render(resp, 400, body(message, status=400, code="invalid_request", param=param), req)


async def _http_error(req: falcon.asgi.Request, resp: falcon.asgi.Response | None, ex: falcon.HTTPError,
                      params: Any, ws: falcon.asgi.WebSocket | None = None) -> None:
    status = ex.status_code
    if resp is None:
        await _socket_closed(ws, status)
        return
    if isinstance(ex, falcon.MediaMalformedError | falcon.MediaNotFoundError):
        code = "invalid_json"
        message = "the request body is not valid JSON" if isinstance(ex, falcon.MediaMalformedError) \
            else "the request body is empty: a JSON object is expected"
    else:
        code = HTTPStatus(status).phrase.lower().replace(" ", "_")  # not_found, method_not_allowed, ...
        message = ex.description or ex.title or HTTPStatus(status).phrase
    _render(resp, status, body(message, status=status, code=code), req)
    for name, value in dict(ex.headers or {}).items():
        resp.set_header(name, value)


def register(app: falcon.asgi.App, *, home: Path | None = None, audience: Audience = OWNER) -> None:
    """Falcon picks the most specific handler by the exception's MRO, so the catch-all never hides the others. With
    `home`, a failure that no space caused (an engine's key file, a log file) is the 507 `disk_full` it is. Every
    error is told in `audience`'s words for its caller; the daemon log keeps the whole of it."""

    async def blazar_error(req: falcon.asgi.Request, resp: falcon.asgi.Response | None, ex: BlazarError,
                           params: Any, ws: falcon.asgi.WebSocket | None = None) -> None:
        if resp is None:
            await _socket_closed(ws, ex.http_status)
            return
        render_error(req, resp, ex, audience)

    async def unexpected(req: falcon.asgi.Request, resp: falcon.asgi.Response | None, ex: Exception, params: Any,
                         ws: falcon.asgi.WebSocket | None = None) -> None:
        if resp is None:
            log.exception("WebSocket %s failed", req.path, exc_info=ex)
            await _socket_closed(ws, 1011)
            return
        full = explain(ex, home, writing=f"Blazar's files under {home}") if home is not None else None
        if full is None:
            log.exception("%s %s failed", req.method, req.path, exc_info=ex)
            _render(resp, 500, body(audience.told(req, ex), status=500, code="internal_error"), req)
            return
        log.error("%s %s failed: %s", req.method, req.path, full.message)
        render_error(req, resp, full, audience)

    app.add_error_handler(Exception, unexpected)
    app.add_error_handler(falcon.HTTPError, _http_error)
    app.add_error_handler(ValidationError, _validation_error)
    app.add_error_handler(BlazarError, blazar_error)
