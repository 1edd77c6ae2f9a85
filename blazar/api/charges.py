"""What a file upload or a batch creation costs its key, decided before any of its body is read (docs/15.BATCHES.md,
"What a key may hold"). Each is a request like any other: it takes the key's concurrency lease for as long as it
runs and counts against its rpm (the gateway's limiter, blazar/serving/limits.py: 429 with Retry-After); an upload
must fit the key's storage quota (413 with the numbers) and a new batch its cap on open batches (429)
(blazar/serving/storage.py).

A refusal is recorded as an interactive request's is: `request.received` (its route, no model) and then
`request.rejected` with the reason and the numbers it relied on, on the answer's trace id, as the key: `blazar why`
explains it and the key's counters count it. What is stored or made is recorded by its own events (`file.uploaded`,
`batch.created`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, NoReturn

import falcon.asgi

from blazar.api.context import trace_id_of
from blazar.context import Blazar
from blazar.errors import LimitExceeded, Refused
from blazar.events.requests import RequestReceived, RequestRejected, is_reject_reason
from blazar.serving.principal import Principal
from blazar.serving.storage import Ledger, Storage, ledger, refuse_open_batches, storage
from blazar.serving.tenancy import tenant_of

if TYPE_CHECKING:
    from blazar.serving.gateway import Gateway


class Charges:
    def __init__(self, app: Blazar, gateway: Gateway) -> None:
        self.app, self.gateway = app, gateway
        self.ledger: Ledger = ledger(app.paths)

    @contextlib.contextmanager
    def lease(self, req: falcon.asgi.Request, principal: Principal | None, route: str) -> Iterator[None]:
        """The key's rpm counted and its concurrency lease held while the block runs (none for the machine's owner);
        a 429 with Retry-After, recorded, when its limits are reached."""
        limits = principal.limits() if principal is not None else None
        if limits is None:
            yield
            return
        try:
            lease = self.gateway.limits.acquire(limits)
        except LimitExceeded as e:
            self.refuse(req, principal, route, Refused(
                e.message, reason="rate_limit_exceeded", http_status=429, retry_after_s=e.retry_after_s,
                observations={"key": limits.name, "limit": e.limit, "value": e.value}))
        try:
            yield
        finally:
            self.gateway.limits.release(lease)

    def storage(self, owner: str, principal: Principal | None) -> Storage:
        """What `owner` holds now (recorded, and on its way in this process) against its quota."""
        key = principal.key if principal is not None else None
        return storage(self.app.runner.state("batches"), self.ledger, owner, key, self.app.settings())

    def check_open_batches(self, req: falcon.asgi.Request, principal: Principal | None, owner: str,
                           route: str) -> None:
        """A 429, recorded, when the key has as many open batches as it may."""
        key = principal.key if principal is not None else None
        refusal = refuse_open_batches(self.app.runner.state("batches"), self.ledger, owner, key, self.app.settings())
        if refusal is not None:
            self.refuse(req, principal, route, refusal)

    def refuse(self, req: falcon.asgi.Request, principal: Principal | None, route: str, refusal: Refused,
               **headers: str) -> NoReturn:
        """Record the refusal as the request's (received, then rejected), then raise it to be answered."""
        trace_id = trace_id_of(req)
        actor = principal.actor if principal is not None else None
        self.gateway.desk.emit(RequestReceived(trace_id=trace_id, dialect="openai", route=route, model="",
                                          body_bytes=req.content_length or 0, client=req.remote_addr,
                                          tenant=tenant_of(principal)), trace_id, actor)
        reason = refusal.reason if is_reject_reason(refusal.reason) else "invalid_request"
        self.gateway.desk.emit(RequestRejected(trace_id=trace_id, status=refusal.http_status, reason=reason,
                                          detail=refusal.message, retry_after_s=refusal.retry_after_s,
                                          observations=refusal.observations), trace_id, actor)
        refusal.headers.update(headers)
        raise refusal
