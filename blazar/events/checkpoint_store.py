"""The checkpoints table beside the log: each projection's folded state at a seq (derived data: dropping it costs a
fold from the start, never an event). Both stores keep it, through the statements they run."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

Rows = list[tuple[Any, ...]]

_COLUMNS = "name, version, seq, anchor, state, sha256"
# One statement both databases take (SQLite since 3.24): a checkpoint replaces the projection's older one.
_PUT = ("INSERT INTO checkpoints (name, version, seq, anchor, state, sha256, ts)"
        " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET version = excluded.version,"
        " seq = excluded.seq, anchor = excluded.anchor, state = excluded.state, sha256 = excluded.sha256,"
        " ts = excluded.ts")


class CheckpointStore:
    """Reads and writes the checkpoints table with its log store's `fetch` and `execute_write`."""

    def __init__(self, fetch: Callable[[str, Sequence[Any]], Awaitable[Rows]],
                 execute_write: Callable[[str, Sequence[Sequence[Any]] | None], Awaitable[None]]) -> None:
        self._fetch, self._execute_write = fetch, execute_write

    async def rows(self) -> Rows:
        """Every stored checkpoint: (name, version, seq, anchor, state, sha256)."""
        return await self._fetch(f"SELECT {_COLUMNS} FROM checkpoints", ())

    async def put(self, rows: list[tuple[Any, ...]]) -> None:
        """Write (name, version, seq, anchor, state, sha256, ts) rows, replacing older ones, in one transaction."""
        await self._execute_write(_PUT, rows)

    async def clear(self) -> None:
        await self._execute_write("DELETE FROM checkpoints", None)
