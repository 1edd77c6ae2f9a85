"""Per-request context every route shares: the trace id (a W3C `traceparent`'s trace id, else the client's
`x-blazar-trace-id` kept, else a new one, echoed on every response, errors included) and the body-size limit:
Content-Length checked before a byte of the body is read, and the bytes counted as they arrive (chunked bodies)."""

from __future__ import annotations

import hmac
import logging
import re
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import falcon
import falcon.asgi

from blazar.api.auth import presented
from blazar.cluster.nodes import FORWARD_HEADER
from blazar.config import NODE_NAME
from blazar.errors import Unauthenticated
from blazar.ids import new_trace_id

log = logging.getLogger("blazar.api")

TRACE_HEADER = "x-blazar-trace-id"
# A client's trace id is kept when it looks like one (W3C's 32 hex, or any short token of safe characters).
_TRACE_OK = re.compile(r"[A-Za-z0-9._-]{8,64}")
# W3C trace-context: version-traceid-parentid-flags, lowercase hex; a later version may append fields.
_TRACEPARENT = re.compile(r"(?P<version>[0-9a-f]{2})-(?P<trace_id>[0-9a-f]{32})-(?P<span_id>[0-9a-f]{16})-[0-9a-f]{2}"
                          r"(?P<rest>-.*)?")
# Trace ids this process remembers having handed out, clients' and its own: the newest requests' events may still be
# in the group-commit writer's buffer, in neither the log nor the traces projection.
RECENT_TRACE_IDS = 100_000


def trace_id_of(req: falcon.asgi.Request) -> str:
    return str(req.context.trace_id)


def parse_traceparent(value: str | None) -> tuple[str, str] | None:
    """(trace id, parent span id) of a valid W3C traceparent header, else None (ignored, as the spec says)."""
    m = _TRACEPARENT.fullmatch(value.strip()) if value else None
    if m is None or m["version"] == "ff" or (m["version"] == "00" and m["rest"]):
        return None
    if set(m["trace_id"]) == {"0"} or set(m["span_id"]) == {"0"}:
        return None
    return m["trace_id"], m["span_id"]


class RequestContext:
    """Falcon middleware: trace id in, trace id out; oversized bodies refused with 413.

    A client's trace id already used is not reused: the request gets a fresh id (in the response header), and the
    client's is kept beside it, so an earlier trace's history is never appended to, whenever it was written. Used
    means handed out by this process (remembered, its own fresh ids too), known to `known` (the traces projection's
    newest traces), or in the log at all (`seen`: one look-up in its trace index, made only for an id a client
    brings that memory does not know). A valid `traceparent` is kept as the request's parent, and its trace id,
    while unused, is the request's trace id (before `x-blazar-trace-id`)."""

    def __init__(self, *, max_body_bytes: int, known: Callable[[str], bool] | None = None,
                 seen: Callable[[str], Awaitable[bool]] | None = None, cluster_key: str | None = None,
                 path_limits: dict[str, int] | None = None) -> None:
        self.max_body_bytes = max_body_bytes
        self.path_limits = path_limits or {}  # a route with its own bound (a file upload: files_max_bytes)
        self.known = known or (lambda _trace_id: False)
        self.seen = seen
        self.cluster_key = cluster_key.encode() if cluster_key else None
        self._given: OrderedDict[str, None] = OrderedDict()

    def _remember(self, trace_id: str) -> None:
        self._given[trace_id] = None
        if len(self._given) > RECENT_TRACE_IDS:
            self._given.popitem(last=False)

    async def _used(self, trace_id: str) -> bool:
        if trace_id in self._given or self.known(trace_id):
            return True
        # Claimed before the log is asked: a second request racing with the same id finds it here.
        self._remember(trace_id)
        if self.seen is None:
            return False
        try:
            return await self.seen(trace_id)
        except Exception as e:  # NOTE: fail closed: an id the log could not be asked about is never reused
            log.warning("could not look up trace id %s in the log (%s): the request gets a fresh one", trace_id, e)
            return True

    def _fresh(self) -> str:
        trace_id = new_trace_id()
        self._remember(trace_id)  # its events may wait in the group-commit writer while the client reuses it
        return trace_id

    def _forwarded_from(self, req: falcon.asgi.Request) -> str | None:
        """The node that forwarded this request (its trace id is then kept though the log knows it: one trace across
        nodes). A forwarding header without the cluster key is refused: it could append to anyone's trace."""
        hop = req.get_header(FORWARD_HEADER)
        if hop is None:
            return None
        secret = presented(req)
        if self.cluster_key is None or secret is None or not hmac.compare_digest(secret.encode(), self.cluster_key):
            raise Unauthenticated(f"{FORWARD_HEADER} needs the cluster key (BLAZAR_CLUSTER_KEY, the same on every "
                                  "node)")
        if not NODE_NAME.fullmatch(hop):
            raise Unauthenticated(f"{FORWARD_HEADER}: not a node name")
        return hop

    async def process_request(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        given = req.get_header(TRACE_HEADER)
        req.context.client_trace_id = None
        try:
            req.context.forwarded_from = hop = self._forwarded_from(req)
        except Unauthenticated:
            req.context.trace_id = new_trace_id()  # the refusal is answered with a trace id of its own
            resp.set_header(TRACE_HEADER, req.context.trace_id)
            raise
        if hop is not None and given and _TRACE_OK.fullmatch(given):
            req.context.trace_id = given
            req.context.traceparent = None
            resp.set_header(TRACE_HEADER, given)
            self._check_length(req)
            return
        req.context.traceparent = parent = parse_traceparent(req.get_header("traceparent"))
        if parent is not None and not await self._used(parent[0]):
            req.context.trace_id = parent[0]
            if given and _TRACE_OK.fullmatch(given) and given != parent[0]:
                req.context.client_trace_id = given  # the traceparent's won: recorded beside it
        elif given and _TRACE_OK.fullmatch(given) and not await self._used(given):
            req.context.trace_id = given
        else:
            req.context.trace_id = self._fresh()
            if given and _TRACE_OK.fullmatch(given):
                req.context.client_trace_id = given  # reused: recorded beside the fresh id
        resp.set_header(TRACE_HEADER, req.context.trace_id)
        self._check_length(req)

    def _check_length(self, req: falcon.asgi.Request) -> None:
        length = req.content_length
        limit = self.path_limits.get(req.path, self.max_body_bytes) if req.method == "POST" else self.max_body_bytes
        setting = ("max_body_mib" if limit == self.max_body_bytes else
                   "max_audio_mib" if req.path.startswith("/v1/audio/") else "files_max_bytes")
        if length is not None and length > limit:
            raise falcon.HTTPContentTooLarge(
                description=f"the request body is {length} bytes; the limit is {limit} ({setting})")
        limit_body(req, limit, setting)


def limit_body(req: falcon.asgi.Request, limit: int, setting: str = "max_body_mib") -> None:
    """Count the body's bytes as they arrive (a chunked body has no Content-Length to check): past `limit`, reading
    it raises 413, so nothing is parsed or forwarded. Every body is read through falcon's ASGI receive channel."""
    receive = req._receive
    first = req._first_event or {}
    seen = len(first.get("body", b"")) if first.get("type") == "http.request" else 0

    def too_large() -> falcon.HTTPContentTooLarge:
        return falcon.HTTPContentTooLarge(description=f"the request body is over the limit of {limit} bytes "
                                                      f"({setting})")

    if seen > limit:
        raise too_large()

    async def counted() -> Mapping[str, Any]:
        nonlocal seen
        event: Mapping[str, Any] = await receive()
        if event.get("type") == "http.request":
            seen += len(event.get("body", b""))
            if seen > limit:
                raise too_large()
        return event

    req._receive = counted
