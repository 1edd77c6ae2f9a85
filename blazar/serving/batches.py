"""The batch runner: a task in the daemon that runs `/v1/batches` jobs through the same pipeline as interactive
requests (`Gateway.serve`: keys, admission, traces and metrics all apply), at the lowest priority.

    batch.created --validate every line--> batch.validated | batch.failed
    in_progress: each line's answer written to the content store, then `batch.line_done` (index, status, tokens)
    all lines done / cancelling with none running / the window passed --> the output and error files written, then
    file.uploaded (each) and batch.completed | batch.cancelled | batch.expired, in one append

What runs next is read from the `batches` projection, so a restarted daemon resumes each batch at its first line
without a `batch.line_done`: a finished line never runs twice, and a line that was running when the daemon stopped
(its answer not yet recorded) runs again.

No batch's input is held in memory: validation streams the file (blazar/serving/batch_input.py) and keeps each
line's byte offset (8 bytes a line), and a line is read from disk again, and parsed, when it runs; its body lives
while it runs. The output and error files are written line by line from the lines' results on disk.

Interactive requests first: a line is a Request with priority BACKGROUND_PRIORITY (below any a client may name), so
every interactive waiter is admitted before it, and batch waiters count in no queue depth that refuses interactive
requests (blazar/serving/admission.py). At most `batch_concurrency` lines are in flight at once (each holds one slot
while it generates: a line is never pre-empted, so an interactive request that finds every slot busy waits at most
for the first slot to free). A line refused for want of room (queue full or timed out, a key's rate limit) is tried
again after a pause, not failed.

A batch's output counts against its key's storage quota as it is written (blazar/serving/storage.py): each line's
result is kept only if it fits, and a line starts only while there is room. A result that does not fit stops the
batch: once the lines in flight land it ends `failed` (`storage_quota_exceeded` in its errors), its output and
error files holding every result kept so far, complete and in order. Nothing is written past the quota.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from array import array
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson

from blazar.context import Blazar, stamp_node
from blazar.dialects.tools import constrain
from blazar.errors import DialectError, Refused
from blazar.events.base import Event
from blazar.events.batches import (
    BATCH_ID,
    BatchError,
    BatchFailed,
    BatchLineDone,
    BatchValidated,
)
from blazar.ids import new_trace_id
from blazar.projections.batches import BatchesState, BatchRow, batch_row, done_lines, line_done, open_batches
from blazar.serving import batch_input, batch_lines, batch_output
from blazar.serving.admission import BACKGROUND_PRIORITY
from blazar.serving.batch_lines import Ask, Build, Line
from blazar.serving.batch_output import Ending
from blazar.serving.batch_owner import BatchOwner
from blazar.serving.gateway import Gateway
from blazar.serving.request import Answer
from blazar.serving.storage import ledger
from blazar.serving.tenancy import tenant_of
from blazar.store.files import FileStore

log = logging.getLogger("blazar.batches")

TICK_S = 0.5  # how often the runner looks for new work (a batch created, cancelled, its window passed)
# Refusals that say "not now" rather than "not this": the line waits and is tried again.
_RETRY = frozenset({"queue_full", "queue_timeout", "global_cap", "rate_limit_exceeded", "shutting_down"})
_RETRY_MAX_S = 30.0

class BatchRunner:
    def __init__(self, app: Blazar, gateway: Gateway, ask: Ask, store: FileStore | None = None, *,
                 build: Build | None = None, retry_pause_s: float = 1.0,
                 stopping: asyncio.Event | None = None) -> None:
        self.app = app
        self._stopping = stopping  # set when the daemon is stopping: no line starts after it
        self.retry_pause_s = retry_pause_s  # the first pause before a line refused for want of room is tried again
        self.gateway = gateway
        self.ask = ask
        self.build: Build = build if build is not None else (lambda endpoint, body, _tenant: ask(endpoint, body))
        self.store = store if store is not None else FileStore(app.paths)
        # Each open batch's line offsets (8 bytes a line; its lines are read from disk when they run), no line.
        self._offsets: dict[str, array[int]] = {}
        self._cursor: dict[str, int] = {}  # per batch: no line below this index is waiting to start
        self._ledger = ledger(app.paths)  # what is on its way to disk per key (shared with the upload route)
        # Batches stopped for want of storage: no line starts; once none runs they end failed with this error.
        self._halted: dict[str, BatchError] = {}
        self._flying: dict[tuple[str, int], asyncio.Task[None]] = {}
        self._wake = asyncio.Event()

    def _state(self) -> BatchesState:
        state: BatchesState = self.app.runner.state("batches")
        return state

    # -- the loop ------------------------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Until cancelled: settle what changed, start lines while there is room, wait a tick."""
        self._sweep()  # NOTE: synchronous, before the first await: no create can be under way yet
        try:
            while True:
                try:
                    await self._step()
                except Exception:
                    log.exception("the batch runner's step failed; it tries again")
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(TICK_S):
                        await self._wake.wait()
                self._wake.clear()
        finally:
            # NOTE: lines cancelled here record nothing: they run again after a restart.
            tasks = list(self._flying.values())
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _sweep(self) -> None:
        """Working directories no open batch owns (a batch that ended just before a crash removed its own, one whose
        `batch.created` never made it to the log) are removed at start."""
        try:
            names = [p.name for p in self.store.batches_dir.iterdir()]
        except FileNotFoundError:
            return
        open_ids = {b.batch_id for b in open_batches(self._state())}
        for name in names:
            if BATCH_ID.fullmatch(name) and name not in open_ids:
                self.store.remove_batch_work(name)

    async def _step(self) -> None:
        now = self.app.clock.now()
        for b in open_batches(self._state()):
            running = any(k[0] == b.batch_id for k in self._flying)
            if b.status == "validating":
                await self._validate(b)
            elif running:
                continue
            elif b.batch_id in self._halted:
                await self._finish(b, "failed", [self._halted.pop(b.batch_id)])
            elif now >= b.expires_at and b.completed + b.failed < b.total:
                await self._finish(b, "expired")
            elif b.status == "cancelling":
                await self._finish(b, "cancelled")
            elif b.completed + b.failed >= b.total:
                await self._finish(b, "completed")
        limit = self.app.settings().queue.batch_concurrency
        while len(self._flying) < limit and not (self._stopping is not None and self._stopping.is_set()):
            job = await self._next_line(now)
            if job is None:
                return
            b, index, offset = job
            task = asyncio.create_task(self._line(b, index, offset), name=f"blazar-batch-{b.batch_id}-{index}")
            self._flying[(b.batch_id, index)] = task
            task.add_done_callback(functools.partial(self._landed, (b.batch_id, index)))

    def _landed(self, key: tuple[str, int], task: asyncio.Task[None]) -> None:
        self._flying.pop(key, None)
        self._wake.set()
        if not task.cancelled() and (exc := task.exception()) is not None:
            # Nothing recorded: the line is tried again (its batch's window bounds how often).
            log.error("batch %s line %d failed before its outcome was recorded: %s", key[0], key[1], exc)
            self._cursor[key[0]] = min(self._cursor.get(key[0], 0), key[1])

    async def _next_line(self, now: float) -> tuple[BatchRow, int, int] | None:
        """The first line not done and not running of the oldest batch in progress (within its window): its batch,
        its index and its byte offset in the batch's input."""
        state = self._state()
        for b in open_batches(state):
            if b.status != "in_progress" or now >= b.expires_at or b.batch_id in self._halted:
                continue
            held = BatchOwner(self.app, b.owner).storage(self._state(), self._ledger)
            if held.room == 0:  # no result could be kept: the batch stops before another line runs
                self._halt(b.batch_id, held.refusal("no room is left for the next line's answer").message)
                continue
            offsets = await self._offsets_of(b)
            if offsets is None:
                continue
            i = self._cursor.get(b.batch_id, 0)
            while i < b.total and (line_done(state, b.batch_id, i) or (b.batch_id, i) in self._flying):
                i += 1
            self._cursor[b.batch_id] = i + 1
            if i < b.total:
                return b, i, offsets[i]
        return None

    async def _offsets_of(self, b: BatchRow) -> array[int] | None:
        """The byte offsets of the batch's lines: kept from its validation, or found again by reading its input (a
        restarted daemon). None, and the batch failed, when its copy of its input is gone or no longer has its
        lines."""
        offsets = self._offsets.get(b.batch_id)
        if offsets is not None:
            return offsets
        problem = None
        try:
            offsets = await asyncio.to_thread(batch_input.index, self.store.input_path(b.batch_id))
        except OSError as e:  # the batch's copy of its input is gone (a home restored without it)
            problem = BatchError(code="file_not_found", message=f"the batch's copy of its input file is gone "
                                 f"({e.strerror})")
        else:
            if len(offsets) != b.total:
                problem = BatchError(code="file_changed", message=f"the batch's copy of its input file holds "
                                     f"{len(offsets)} request lines, not the {b.total} it was validated with")
        if problem is not None:
            await self._record([BatchFailed(batch_id=b.batch_id, errors=[problem])], b.owner)
            return None
        assert offsets is not None
        self._offsets[b.batch_id] = offsets
        return offsets

    def _max_line_bytes(self) -> int:
        """A line is a request: its bound is a request body's (max_body_mib)."""
        return self.app.settings().server.max_body_mib << 20

    # -- validation ----------------------------------------------------------------------------------------------------

    async def _validate(self, b: BatchRow) -> None:
        path = self.store.input_path(b.batch_id)
        try:
            checked = await asyncio.to_thread(_check_file, path, b.endpoint, self.ask, self._max_line_bytes())
        except FileNotFoundError:
            await self._record([BatchFailed(batch_id=b.batch_id, errors=[BatchError(
                code="file_not_found", message=f"the input file {b.input_file_id} is gone")])], b.owner)
            return
        if checked.errors:
            await self._record([BatchFailed(batch_id=b.batch_id, errors=checked.errors)], b.owner)
            return
        self._offsets[b.batch_id] = checked.offsets
        await self._record([BatchValidated(batch_id=b.batch_id, lines=checked.count, models=checked.models,
                                           models_count=checked.models_count)], b.owner)

    # -- one line ------------------------------------------------------------------------------------------------------

    async def _line(self, b: BatchRow, index: int, offset: int) -> None:
        """Line `index` read from the batch's input (at `offset`), run, its result written and recorded."""
        limit = self._max_line_bytes()
        try:
            raw = await asyncio.to_thread(batch_input.read_line, self.store.input_path(b.batch_id), offset, limit)
            if raw is None:  # max_body_mib lowered since the batch was validated
                await self._done(b, index, Line(custom_id="", body={}), new_trace_id(), 413, _error_body(
                    f"the line is longer than {limit} bytes (server.max_body_mib)", 413, "line_too_large"))
                return
            line = batch_lines.parse(raw)
        except (OSError, ValueError, KeyError, TypeError) as e:  # the input changed under the batch
            await self._done(b, index, Line(custom_id="", body={}), new_trace_id(), 500,
                             _error_body(f"the line could not be read again from the batch's input: {e}", 500,
                                         "input_unreadable"))
            return
        pause = self.retry_pause_s
        while True:
            trace_id = new_trace_id()
            try:
                status, body = await self._ask(b, line, trace_id)
                break
            except Refused as e:
                if e.reason not in _RETRY:
                    words = BatchOwner(self.app, b.owner).told(e)
                    status, body = e.http_status, _error_body(words, e.http_status, e.reason)
                    break
                await asyncio.sleep(min(_RETRY_MAX_S, max(pause, e.retry_after_s or 0.0)))
                pause = min(_RETRY_MAX_S, pause * 2)
                now = self.app.clock.now()
                current = batch_row(self._state(), b.batch_id)
                if current is None or current.status != "in_progress" or now >= current.expires_at:
                    return  # cancelled or expired while it waited: it never ran
        await self._done(b, index, line, trace_id, status, body)

    async def _done(self, b: BatchRow, index: int, line: Line, trace_id: str, status: int, body: Any) -> None:
        """The line's result written to the content store, then its `batch.line_done`; when the result does not fit
        its key's storage, neither (the batch stops)."""
        prompt, completion = batch_lines.usage_of(body)
        data = batch_lines.answered(line.custom_id, trace_id, status, body)
        held = BatchOwner(self.app, b.owner).storage(self._state(), self._ledger)
        if not held.fits(len(data)):
            self._halt(b.batch_id, held.refusal(f"the answer to request {index + 1} of the batch ({len(data)} bytes) "
                                                "does not fit", len(data)).message)
            return
        # NOTE: held from the check until its batch.line_done is folded (no await between the check and the hold).
        with self._ledger.holding_bytes(b.owner, len(data)):
            await asyncio.to_thread(self.store.write_line, b.batch_id, index, data)
            await self._record([BatchLineDone(batch_id=b.batch_id, index=index,
                                              status="completed" if 200 <= status < 300 else "failed",
                                              status_code=status, trace_id=trace_id, prompt_tokens=prompt,
                                              completion_tokens=completion, result_bytes=len(data))], b.owner)

    def _halt(self, batch_id: str, message: str) -> None:
        """Stop the batch for want of storage: no line of it starts again; it ends failed once none runs."""
        self._halted.setdefault(batch_id, BatchError(code="storage_quota_exceeded", message=message))
        self._wake.set()

    async def _ask(self, b: BatchRow, line: Line, trace_id: str) -> tuple[int, Any]:
        """The line through the pipeline as its owner: (status, the answer's body)."""
        principal = BatchOwner(self.app, b.owner).principal()
        tenant = tenant_of(principal)
        try:
            asked = self.build(b.endpoint, line.body, tenant)
        except Exception as e:  # validated at creation: only a changed route could refuse it now
            return 400, _error_body(str(e), 400, "invalid_request")
        body = dict(line.body)
        chat = b.endpoint == "/v1/chat/completions"
        request = replace(asked, trace_id=trace_id, dialect="openai", path=b.endpoint, raw=orjson.dumps(body),
                          parsed=body, priority=BACKGROUND_PRIORITY, principal=principal, tenant=tenant,
                          forced=constrain(asked.body) if chat and asked.body is not None else asked.forced)
        try:
            answer = await self.gateway.serve(request)  # a line's images are checked as a request's are, in order
        except DialectError as e:
            return 400, _error_body(e.message, 400, e.code)
        except Refused:
            raise
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.exception("batch %s: a line failed", b.batch_id)
            return 500, _error_body(BatchOwner(self.app, b.owner).told(e), 500, "internal_error")
        return answer.status, await _body_of(answer)

    # -- the end -------------------------------------------------------------------------------------------------------

    async def _finish(self, b: BatchRow, ending: Ending, errors: list[BatchError] | None = None) -> None:
        """Write the output and error files from the lines' results on disk, then record them and the batch's end
        in one append (`errors`: why it failed, for a batch that ends failed); its working files go after."""
        done = done_lines(self._state(), b.batch_id)
        events = await batch_output.ending(self.store, b, done, ending, errors or [], self._offsets.get(b.batch_id),
                                           self._max_line_bytes())
        await self._record(events, b.owner)
        self._offsets.pop(b.batch_id, None)
        self._cursor.pop(b.batch_id, None)
        self._halted.pop(b.batch_id, None)
        await asyncio.to_thread(self.store.remove_batch_work, b.batch_id)

    async def _record(self, events: Sequence[Event], owner: str) -> None:
        """Durable (control events), as the batch's owner where it is a key, and folded before the next step."""
        node = self.app.node
        await self.app.log.append([stamp_node(e, node) if node else e for e in events], actor=owner or self.app.actor)
        await self.app.runner.catch_up()


def _check_file(path: Path, endpoint: str, ask: Ask, max_line_bytes: int) -> batch_lines.Checked:
    """Every line of the input file checked, read a chunk at a time (a worker thread's)."""
    with path.open("rb") as handle:
        return batch_lines.check(batch_input.spans(handle, keep=max_line_bytes), endpoint, ask, max_line_bytes)


def _error_body(message: str, status: int, code: str) -> dict[str, Any]:
    kind = "rate_limit_error" if status == 429 else "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "code": code, "param": None}}


async def _body_of(answer: Answer) -> Any:
    """The answer's body as JSON: the engine's bytes, a translated body, or the engine's refusal."""
    raw = answer.data if answer.data is not None else answer.refused
    if raw is not None:
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            return {"error": {"message": raw.decode(errors="replace")[:2000], "type": "server_error"}}
    if answer.stream is not None:  # a line asks for a whole answer; a stream is read to its end and kept as text
        chunks = [chunk async for chunk in answer.stream]
        return {"error": {"message": "the answer came as a stream", "type": "server_error",
                          "text": b"".join(chunks).decode(errors="replace")[:2000]}}
    return answer.media
