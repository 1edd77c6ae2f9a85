"""The group-commit writer: request events are handed over without waiting and committed in batches.

`submit` is synchronous and never touches disk, so the token path never waits on SQLite. One task drains the
buffer every `interval` seconds (or as soon as `max_batch` events are waiting) in one transaction. A failed
commit (a full disk, a database away) keeps the batch and retries with backoff, for as long as it takes; while it
fails, `stalled` says so and `last_error` says why (`/ready` reports it). Only a buffer past `max_pending` drops
events: each new one is refused and counted (`dropped`), because losing a request event silently would make `why`
lie; the events already buffered are kept and land once a commit succeeds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from dataclasses import replace

from blazar.errors import BlazarError
from blazar.events.base import Event, Pending
from blazar.events.log import EventLog
from blazar.events.types import encode

log = logging.getLogger(__name__)


# NOTE: batches only grow this large when events arrive faster than the disk takes them. Request events
# have random trace ids, so every event dirties its own pages of the stream and trace indexes and each
# commit writes those pages out (WAL, then checkpoint); larger transactions share more pages, and on a
# million-event log 16384 commits about a quarter more events/s than 4096 (bench/log.py). What a crash can
# lose is everything not yet committed, whatever the batch size: the buffer, bounded by `max_pending`.
MAX_BATCH = 16_384
# While commits keep failing, the same error is logged at most this often (the retries go on every second).
FAILURE_LOG_EVERY_S = 30.0
# How long `stop` keeps retrying a failing commit before it gives the buffered events up.
STOP_WAIT_S = 10.0
STOP_POLL_S = 0.1


class GroupCommitWriter:
    def __init__(
        self,
        event_log: EventLog,
        *,
        interval: float = 0.005,
        max_batch: int = MAX_BATCH,
        max_pending: int = 200_000,
        stop_wait_s: float = STOP_WAIT_S,
    ) -> None:
        self._log = event_log
        self.stop_wait_s = stop_wait_s
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
        self.last_error: Exception | None = None  # why the last commit failed; None once one succeeds
        self.failing_since: float | None = None  # the log clock's monotonic() at the first failure in a row
        self._logged_at = 0.0
        self._failed_in_row = 0

    @property
    def pending_count(self) -> int:
        return len(self._buffer)

    @property
    def stalled(self) -> bool:
        """Events wait in memory that the last commit could not write."""
        return self.last_error is not None and bool(self._buffer)

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
        """Queue an event for the next batch. Never blocks and never awaits. An event over the log's bound raises
        EventTooLarge here, at the code that built it (in a batch it would fail every other event with it)."""
        if len(self._buffer) >= self.max_pending:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 10_000 == 0:
                log.error("group-commit buffer full (%d): %d request events dropped", self.max_pending, self.dropped)
            return
        pending = self._log.pending(event, actor=actor, stream=stream, trace_id=trace_id, cause=cause)
        self._buffer.append(replace(pending, data=encode(event, self._log.max_event_bytes)))
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
        """Commit what is buffered, then end the writer task. While commits fail (a full disk), the retries go on
        for at most `stop_wait_s`: a stopping process does not wait forever on its disk, and what it could not write
        is logged as lost (with the count) when it gives up."""
        self._stopping = True
        self._wake.set()
        if self._task is not None:
            loop = asyncio.get_running_loop()
            give_up_at: float | None = None
            while not self._task.done():
                await asyncio.wait({self._task}, timeout=STOP_POLL_S)
                if not self.stalled:
                    give_up_at = None  # a slow disk that takes the events is waited for
                elif give_up_at is None:
                    give_up_at = loop.time() + self.stop_wait_s
                elif loop.time() >= give_up_at:
                    break
            if not self._task.done():
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
                self._task = None
                self.dropped += len(self._buffer)
                log.error("stopping with %d request event(s) the log could not take (%s): they are lost",
                          len(self._buffer), self.last_error)
                self._buffer.clear()
                self._drained.set()
                return
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
                self._failed(exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)
                self._wake.set()
                continue
            if self._buffer:
                self._wake.set()
            elif self._stopping:
                return

    def _failed(self, exc: Exception, backoff: float) -> None:
        self.failures += 1
        self._failed_in_row += 1
        now = self._log.clock.monotonic()
        first = self.last_error is None
        self.last_error = exc
        if first:
            self.failing_since = now
        elif now - self._logged_at < FAILURE_LOG_EVERY_S:
            return
        self._logged_at = now
        waiting = f"{len(self._buffer)} request event(s) wait in memory"
        if isinstance(exc, BlazarError):
            log.error("group commit failed (%s); %s; retrying in %.3fs", exc, waiting, backoff)
        else:
            log.error("group commit failed unexpectedly; %s; retrying in %.3fs", waiting, backoff, exc_info=exc)

    async def _drain_once(self, *, all_of_it: bool) -> None:
        while self._buffer:
            batch = [self._buffer[i] for i in range(min(self.max_batch, len(self._buffer)))]
            await self._log.commit_pending(batch)
            # Only now are they durable; a failed commit leaves them buffered for the retry.
            for _ in batch:
                self._buffer.popleft()
            self.committed += len(batch)
            self.batches += 1
            if self.last_error is not None:
                log.warning("group commit works again after %.1fs (%d failed attempt(s)); %d event(s) dropped "
                            "in all", self._log.clock.monotonic() - (self.failing_since or 0.0), self._failed_in_row,
                            self.dropped)
                self.last_error = self.failing_since = None
                self._failed_in_row = 0
            if not all_of_it:
                break
        if not self._buffer:
            self._drained.set()

