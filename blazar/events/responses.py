"""Stored Responses (the stateful `/v1/responses`): what was kept and what was deleted, by id, size and tokens. The
conversation itself lives in the content store beside the log (blazar/store/responses.py), never in an event: the
log keeps no prompt or answer text, and deleting a response really deletes its content.

A response is owned by its tenant (keys are tenants: blazar/serving/tenancy.py); the content is on the node that
served it (NodeLocal), on the stream `response:<id>`.
"""

from __future__ import annotations

from typing import Literal

from blazar.events.base import NodeLocal
from blazar.events.types import register

DeleteReason = Literal["requested", "expired"]


class _ResponseEvent(NodeLocal):
    response_id: str
    tenant: str | None = None  # None: the machine's owner (keys off)

    def stream_key(self) -> str:
        return f"response:{self.response_id}"


@register
class ResponseStored(_ResponseEvent):
    """A Response and its input were written to the content store (`store` true, the default): the request that made
    it (`trace_id`), the response it continues, how many items and bytes were kept, and its tokens."""

    TYPE = "response.stored"
    CONTROL = False  # recorded with the request's own events, through the group-commit writer

    trace_id: str
    model: str
    status: str  # completed or incomplete (cut by the output limit)
    previous_response_id: str | None = None
    input_items: int
    output_items: int
    content_bytes: int
    input_tokens: int
    output_tokens: int


@register
class ResponseDeleted(_ResponseEvent):
    """A stored Response's content was deleted: at its owner's request (`DELETE /v1/responses/{id}`) or because it
    outlived `responses_retention_s`."""

    TYPE = "response.deleted"

    reason: DeleteReason
    content_bytes: int
