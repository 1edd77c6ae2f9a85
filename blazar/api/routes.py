"""What a route is: its URI template, who may call it, how its resource is made, and what each of its methods does
as the OpenAPI document says it. Each api module declares its routes once (`ROUTES`); blazar/api/table.py gathers
them, and `create_app`, auth (blazar/api/auth.py) and the document (blazar/api/openapi.py) all read that table."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, cast

from pydantic import BaseModel

from blazar.api.auth import Access
from blazar.api.schemas import JSON, Schema, ref

if TYPE_CHECKING:
    from blazar.context import Blazar
    from blazar.serving.gateway import Gateway
    from blazar.serving.ports import SupervisorPort

T = TypeVar("T")


@dataclass(frozen=True)
class Op:
    """One method of a route, as the document shows it: its 200 (a JSON `ok`, or the media types of `ok_types`), the
    error statuses it answers besides the edge's, and its request body's pydantic model: the same model the route
    validates with, so what is documented is what is accepted."""

    summary: str
    ok: Schema | None = None
    statuses: tuple[int, ...] = ()
    body: type[BaseModel] | None = None
    examples: tuple[dict[str, Any], ...] = ()
    ok_types: tuple[str, ...] = (JSON,)
    engine_errors: bool = False  # the engine's own refusals pass through with its status (a 4XX)
    line: Schema | None = None  # an NDJSON stream's line, when it is not the `ok` shape or an error
    parameters: tuple[Schema, ...] = ()  # query parameters
    form: Schema | None = None  # a multipart form's fields (uploads), instead of a JSON body
    body_required: bool = True
    responses: Mapping[int, Schema] = field(default_factory=dict)  # an answer of its own for a status (/ready's 503)


@dataclass
class Deps:
    """What resources are made from, and the objects routes of one module share (made once, on first ask)."""

    app: Blazar
    supervisor: SupervisorPort
    gateway_or_none: Gateway | None
    routes: tuple[Route, ...] = ()
    _shared: dict[object, object] = field(default_factory=dict, init=False, repr=False)

    @property
    def gateway(self) -> Gateway:
        if self.gateway_or_none is None:
            raise RuntimeError("this route is served only with a gateway (create_app skips it without one)")
        return self.gateway_or_none

    def shared(self, make: Callable[[Blazar], T]) -> T:
        """`make(app)`, once per app: the store or cache that several routes of a module hold together."""
        if make not in self._shared:
            self._shared[make] = make(self.app)
        return cast(T, self._shared[make])


@dataclass(frozen=True, eq=False)  # NOTE: compared and hashed by identity: a table is cached by its routes
class Route:
    """A URI template served by one resource: `make` builds it, `access` says who may call it once keys are on, and
    `ops` documents each method the resource answers (by lower-case method name; OPTIONS is falcon's own)."""

    path: str
    access: Access
    make: Callable[[Deps], object]
    ops: Mapping[str, Op]
    needs_gateway: bool = True  # the admin routes are served without one too
    websocket: bool = False  # served as a WebSocket (`on_websocket`): no HTTP method, so nothing in the document


# What a route that resolves, loads and runs a model may answer: no such model, a pin in the way, a limit, the engine
# failing, no engine or an open circuit, no room.
ENGINE = (404, 409, 429, 502, 503, 507)


def inference(summary: str, body: type[BaseModel], ok: str, stream: str | None, *,
              examples: tuple[dict[str, Any], ...] = ()) -> Op:
    """An inference route's one method: its answer `ok` as JSON, or a stream of `stream` when the body asks."""
    return Op(summary, ref(ok), statuses=ENGINE, body=body, examples=examples,
              ok_types=(JSON, stream) if stream else (JSON,), engine_errors=True)
