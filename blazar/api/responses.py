"""OpenAI's Responses API: `POST /v1/responses` served as the chat request it translates to (blazar/serving/
conversations.py: one pipeline for every generating route), and the stored responses it keeps: `GET` and `DELETE
/v1/responses/{response_id}`, `GET /v1/responses/{response_id}/input_items`. A response is its tenant's: another
key asking for it gets the same 404 as for an id never stored."""

from __future__ import annotations

from typing import Any

import falcon
import falcon.asgi

from blazar.api.auth import Access, principal_of
from blazar.api.openai import M
from blazar.api.proxy import Proxy
from blazar.api.routes import Op, Route, inference
from blazar.api.schemas import BOOL, NULLABLE_STR, OBJ, SSE, STR, obj, ref
from blazar.dialects import responses as dialect
from blazar.dialects.responses_body import ResponsesBody
from blazar.errors import DialectError
from blazar.serving.conversations import CHAT, Conversations, responses_request, serve_as
from blazar.serving.gateway import Gateway
from blazar.serving.request import Request
from blazar.serving.tenancy import tenant_of

LIST_MAX = 100


class Responses(Proxy):
    def __init__(self, gateway: Gateway, conversations: Conversations) -> None:
        super().__init__(gateway)
        self.conversations = conversations

    def ask(self, data: dict[str, Any]) -> Request:
        # What the route needs before the caller is known (the model, whether it streams); the whole body is read
        # in request_of, once its tenant is known (a previous_response_id is looked up in its conversations).
        body = ResponsesBody.model_validate(data)
        return Request(model=body.model, engine_path=CHAT, body=None, stream=body.stream,
                       max_tokens=body.max_output_tokens)

    def request_of(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, asked: Request, raw: bytes,
                   data: dict[str, Any]) -> Request:
        request = super().request_of(req, resp, asked, raw, data)
        return serve_as(request, responses_request(data, self.conversations, tenant=request.tenant))

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        await self.conversations.sweep()
        await super().on_post(req, resp)


class StoredResponse:
    def __init__(self, conversations: Conversations) -> None:
        self.conversations = conversations

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, response_id: str) -> None:
        await self.conversations.sweep()
        resp.media = (await self.conversations.get(tenant_of(principal_of(req)), response_id)).response

    async def on_delete(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, response_id: str) -> None:
        await self.conversations.sweep()
        await self.conversations.delete(tenant_of(principal_of(req)), response_id)
        resp.media = dialect.deleted(response_id)


class InputItems:
    def __init__(self, conversations: Conversations) -> None:
        self.conversations = conversations

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, response_id: str) -> None:
        await self.conversations.sweep()
        items = (await self.conversations.get(tenant_of(principal_of(req)), response_id)).input
        order = req.get_param("order") or "desc"
        if order not in ("asc", "desc"):
            raise DialectError(f"order: expected 'asc' or 'desc', got {order[:20]!r}")
        limit = req.get_param_as_int("limit", min_value=1, max_value=LIST_MAX) or 20
        if order == "desc":
            items = items[::-1]
        after = req.get_param("after")
        if after is not None:
            ids = [i.get("id") for i in items]
            if after not in ids:
                raise DialectError(f"after: no input item {after[:64]!r} in this response")
            items = items[ids.index(after) + 1:]
        page = items[:limit]
        resp.media = {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                      "last_id": page[-1]["id"] if page else None, "has_more": len(items) > limit}


_ITEMS = obj(["object", "data", "has_more"], object={"const": "list"}, data={"type": "array", "items": OBJ},
             first_id=NULLABLE_STR, last_id=NULLABLE_STR, has_more=BOOL)
ROUTES = (
    Route("/v1/responses", Access.KEY, lambda d: Responses(d.gateway, d.shared(Conversations)), {"post": inference(
        "Responses", ResponsesBody, "Response", SSE, examples=({"model": M, "input": "Why is the sky blue?"},))}),
    # A key sees only its own responses (a tenant's): another's is the same 404 as one never stored.
    Route("/v1/responses/{response_id}", Access.KEY, lambda d: StoredResponse(d.shared(Conversations)), {
        "get": Op("A stored response (the caller's own)", ref("Response"), statuses=(404,)),
        "delete": Op("Delete a stored response and its content", obj(
            ["id", "object", "deleted"], id=STR, object={"const": "response"}, deleted=BOOL), statuses=(404,))}),
    Route("/v1/responses/{response_id}/input_items", Access.KEY, lambda d: InputItems(d.shared(Conversations)), {
        "get": Op("The input items a stored response was given", _ITEMS, statuses=(400, 404))}),
)
