"""The engine client against a loopback child that drops requests without answering (a stale pooled connection, or
no HTTP thread free in the child): it retries on a fresh connection with a short backoff, and gives up with
EngineUnreachable; a child that is not there at all is unreachable at once."""

from __future__ import annotations

import asyncio

import pytest

from blazar.adapters.engines.client import RETRY_BACKOFF_S, EngineClient
from blazar.errors import EngineStreamBroken, EngineUnreachable
from tests.support.bounds import HANG_S
from tests.support.loopback_child import read_request, serving


class DroppingChild:
    """Reads each request whole, then closes the connection unanswered for the first `drops`, else answers."""

    def __init__(self, drops: int, *, cut_body: bool = False) -> None:
        self.drops, self.cut_body, self.requests = drops, cut_body, 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await read_request(reader)
            self.requests += 1
            if self.requests > self.drops:
                if self.cut_body:  # announces 100 bytes, sends 5, hangs up
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nhello")
                else:
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n"
                                 b'{"ok":true}')
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def test_a_dropped_request_is_retried_until_the_engine_answers() -> None:
    child = DroppingChild(len(RETRY_BACKOFF_S) - 1)
    client = EngineClient()
    try:
        async with serving(child.handle) as base, asyncio.timeout(HANG_S):
            r = await client.open(base, "/v1/chat/completions", b"{}")
            assert r.status_code == 200 and await r.aread() == b'{"ok":true}'
            await r.aclose()
        assert child.requests == len(RETRY_BACKOFF_S)
    finally:
        await client.aclose()


async def test_an_engine_that_keeps_dropping_is_unreachable() -> None:
    child = DroppingChild(100)
    client = EngineClient()
    try:
        async with serving(child.handle) as base, asyncio.timeout(HANG_S):
            with pytest.raises(EngineUnreachable, match="did not answer /v1/chat/completions"):
                await client.open(base, "/v1/chat/completions", b"{}")
        assert child.requests == len(RETRY_BACKOFF_S)
    finally:
        await client.aclose()


async def test_a_body_cut_short_is_a_broken_stream() -> None:
    client = EngineClient()
    try:
        async with serving(DroppingChild(0, cut_body=True).handle) as base, asyncio.timeout(HANG_S):
            r = await client.open(base, "/v1/chat/completions", b"{}")
            with pytest.raises(EngineStreamBroken):
                async for _ in r.aiter_raw():
                    pass
            await r.aclose()
    finally:
        await client.aclose()


async def test_no_child_at_all_is_unreachable_at_once() -> None:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    client = EngineClient()
    try:
        with pytest.raises(EngineUnreachable):
            await client.open(f"http://127.0.0.1:{port}", "/v1/chat/completions", b"{}")
    finally:
        await client.aclose()


async def test_a_small_exchange_is_retried_too_and_gives_up_after_the_last_try() -> None:
    """A token count or a slot action (`post_json`) on a connection the child dropped unanswered: the same retries."""
    client = EngineClient()
    try:
        answered = DroppingChild(len(RETRY_BACKOFF_S) - 1)
        async with serving(answered.handle) as base, asyncio.timeout(HANG_S):
            assert await client.post_json(base, "/tokenize", {"content": "x"}) == (200, {"ok": True})
        assert answered.requests == len(RETRY_BACKOFF_S)
        dropped = DroppingChild(len(RETRY_BACKOFF_S))
        async with serving(dropped.handle) as base, asyncio.timeout(HANG_S):
            with pytest.raises(EngineUnreachable, match="/tokenize"):
                await client.post_json(base, "/tokenize", {"content": "x"})
        assert dropped.requests == len(RETRY_BACKOFF_S)
    finally:
        await client.aclose()
