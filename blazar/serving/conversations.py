"""Stateful Responses on the one pipeline: a `/v1/responses` body becomes the chat Request every route is served as
(`responses_request`), with the conversation its `previous_response_id` names put before its input, and its answer
rendered as a Response and kept in the content store (blazar/store/responses.py) when `store` is true.

    body --responses.read--> chat body (+ the history from the store) --Gateway.serve--> chat answer
         --responses.render / ResponsesStream--> Response --Conversations.keep--> content store, response.stored

Everything a chat request gets (a forced tool choice, a model's settings, sessions, best-of, cascades) a Responses
request gets too: it IS a chat request until its answer is rendered. Usable outside the HTTP route (a batch line).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from blazar.dialects import responses as dialect
from blazar.dialects.tools import constrain
from blazar.errors import Refused
from blazar.events.responses import ResponseDeleted, ResponseStored
from blazar.serving.request import Hooks, Request
from blazar.store.responses import FILE, ResponseStore, Stored

if TYPE_CHECKING:
    from blazar.context import Blazar
    from blazar.serving.call import Call

CHAT = "/v1/chat/completions"


def not_found(response_id: str, param: str | None = None) -> Refused:
    """OpenAI's words for an id this tenant has no response by (never stored, another key's, deleted, expired)."""
    if param == "previous_response_id":
        return Refused(f"Previous response with id '{response_id}' not found.", reason="previous_response_not_found",
                       http_status=400, error_type="invalid_request_error")
    return Refused(f"No response found with id '{response_id}'.", reason="not_found", http_status=404,
                   error_type="invalid_request_error")


class Conversations:
    """The content store with its events: what is kept, read and deleted, per tenant. The routes' reads and deletes
    run in a thread; `keep` writes at once (one small row as an answer ends, before its last event is sent)."""

    def __init__(self, app: Blazar, store: ResponseStore | None = None) -> None:
        self.app = app
        self.store = store if store is not None else ResponseStore(
            app.paths.data_dir / FILE, lambda: app.settings().retention.responses_retention_s)

    async def get(self, tenant: str | None, response_id: str) -> Stored:
        stored = await asyncio.to_thread(self.store.get, tenant, response_id)
        if stored is None:
            raise not_found(response_id)
        return stored

    def keep(self, call: Call, response: dict[str, Any], items: list[dict[str, Any]]) -> None:
        """Store a rendered Response and the input it answered; `response.stored` goes with the request's events."""
        tenant = call.request.tenant
        size = self.store.put(tenant, response, items)
        usage = response.get("usage") or {}
        call.emit(ResponseStored(
            response_id=response["id"], tenant=tenant, trace_id=call.trace_id, model=call.name or call.model,
            status=response["status"], previous_response_id=response.get("previous_response_id"),
            input_items=len(items), output_items=len(response.get("output") or []), content_bytes=size,
            input_tokens=int(usage.get("input_tokens") or 0), output_tokens=int(usage.get("output_tokens") or 0)))

    async def delete(self, tenant: str | None, response_id: str) -> None:
        size = await asyncio.to_thread(self.store.delete, tenant, response_id)
        if size is None:
            raise not_found(response_id)
        await self.app.record(ResponseDeleted(response_id=response_id, tenant=tenant, reason="requested",
                                              content_bytes=size))

    async def sweep(self) -> None:
        """Delete what outlived `responses_retention_s` (at most once a minute), each deletion recorded."""
        gone = await asyncio.to_thread(self.store.sweep)
        if gone:
            await self.app.record([ResponseDeleted(response_id=s.id, tenant=s.tenant, reason="expired",
                                                   content_bytes=s.content_bytes) for s in gone])


def responses_request(data: dict[str, Any], conversations: Conversations, *, tenant: str | None) -> Request:
    """A `POST /v1/responses` body as the chat Request the pipeline serves, for `tenant` (whose conversation a
    `previous_response_id` must name). Raises DialectError (400) for a bad body, Refused for an unknown previous id.
    The route (or a batch) adds the request around it with `dataclasses.replace`."""
    asked = dialect.read(data)
    history: list[dict[str, Any]] = []
    if asked.previous_response_id is not None:
        previous = conversations.store.get(tenant, asked.previous_response_id)
        if previous is None:
            raise not_found(asked.previous_response_id, "previous_response_id")
        history = previous.conversation
    body = {**asked.chat, "messages": dialect.with_history(asked, history)}
    if body.get("tools") and body.get("tool_choice") not in (None, "auto", "none"):
        # NOTE: a forced call answers with a call, not text: `text.format` shapes text only (the Agents SDK sends
        # both when an agent with an output type must use a tool first), so it gives way to the call's grammar.
        body.pop("response_format", None)
    forced = constrain(body)  # a forced call, or else `text.format`, as the engine's grammar
    items = history + asked.items  # what this response was given: its input_items
    response_id, created_at = dialect.new_id("resp"), int(time.time())

    def echo(call: Call) -> dialect.Echo:
        return dialect.Echo(response_id, created_at, call.model, asked.echo)

    def reply(answer: dict[str, Any], call: Call) -> dict[str, Any]:
        response = dialect.render(answer, echo(call))
        if asked.store:
            conversations.keep(call, response, items)
        return response

    def stream_as(call: Call) -> dialect.ResponsesStream:
        # NOTE: kept before response.completed is sent, so a client chaining at once finds it.
        done = (lambda response: conversations.keep(call, response, items)) if asked.store else None
        return dialect.ResponsesStream(echo(call), done)

    return Request(model=asked.chat["model"], engine_path=CHAT, body=body, stream=bool(body.get("stream")),
                   max_tokens=body.get("max_tokens"), forced=forced, hooks=Hooks(reply=reply, stream_as=stream_as),
                   tenant=tenant)


def serve_as(request: Request, asked: Request) -> Request:
    """The route's request (trace id, caller, options) carrying what `responses_request` asked."""
    return replace(request, body=asked.body, stream=asked.stream, max_tokens=asked.max_tokens, forced=asked.forced,
                   hooks=replace(request.hooks, reply=asked.hooks.reply, stream_as=asked.hooks.stream_as))
