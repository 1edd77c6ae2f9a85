"""OpenAI's `/v1/batches`: create a batch from an uploaded file, retrieve, cancel, list. The routes record what the
caller asked (`batch.created`, `batch.cancelling`); the batch runner (blazar/serving/batches.py) does the rest. Each
batch is its key's: another key's is 404.

`line_asker` is how a batch line's body meets the same validation as an interactive request to its endpoint: the
route's own `ask` (blazar/api/openai.py) checks the body and gives the Request the runner sends through the pipeline.

Making a batch is a request of its key's (blazar/api/charges.py): it counts against the key's rpm and concurrency
(429), then its cap on open batches (429), then its storage (413 when no byte is left for the batch's output), before
anything is read or linked.
"""

from __future__ import annotations

import asyncio
from typing import Any, get_args

import falcon
import falcon.asgi
from pydantic import BaseModel, ConfigDict, Field, StrictStr

from blazar.api import bounds
from blazar.api.auth import Access, principal_of
from blazar.api.charges import Charges
from blazar.api.files import file_store, not_found, owner_of, record
from blazar.api.openai import ChatCompletions, Completions, Embeddings
from blazar.api.proxy import Proxy
from blazar.api.responses import Responses
from blazar.api.routes import Op, Route
from blazar.api.schemas import OBJ, STR, listed, obj
from blazar.context import Blazar
from blazar.dialects import responses as responses_dialect
from blazar.errors import BatchConflict, DialectError
from blazar.events.batches import BatchCancelling, BatchCreated, BatchEndpoint
from blazar.queries.batches import batch_json, created_row, own_batch, own_batches, own_file
from blazar.serving.batch_lines import MAX_WINDOW_CHARS, Ask, Build, window_seconds
from blazar.serving.conversations import Conversations, responses_request, serve_as
from blazar.serving.gateway import Gateway
from blazar.serving.principal import Principal
from blazar.serving.request import Request
from blazar.store.files import FileStore, new_batch_id

ENDPOINTS: tuple[str, ...] = get_args(BatchEndpoint)
MAX_METADATA = 16


class CreateBody(BaseModel):
    model_config = ConfigDict(extra="ignore", title="BatchBody")  # output_expires_after: the files stay until deleted

    input_file_id: StrictStr = Field(min_length=1, max_length=80)
    endpoint: StrictStr = Field(max_length=80)
    completion_window: StrictStr = Field(max_length=MAX_WINDOW_CHARS)  # recorded: bounded
    metadata: dict[StrictStr, StrictStr] | None = None


def line_asker(gateway: Gateway) -> tuple[Ask, Build]:
    """Each batch endpoint's route `ask` (the same validation and translation as an interactive request), and how a
    checked line becomes its Request as its owner's tenant: a `/v1/responses` line is the chat request it translates
    to, with that tenant's conversation before it (blazar/serving/conversations.py), stored as the route would."""
    conversations = Conversations(gateway.app)
    routes: dict[str, Proxy] = {"/v1/chat/completions": ChatCompletions(gateway),
                                "/v1/completions": Completions(gateway), "/v1/embeddings": Embeddings(gateway),
                                "/v1/responses": Responses(gateway, conversations)}

    def ask(endpoint: str, body: dict[str, Any]) -> Request:
        asked = routes[endpoint].ask(body)
        bounds.check_name(asked.model)
        if endpoint == "/v1/responses":
            responses_dialect.read(body)  # the whole body checked now; a previous id is looked up when the line runs
        return asked

    def build(endpoint: str, body: dict[str, Any], tenant: str | None) -> Request:
        asked = ask(endpoint, body)
        if endpoint == "/v1/responses":
            return serve_as(asked, responses_request(body, conversations, tenant=tenant))
        return asked

    return ask, build


class Batches:
    def __init__(self, app: Blazar, store: FileStore, charges: Charges) -> None:
        self.app, self.store, self.charges = app, store, charges

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        principal = principal_of(req)
        owner = owner_of(principal)
        with self.charges.lease(req, principal, "/v1/batches"):  # the key's rpm and concurrency, first
            self.charges.check_open_batches(req, principal, owner, "/v1/batches")
            room = self.charges.storage(owner, principal)
            if room.room == 0:
                self.charges.refuse(req, principal, "/v1/batches", room.refusal("no batch output fits"))
            # NOTE: held from the check until batch.created is folded: two creates at once cannot both take the
            # last open batch. No await between the check and the hold.
            with self.charges.ledger.holding_batch(owner):
                resp.media = await self._create(req, principal, owner)

    async def _create(self, req: falcon.asgi.Request, principal: Principal | None, owner: str) -> dict[str, Any]:
        body = CreateBody.model_validate(await req.get_media())
        if body.endpoint not in ENDPOINTS:
            raise DialectError(f"endpoint {body.endpoint[:80]!r} is not one Blazar batches: {', '.join(ENDPOINTS)}",
                               code="invalid_request")
        window_s = window_seconds(body.completion_window)
        if window_s is None:
            raise DialectError(f"completion_window {body.completion_window[:20]!r} is not a window: \"24h\" (or "
                               "hours, minutes, seconds like \"1h\", \"30m\", \"90s\", up to 7 days)",
                               code="invalid_request")
        if body.metadata is not None and (len(body.metadata) > MAX_METADATA or any(
                len(k) > 64 or len(v) > 512 for k, v in body.metadata.items())):
            raise DialectError("metadata holds at most 16 pairs, keys of at most 64 characters and values of at most "
                               "512", code="invalid_request")
        source = own_file(self.app, body.input_file_id, owner)
        if source is None:
            raise not_found("File", body.input_file_id)
        if source.purpose != "batch":
            raise DialectError(f"the file {source.file_id} was uploaded with purpose {source.purpose!r}; a batch's "
                               "input is uploaded with purpose 'batch'", code="invalid_request")
        batch_id = new_batch_id()
        copied = await asyncio.to_thread(self.store.link_input, batch_id, source.file_id)
        endpoint: Any = body.endpoint
        # The answer is the batch as created (`validating`, as OpenAI answers): the runner may already be past it.
        [created] = await record(self.app, [BatchCreated(
            batch_id=batch_id, owner=owner, input_file_id=source.file_id, endpoint=endpoint,
            completion_window=body.completion_window.strip(), window_s=window_s, metadata=body.metadata,
            input_bytes=source.bytes, input_copied=copied)], principal)
        return batch_json(created_row(created))

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        limit = req.get_param_as_int("limit", min_value=1, max_value=100) or 20
        rows = own_batches(self.app, owner_of(principal_of(req)))
        after = req.get_param("after")
        if after:
            ids = [r.batch_id for r in rows]
            rows = rows[ids.index(after) + 1:] if after in ids else []
        data = [batch_json(r) for r in rows[:limit]]
        resp.media = {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                      "last_id": data[-1]["id"] if data else None, "has_more": len(rows) > limit}


class Batch:
    def __init__(self, app: Blazar) -> None:
        self.app = app

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, batch_id: str) -> None:
        row = own_batch(self.app, batch_id, owner_of(principal_of(req)))
        if row is None:
            raise not_found("Batch", batch_id)
        resp.media = batch_json(row)


class BatchCancel:
    def __init__(self, app: Blazar) -> None:
        self.app = app

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, batch_id: str) -> None:
        principal = principal_of(req)
        owner = owner_of(principal)
        row = own_batch(self.app, batch_id, owner)
        if row is None:
            raise not_found("Batch", batch_id)
        if row.status in ("validating", "in_progress"):
            await record(self.app, [BatchCancelling(batch_id=batch_id)], principal)
            row = own_batch(self.app, batch_id, owner)
            assert row is not None
        elif row.status != "cancelling":
            raise BatchConflict(f"Cannot cancel a batch with status '{row.status}'.")
        resp.media = batch_json(row)


BATCH = obj(["id", "object", "status", "endpoint", "input_file_id"], id=STR, object={"const": "batch"}, status=STR,
            endpoint=STR, input_file_id=STR, request_counts=OBJ)
# Each key's own: the handlers show and touch only the caller's (the route is any key's).
ROUTES = (
    Route("/v1/batches", Access.KEY, lambda d: Batches(d.app, d.shared(file_store), Charges(d.app, d.gateway)), {
        "post": Op("Create a batch from an uploaded file", BATCH, statuses=(400, 404), body=CreateBody),
        "get": Op("The caller's batches, newest first", listed(), statuses=(400,))}),
    Route("/v1/batches/{batch_id}", Access.KEY, lambda d: Batch(d.app), {
        "get": Op("One batch", BATCH, statuses=(404,))}),
    Route("/v1/batches/{batch_id}/cancel", Access.KEY, lambda d: BatchCancel(d.app), {
        "post": Op("Cancel a batch", BATCH, statuses=(404, 409))}),
)
