"""What one step of a call asks its engine: the body (the call's own copy, made at its first change, so the Request's
and the client's stay as they came; encoded once per change), the output's limit and the context per slot. Patches
(blazar/serving/patch.py) fill it, the context check caps its output (`bound_output`) and a request routed again
forgets that cap (`unbound`); a cascade's step starts a new one (`Call.retarget`).
"""

from __future__ import annotations

from typing import Any

import orjson

from blazar.events.requests import ReasoningFacts
from blazar.serving.context_fit import BOUNDED_HEADER
from blazar.serving.patch import Patch
from blazar.serving.request import Request
from blazar.serving.tenancy import IGNORED_HEADER


class EngineAsk:
    def __init__(self, request: Request) -> None:
        self._request = request
        self.max_tokens = request.max_tokens
        self.ctx = request.ctx
        self.bounded_max_tokens: int | None = None  # max_tokens capped to what the context left (check_context)
        self.loop_guarded = False  # a streamed chat answer stopped where it loops (blazar/serving/loop_guard.py)
        self.reasoning: ReasoningFacts | None = None  # its thinking's budget (blazar/serving/reasoning.py)
        self._unbounded: tuple[int | None, dict[str, Any]] | None = None  # what the cap replaced
        self._body = request.body
        self._own_body = False
        self._payload: bytes | None = None

    @property
    def body(self) -> dict[str, Any] | None:
        """The engine's body as it goes (None: the client's bytes as they came)."""
        return self._body

    def engine_body(self) -> dict[str, Any]:
        """The engine's body as an object (for counting tokens): the translated one, or the client's."""
        return self._body if self._body is not None else self._request.parsed

    def _writable(self) -> dict[str, Any]:
        if not self._own_body:
            self._body = dict(self._body if self._body is not None else self._request.parsed)
            self._own_body = True
        self._payload = None
        assert self._body is not None
        return self._body

    def payload(self) -> bytes:
        """The bytes the engine is sent (encoded once per change of the body)."""
        if self._payload is None:
            self._payload = self._request.raw if self._body is None else orjson.dumps(self._body)
        return self._payload

    def apply(self, patch: Patch) -> None:
        """A patch's fields set in the body (and those it drops dropped); its max_tokens and context where none is
        set; its loop guard and its thinking's budget."""
        if patch.fields:
            self._writable().update(patch.fields)
        if patch.drop:
            self.drop_fields(*patch.drop)
        if patch.max_tokens is not None and self.max_tokens is None:
            self.max_tokens = patch.max_tokens
        if patch.ctx is not None and self.ctx is None:
            self.ctx = patch.ctx
        self.loop_guarded = self.loop_guarded or patch.loop_guarded
        if patch.reasoning is not None:  # decided again where the request is routed again
            self.reasoning = patch.reasoning

    def headers(self) -> dict[str, str]:
        """What the answer tells the client of this ask: the output's limit the context capped, and a thinking
        budget the engine's load flag held instead of the request's (blazar/serving/reasoning.py)."""
        out: dict[str, str] = {}
        if self.bounded_max_tokens is not None:
            out[BOUNDED_HEADER] = str(self.bounded_max_tokens)
        if self.reasoning is not None and self.reasoning.requested is not None:
            out[IGNORED_HEADER] = (f"thinking_budget (this engine build holds every request to its load flag's "
                                   f"{self.reasoning.budget} tokens)")
        return out

    def drop_fields(self, *names: str) -> None:
        """Forget what a placement told an engine (unless the client asked it): the next one says its own."""
        if self._body is None:
            return
        body = self._writable()
        for name in names:
            if name not in self._request.parsed:
                body.pop(name, None)

    def bound_output(self, max_tokens: int, fields: dict[str, int]) -> None:
        """The output capped at `max_tokens` (routing's context decision) by setting the engine's limit `fields`;
        what they were is kept for `unbound`."""
        body = self._writable()
        if self._unbounded is None:
            self._unbounded = (self.max_tokens, {name: body.get(name) for name in fields})
        body.update(fields)
        self.max_tokens = self.bounded_max_tokens = max_tokens

    def unbound(self) -> None:
        """The cap forgotten (a request routed again: the next instance's context decides afresh)."""
        if self._unbounded is None:
            return
        self.max_tokens, fields = self._unbounded
        body = self._writable()
        for name, value in fields.items():
            if value is None:
                body.pop(name, None)
            else:
                body[name] = value
        self._unbounded = self.bounded_max_tokens = None

    @property
    def changed(self) -> bool:
        """Whether anything changed the body (the content is checked before anything does)."""
        return self._own_body
