"""The engine client retries a request the engine dropped without answering (a stale pooled connection, or no HTTP
thread free in the child), on a fresh connection and with a short backoff, and gives up with EngineUnreachable."""

from __future__ import annotations

import httpx2
import pytest

from blazar.adapters.engines.client import RETRY_BACKOFF_S, EngineClient
from blazar.errors import EngineUnreachable


def _dropping(times: int) -> tuple[httpx2.MockTransport, list[int]]:
    calls: list[int] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        calls.append(1)
        if len(calls) <= times:
            raise httpx2.RemoteProtocolError("Server disconnected without sending a response.")
        return httpx2.Response(200, content=b'{"ok":true}')

    return httpx2.MockTransport(handler), calls


async def test_a_dropped_request_is_retried_until_the_engine_answers() -> None:
    transport, calls = _dropping(len(RETRY_BACKOFF_S) - 1)
    client = EngineClient(transport=transport)
    try:
        r = await client.open("http://127.0.0.1:1", "/v1/chat/completions", b"{}")
        assert r.status_code == 200 and len(calls) == len(RETRY_BACKOFF_S)
        await r.aclose()
    finally:
        await client.aclose()


async def test_an_engine_that_keeps_dropping_is_unreachable() -> None:
    transport, calls = _dropping(100)
    client = EngineClient(transport=transport)
    try:
        with pytest.raises(EngineUnreachable, match="did not answer /v1/chat/completions"):
            await client.open("http://127.0.0.1:1", "/v1/chat/completions", b"{}")
        assert len(calls) == len(RETRY_BACKOFF_S)
    finally:
        await client.aclose()
