"""The caller behind a realtime connection, as each internal request of its session is made: the gateway that
serves it, the key (its principal and tenant), the client's address and agent, and how an error is told in the
words that caller may read. The session's chats (blazar/api/realtime.py), transcriptions (realtime_hear.py) and
speech (realtime_voice.py) are each a `Request` of this caller, recorded under the route /v1/realtime."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from blazar.serving.gateway import Gateway
from blazar.serving.principal import Principal
from blazar.serving.request import Request
from blazar.serving.tenancy import tenant_of

PATH = "/v1/realtime"


@dataclass(frozen=True, slots=True)
class Caller:
    gateway: Gateway
    principal: Principal | None
    client: str | None
    agent: str | None
    tell: Callable[[BaseException], str]  # an error in the words its caller may read (blazar/api/errors.py Audience)

    def request(self, **asked: Any) -> Request:
        """An internal request of this caller: what it asks (`model`, `engine_path`, ...), as the OpenAI dialect."""
        return Request(dialect="openai", path=PATH, client=self.client, agent=self.agent, principal=self.principal,
                       tenant=tenant_of(self.principal), **asked)
