"""Falcon's ASGIConductor as a local client would use it: Host `localhost` (falcon's default, falconframework.org,
is refused by the gateway's Host guard, as any name a loopback bind does not answer to), and a client that waits for
its answer. falcon's test client reports a hang-up (`http.disconnect`) as soon as it has sent the request, which
Blazar's disconnect watcher (blazar/api/disconnect.py) would take for one the moment a request waits for anything
(an image decoded in a thread, a queue); a real client says nothing more until its answer has ended."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from falcon.testing import ASGIConductor

Message = MutableMapping[str, Any]
ASGIApp = Callable[[MutableMapping[str, Any], Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]],
                   Awaitable[None]]


class Patient:
    """An ASGI wrapper: after the request's body, `receive` waits until the response has ended, then says the client
    is gone (the connection closes)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: MutableMapping[str, Any], receive: Callable[[], Awaitable[Message]],
                       send: Callable[[Message], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        answered = asyncio.Event()
        body_in = False

        async def patient_receive() -> Message:
            nonlocal body_in
            if body_in:
                await answered.wait()
                return {"type": "http.disconnect"}
            event = await receive()
            if event["type"] == "http.request" and not event.get("more_body", False):
                body_in = True
            return event

        async def watched_send(event: Message) -> None:
            await send(event)
            if event["type"] == "http.response.body" and not event.get("more_body", False):
                answered.set()

        await self.app(scope, patient_receive, watched_send)


class LocalConductor(ASGIConductor):
    def __init__(self, app: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(Patient(app), *args, **kwargs)

    async def simulate_request(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("host", "localhost")
        return await super().simulate_request(*args, **kwargs)
