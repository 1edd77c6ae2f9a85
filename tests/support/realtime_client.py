"""What the realtime suites do with the `openai` SDK's realtime connection: read the server's events up to one type,
bounded in time and count."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.support.bounds import HANG_S


async def until(conn: Any, last: str, within_s: float = HANG_S, limit: int = 10_000) -> list[Any]:
    """The server's events up to and including the first of type `last`."""
    seen: list[Any] = []
    async with asyncio.timeout(within_s):
        while len(seen) < limit:
            e = await conn.recv()
            seen.append(e)
            if e.type == last:
                return seen
    raise AssertionError(f"no {last} in {len(seen)} events")
