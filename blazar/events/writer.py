"""The group-commit writer: request events are handed over without waiting and committed in batches.

`submit` is synchronous and never touches disk, so the token path never waits on SQLite. One task drains the
buffer every `interval` seconds (or as soon as `max_batch` events are waiting) in one transaction. A failed
commit keeps the batch and retries with backoff; only a buffer past `max_pending` drops events, and every drop
is counted (`dropped`) because losing a request event silently would make `why` lie.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator

from blazar.errors import BlazarError
from blazar.events.base import Event, Pending
from blazar.events.log import EventLog

log = logging.getLogger(__name__)


# NOTE: batches only grow this large when events arrive faster than the disk takes them. Request events
# have random trace ids, so every event dirties its own pages of the stream and trace indexes and each
# commit writes those pages out (WAL, then checkpoint); larger transactions share more pages, and on a
# million-event log 16384 commits about a quarter more events/s than 4096 (bench/log.py). What a crash can
# lose is everything not yet committed, whatever the batch size: the buffer, bounded by `max_pending`.
MAX_BATCH = 16_384


class GroupCommitWriter:
    def __init__(
        self,
        event_log: EventLog,
        *,
        interval: float = 0.005,
        max_batch: int = MAX_BATCH,
        max_pending: int = 200_000,
    ) -> None:
        self._log = event_log
        self.interval = interval
        self.max_batch = max_batch
        self.max_pending = max_pending
        self._buffer: deque[Pending] = deque()
        self._wake = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self.committed = 0
        self.batches = 0
        self.dropped = 0
        self.failures = 0

    @property
    def pending_count(self) -> int:
        return len(self._buffer)

    def start(self) -> None:
        if self._task is None:
            self._stopping = False
            self._task = asyncio.get_running_loop().create_task(self._run(), name="blazar-group-commit")

    def submit(
        self,
        event: Event,
        *,
        actor: str,
        stream: str | None = None,
        trace_id: str | None = None,
        cause: int | None = None,
    ) -> None:
        """Queue an event for the next batch. Never blocks and never awaits."""
        if len(self._buffer) >= self.max_pending:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 10_000 == 0:
                log.error("group-commit buffer full (%d): %d request events dropped", self.max_pending, self.dropped)
            return
        self._buffer.append(self._log.pending(event, actor=actor, stream=stream, trace_id=trace_id, cause=cause))
        self._drained.clear()
        if len(self._buffer) >= self.max_batch or not self._wake.is_set():
            self._wake.set()

    async def flush(self) -> None:
        """Wait until everything submitted so far is committed."""
        if self._task is None:
            await self._drain_once(all_of_it=True)
            return
        self._wake.set()
        await self._drained.wait()

    async def stop(self) -> None:
        """Commit what is buffered, then end the writer task."""
        self._stopping = True
        self._wake.set()
        if self._task is not None:
            await self._task
            self._task = None
        await self._drain_once(all_of_it=True)

    async def _run(self) -> None:
        backoff = self.interval
        while True:
            await self._wake.wait()
            if not self._stopping and len(self._buffer) < self.max_batch:
                # Gather: let more events join this batch, up to `interval`.
                await asyncio.sleep(self.interval)
            self._wake.clear()
            try:
                await self._drain_once(all_of_it=self._stopping)
                backoff = self.interval
            except Exception as exc:  # NOTE: never the end of the writer: the batch stays buffered and is tried again
                self.failures += 1
                if isinstance(exc, BlazarError):
                    log.error("group commit failed (%s); retrying in %.3fs", exc, backoff)
                else:
                    log.exception("group commit failed unexpectedly; retrying in %.3fs", backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)
                self._wake.set()
                continue
            if self._buffer:
                self._wake.set()
            elif self._stopping:
                return

    async def _drain_once(self, *, all_of_it: bool) -> None:
        while self._buffer:
            batch = [self._buffer[i] for i in range(min(self.max_batch, len(self._buffer)))]
            await self._log.commit_pending(batch)
            # Only now are they durable; a failed commit leaves them buffered for the retry.
            for _ in batch:
                self._buffer.popleft()
            self.committed += len(batch)
            self.batches += 1
            if not all_of_it:
                break
        if not self._buffer:
            self._drained.set()


@contextlib.asynccontextmanager
async def running_writer(
    event_log: EventLog, *, interval: float = 0.005, max_batch: int = MAX_BATCH, max_pending: int = 200_000
) -> AsyncIterator[GroupCommitWriter]:
    writer = GroupCommitWriter(event_log, interval=interval, max_batch=max_batch, max_pending=max_pending)
    writer.start()
    try:
        yield writer
    finally:
        await writer.stop()
