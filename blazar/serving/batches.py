"""The batch runner: a task in the daemon that runs `/v1/batches` jobs through the same pipeline as interactive
requests (`Gateway.serve`: keys, admission, traces and metrics all apply), at the lowest priority.

    batch.created --validate every line--> batch.validated | batch.failed
    in_progress: each line's answer written to the content store, then `batch.line_done` (index, status, tokens)
    all lines done / cancelling with none running / the window passed --> the output and error files written, then
    file.uploaded (each) and batch.completed | batch.cancelled | batch.expired, in one append

What runs next is read from the `batches` projection, so a restarted daemon resumes each batch at its first line
without a `batch.line_done`: a finished line never runs twice, and a line that was running when the daemon stopped
(its answer not yet recorded) runs again.

Interactive requests first: a line is a Request with priority BACKGROUND_PRIORITY (below any a client may name), so
every interactive waiter is admitted before it, and batch waiters count in no queue depth that refuses interactive
requests (blazar/serving/admission.py). At most `batch_concurrency` lines are in flight at once (each holds one slot
while it generates: a line is never pre-empted, so an interactive request that finds every slot busy waits at most
for the first slot to free). A line refused for want of room (queue full or timed out, a key's rate limit) is tried
again after a pause, not failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Literal

import orjson

from blazar.context import Blazar, stamp_node
from blazar.dialects.tools import constrain
from blazar.errors import BlazarError, DialectError, Refused
from blazar.events.base import Event
from blazar.events.batches import (
    BATCH_ID,
    BatchCancelled,
    BatchCompleted,
    BatchError,
    BatchExpired,
    BatchFailed,
    BatchLineDone,
    BatchValidated,
    FileUploaded,
)
from blazar.ids import new_trace_id
from blazar.projections.batches import BatchesState, BatchRow, batch_row, done_lines, line_done, open_batches
from blazar.projections.keys import key as key_named
from blazar.redact import machine_roots, told
from blazar.serving import batch_lines
from blazar.serving.admission import BACKGROUND_PRIORITY
from blazar.serving.batch_lines import Ask, Build, Line
from blazar.serving.gateway import Gateway
from blazar.serving.principal import Principal
from blazar.serving.request import Answer
from blazar.serving.tenancy import tenant_of
from blazar.store.files import FileStore

log = logging.getLogger("blazar.batches")

TICK_S = 0.5  # how often the runner looks for new work (a batch created, cancelled, its window passed)
# Refusals that say "not now" rather than "not this": the line waits and is tried again.
_RETRY = frozenset({"queue_full", "queue_timeout", "global_cap", "rate_limit_exceeded", "shutting_down"})
_RETRY_MAX_S = 30.0

Ending = Literal["completed", "cancelled", "expired"]


def derived_file_id(batch_id: str, which: str) -> str:
    """The id of a batch's output or error file, the same however often its finishing is tried again (a crash
    between writing it and recording it leaves no second copy)."""
    return "file-" + hashlib.sha256(f"{batch_id}:{which}".encode()).hexdigest()[:24]


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
        self._inputs: dict[str, list[Line]] = {}  # each running batch's lines, parsed once
        self._cursor: dict[str, int] = {}  # per batch: no line below this index is waiting to start
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
            elif now >= b.expires_at and b.completed + b.failed < b.total:
                await self._finish(b, "expired")
            elif b.status == "cancelling":
                await self._finish(b, "cancelled")
            elif b.completed + b.failed >= b.total:
                await self._finish(b, "completed")
        limit = self.app.settings().batch_concurrency
        while len(self._flying) < limit and not (self._stopping is not None and self._stopping.is_set()):
            job = await self._next_line(now)
            if job is None:
                return
            b, index, line = job
            task = asyncio.create_task(self._line(b, index, line), name=f"blazar-batch-{b.batch_id}-{index}")
            self._flying[(b.batch_id, index)] = task
            task.add_done_callback(functools.partial(self._landed, (b.batch_id, index)))

    def _landed(self, key: tuple[str, int], task: asyncio.Task[None]) -> None:
        self._flying.pop(key, None)
        self._wake.set()
        if not task.cancelled() and (exc := task.exception()) is not None:
            # Nothing recorded: the line is tried again (its batch's window bounds how often).
            log.error("batch %s line %d failed before its outcome was recorded: %s", key[0], key[1], exc)
            self._cursor[key[0]] = min(self._cursor.get(key[0], 0), key[1])

    async def _next_line(self, now: float) -> tuple[BatchRow, int, Line] | None:
        """The first line not done and not running of the oldest batch in progress (within its window)."""
        state = self._state()
        for b in open_batches(state):
            if b.status != "in_progress" or now >= b.expires_at:
                continue
            try:
                lines = await self._lines(b.batch_id)
            except OSError as e:  # the batch's copy of its input is gone (a home restored without it)
                await self._record([BatchFailed(batch_id=b.batch_id, errors=[BatchError(
                    code="file_not_found", message=f"the batch's copy of its input file is gone ({e.strerror})")])],
                    b.owner)
                continue
            i = self._cursor.get(b.batch_id, 0)
            while i < b.total and (line_done(state, b.batch_id, i) or (b.batch_id, i) in self._flying):
                i += 1
            self._cursor[b.batch_id] = i + 1
            if i < min(b.total, len(lines)):
                return b, i, lines[i]
        return None

    async def _lines(self, batch_id: str) -> list[Line]:
        lines = self._inputs.get(batch_id)
        if lines is None:
            data = await asyncio.to_thread(self.store.input_path(batch_id).read_bytes)
            lines = self._inputs[batch_id] = await asyncio.to_thread(batch_lines.parse, data)
        return lines

    # -- validation ----------------------------------------------------------------------------------------------------

    async def _validate(self, b: BatchRow) -> None:
        try:
            data = await asyncio.to_thread(self.store.input_path(b.batch_id).read_bytes)
        except FileNotFoundError:
            await self._record([BatchFailed(batch_id=b.batch_id, errors=[BatchError(
                code="file_not_found", message=f"the input file {b.input_file_id} is gone")])], b.owner)
            return
        checked = await asyncio.to_thread(batch_lines.check, data, b.endpoint, self.ask)
        if checked.errors:
            await self._record([BatchFailed(batch_id=b.batch_id, errors=checked.errors)], b.owner)
            return
        self._inputs[b.batch_id] = checked.lines
        await self._record([BatchValidated(batch_id=b.batch_id, lines=len(checked.lines), models=checked.models)],
                           b.owner)

    # -- one line ------------------------------------------------------------------------------------------------------

    async def _line(self, b: BatchRow, index: int, line: Line) -> None:
        pause = self.retry_pause_s
        while True:
            trace_id = new_trace_id()
            try:
                status, body = await self._ask(b, line, trace_id)
                break
            except Refused as e:
                if e.reason not in _RETRY:
                    status, body = e.http_status, _error_body(self._told(b.owner, e), e.http_status, e.reason)
                    break
                await asyncio.sleep(min(_RETRY_MAX_S, max(pause, e.retry_after_s or 0.0)))
                pause = min(_RETRY_MAX_S, pause * 2)
                now = self.app.clock.now()
                current = batch_row(self._state(), b.batch_id)
                if current is None or current.status != "in_progress" or now >= current.expires_at:
                    return  # cancelled or expired while it waited: it never ran
        prompt, completion = batch_lines.usage_of(body)
        data = batch_lines.answered(line.custom_id, trace_id, status, body)
        await asyncio.to_thread(self.store.write_line, b.batch_id, index, data)
        await self._record([BatchLineDone(batch_id=b.batch_id, index=index,
                                          status="completed" if 200 <= status < 300 else "failed",
                                          status_code=status, trace_id=trace_id, prompt_tokens=prompt,
                                          completion_tokens=completion)], b.owner)

    async def _ask(self, b: BatchRow, line: Line, trace_id: str) -> tuple[int, Any]:
        """The line through the pipeline as its owner: (status, the answer's body)."""
        principal = self._principal(b.owner)
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
            return 500, _error_body(self._told(b.owner, e), 500, "internal_error")
        return answer.status, await _body_of(answer)

    def _told(self, owner: str, exc: BaseException) -> str:
        """`exc` in the words its batch's owner may read (an error file is the key's to download): the whole message
        for the machine's owner or an admin key, blazar/redact.py's public words for any other key (the whole one
        then goes to the daemon log; the line's trace in the log has it too)."""
        k = key_named(self.app.runner.state("keys"), owner.removeprefix("key:")) if owner else None
        detail = not owner or (k is not None and k.admin)
        words = told(exc, detail=detail, roots=machine_roots(self.app.paths.data_dir, self.app.paths.config_dir))
        if not detail and isinstance(exc, BlazarError) and words != exc.message:
            log.warning("a batch line of %s failed: %s", owner, exc.message)
        return words

    def _principal(self, owner: str) -> Principal | None:
        """The key that made the batch, as it is now (its scope and limits apply to every line); None for the
        machine's owner. A key revoked or expired since refuses the line."""
        if not owner:
            return None
        name = owner.removeprefix("key:")
        k = key_named(self.app.runner.state("keys"), name)
        now = self.app.clock.now()
        if k is None or k.revoked or (k.expires_ts is not None and k.expires_ts <= now):
            raise Refused(f"the key {name!r} that made this batch is revoked or expired", reason="key_revoked",
                          http_status=401, error_type="authentication_error")
        return Principal(actor=owner, admin=k.admin, key=k)

    # -- the end -------------------------------------------------------------------------------------------------------

    async def _finish(self, b: BatchRow, ending: Ending) -> None:
        """Write the output and error files from the lines' answers (in input order), then record them and the
        batch's end in one append."""
        done = done_lines(self._state(), b.batch_id)
        out: list[bytes] = []
        err: list[bytes] = []
        for index in sorted(done):
            data = await asyncio.to_thread(self.store.read_line, b.batch_id, index)
            if data is not None:
                (out if done[index] else err).append(data)
        unfinished = 0
        if ending == "expired":
            try:
                lines = await self._lines(b.batch_id) if b.total else []
            except OSError:
                lines = []  # the input is gone: the unfinished lines cannot be named, only counted
            for index in range(b.total):
                if index not in done:
                    if index < len(lines):
                        err.append(batch_lines.expired(lines[index].custom_id))
                    unfinished += 1
        events: list[Event] = []
        files: dict[str, str | None] = {}
        for which, content in (("output", out), ("error", err)):
            if not content:
                files[which] = None
                continue
            file_id = derived_file_id(b.batch_id, which)
            stored = await asyncio.to_thread(self.store.write_file, file_id, iter(content))
            events.append(FileUploaded(file_id=file_id, owner=b.owner, filename=f"{b.batch_id}_{which}.jsonl",
                                       purpose="batch_output", bytes=stored.bytes, sha256=stored.sha256,
                                       batch_id=b.batch_id))
            files[which] = file_id
        out_id, err_id = files["output"], files["error"]
        if ending == "completed":
            events.append(BatchCompleted(batch_id=b.batch_id, output_file_id=out_id, error_file_id=err_id))
        elif ending == "cancelled":
            events.append(BatchCancelled(batch_id=b.batch_id, output_file_id=out_id, error_file_id=err_id))
        else:
            events.append(BatchExpired(batch_id=b.batch_id, output_file_id=out_id, error_file_id=err_id,
                                       expired_lines=unfinished))
        await self._record(events, b.owner)
        self._inputs.pop(b.batch_id, None)
        self._cursor.pop(b.batch_id, None)
        await asyncio.to_thread(self.store.remove_batch_work, b.batch_id)

    async def _record(self, events: Sequence[Event], owner: str) -> None:
        """Durable (control events), as the batch's owner where it is a key, and folded before the next step."""
        node = self.app.node
        await self.app.log.append([stamp_node(e, node) if node else e for e in events], actor=owner or self.app.actor)
        await self.app.runner.catch_up()


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
