"""The engine client's heartbeat (`EngineResponse.aiter_raw(heartbeat_s)`), against a loopback child that streams as
llama-server does: headers at once, its `:` keep-alive while it reads the prompt, then its events. Until the first
event the client gets b"" for each silence and each keep-alive; from then on the bytes alone. No clocks: the child
sends its first event only once the test has seen the heartbeats it asked for."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import cast

from blazar.adapters.engines.client import EngineClient
from tests.support.bounds import HANG_S
from tests.support.loopback_child import read_request, serving

EVENT = b'data: {"choices":[]}\n\n'


class PromptReadingChild:
    """Answers a stream: its keep-alive comment, then holds until `released`, then EVENT, a late keep-alive (passed
    on as it is: not before the first event) and [DONE]."""

    def __init__(self) -> None:
        self.released = asyncio.Event()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            for data in (b":\n\n", None, EVENT, b":\n\n", b"data: [DONE]\n\n"):
                if data is None:
                    await self.released.wait()
                    continue
                writer.write(b"%x\r\n%s\r\n" % (len(data), data))
                await writer.drain()
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def _read(heartbeat_s: float | None, beats_before_release: int) -> list[bytes]:
    child, client = PromptReadingChild(), EngineClient()
    got: list[bytes] = []
    try:
        async with serving(child.handle) as base, asyncio.timeout(HANG_S):
            r = await client.open(base, "/v1/chat/completions", b'{"stream":true}')
            if heartbeat_s is None:
                child.released.set()
            async for block in r.aiter_raw(heartbeat_s):
                got.append(block)
                if got.count(b"") == beats_before_release:
                    child.released.set()
            await r.aclose()
    finally:
        await client.aclose()
    return got


async def test_silence_and_the_engines_keepalive_are_heartbeats_until_the_first_event() -> None:
    got = await _read(0.001, beats_before_release=4)
    first = got.index(next(b for b in got if b))
    assert first >= 4 and not any(got[:first])  # the keep-alive and the silences: heartbeats, no bytes
    rest = b"".join(got[first:])
    assert rest == EVENT + b":\n\n" + b"data: [DONE]\n\n" and b"" not in got[first:]


async def test_without_a_heartbeat_the_bytes_come_as_they_are() -> None:
    got = await _read(None, beats_before_release=0)
    assert b"".join(got) == b":\n\n" + EVENT + b":\n\n" + b"data: [DONE]\n\n" and b"" not in got


async def test_a_client_gone_while_the_engine_reads_closes_the_stream() -> None:
    child, client = PromptReadingChild(), EngineClient()
    try:
        async with serving(child.handle) as base, asyncio.timeout(HANG_S):
            r = await client.open(base, "/v1/chat/completions", b'{"stream":true}')
            blocks = cast(AsyncGenerator[bytes, None], r.aiter_raw(0.001))  # an async generator: it closes
            assert await anext(blocks) == b""
            await blocks.aclose()  # the relay's client hung up: it stops reading and closes the upstream
            await r.aclose()
            assert r.is_closed
    finally:
        await client.aclose()
