"""A request's checks, in the one order every inference route keeps (docs/2.ARCHITECTURE.md, "One order for every
request"): the model resolved, the key's scope, the model's kind and capabilities, the key's limits (charged), and
only then any work on the body's content (its images and audio read, a route's own `prepare`). `Gateway.serve` runs
`caller` and then `content` on every request's Call; a refusal raised here ends the call there, recorded.
"""

from __future__ import annotations

from blazar.context import Blazar
from blazar.errors import Refused
from blazar.events.requests import RequestMediaChecked
from blazar.serving import media
from blazar.serving.call import Call
from blazar.serving.limits import Limiter, LimitExceeded
from blazar.serving.principal import Principal, scope_refusal
from blazar.serving.resolve import Resolver


class Checks:
    def __init__(self, app: Blazar, resolver: Resolver, limits: Limiter) -> None:
        self.app, self.resolver, self.limits = app, resolver, limits

    def caller(self, call: Call) -> None:
        """The caller's checks, in order; nothing of the body's content has been read yet. Raises Refused."""
        p = call.request.principal
        if p is not None and p.key is None:
            p = None  # keys off, or the CLI's own credential: no scope, no limits
        try:
            call.take_route(self.resolver.resolve(call))
        except Refused:
            if p is not None and not p.allows(call.model, call.model):
                refuse_scope(p, call.model, call.model)  # a 403, not a 404: nothing said of a name outside it
            raise
        assert call.name is not None
        if p is not None and not p.allows(call.model, call.name):
            refuse_scope(p, call.model, call.name)
        self.resolver.check_kind(call)
        if not call.route.elsewhere:
            media.refuse_unless_projector(self.app.runner.state("catalog"), call.model, media.carried(call.request))
        if p is not None:
            self._take_lease(call, p)

    def _take_lease(self, call: Call, p: Principal) -> None:
        """Do the key's limits allow one more request now? Takes its concurrency lease (and counts its rpm)."""
        limits = p.limits()
        assert limits is not None
        try:
            call.take_lease(self.limits.acquire(limits))
        except LimitExceeded as e:
            raise Refused(e.message, reason="rate_limit_exceeded", http_status=429, retry_after_s=e.retry_after_s,
                          observations={"key": p.key_name, "limit": e.limit, "value": e.value}) from None

    async def content(self, call: Call) -> None:
        """The work on the body's content, once the caller's checks allow it: a chat's images and audio read and
        checked (blazar/serving/media.py; a 400 when they are not what they claim or over the bounds), the route's
        own `prepare` (an upload's audio measured). Their facts are recorded as `request.media_checked`."""
        r = call.request
        checked = await media.prepare(r, self.app.settings(), self.app.runner.state("catalog"))
        if checked.hooks.prepare is not None:
            checked = await checked.hooks.prepare(checked)
        if checked is r:
            return
        call.prepared(checked)
        if checked.media is not None:
            call.emit(RequestMediaChecked(trace_id=r.trace_id, media=checked.media))


def refuse_scope(p: Principal, model: str, name: str) -> None:
    raise Refused(scope_refusal(p, model, name), reason="model_not_allowed", http_status=403,
                  observations={"key": p.key_name, "models": list(p.models)}, error_type="permission_error")


def body_bytes(call: Call) -> int:
    """The body's size as it came, for `request.received`: an upload's file (framed for its child only once it is
    measured, in `Checks.content`) counts as its bytes."""
    r = call.request
    if r.hooks.prepare is not None and r.audio is not None and r.audio.input_bytes is not None:
        return r.audio.input_bytes
    return len(call.ask.payload())
