"""A hand-written HTTP/1.1 child on loopback, for engine-client tests that need exact control over the bytes: it
reads one request whole, and the test's handler answers (or drops, or cuts) as the case needs."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> None:
    """One request, head and Content-Length body, read whole."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    await reader.readexactly(length)


@contextlib.asynccontextmanager
async def serving(handle: Handler) -> AsyncIterator[str]:
    """`handle` listening on a free loopback port: yields its base URL."""
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        await server.wait_closed()
