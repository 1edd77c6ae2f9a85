"""The request path, checked before anything else reads it: a path that is not canonical is 404 before the router,
the edge or auth see it, so the route a request is decided on is always the route that serves it. Falcon's router
skips leading slashes (`//api/delete` would serve /api/delete) and reads `..` or an empty segment as a path
parameter; the server hands the path over percent-decoded (`/%2Fapi` arrives as `//api`). Also the path an error
takes its dialect from when no route was resolved.

Canonical: `/`, or `/` followed by segments separated by single slashes, none of them empty (no `//`, no trailing
`/`), `.` or `..`.
"""

from __future__ import annotations

import falcon
import falcon.asgi

_DOT_SEGMENTS = frozenset({"", ".", ".."})
_SHOWN_CHARS = 100  # of a refused path, in the error message


def canonical(path: str) -> bool:
    if path == "/":
        return True
    if not path.startswith("/") or "//" in path or path.endswith("/"):
        return False
    return "/." not in path or _DOT_SEGMENTS.isdisjoint(path[1:].split("/"))


def normalised(path: str) -> str:
    """`path` with empty and `.` segments dropped and `..` applied: what a non-canonical path's error takes its
    dialect from (`//v1/messages` is answered in Anthropic's shape). Never used to route or to authorize."""
    out: list[str] = []
    for segment in path.split("/"):
        if segment == "..":
            if out:
                out.pop()
        elif segment not in ("", "."):
            out.append(segment)
    return "/" + "/".join(out)


def route_of(req: falcon.asgi.Request) -> str:
    """The URI template of the route serving `req`, else (refused before routing, or no route) its normalised
    path."""
    return req.uri_template or normalised(req.path)


class CanonicalPath:
    """Falcon middleware, after the trace id and before the edge: a path that is not canonical is 404."""

    async def process_request(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        if not canonical(req.path):
            shown = req.path[:_SHOWN_CHARS]
            raise falcon.HTTPRouteNotFound(
                description=f"no route serves {shown!r}: paths are served only as written in the API (single "
                            "slashes, none at the end, no '.' or '..' segments)")
