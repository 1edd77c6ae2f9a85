"""The `batches` projection: the files stored for `/v1/files` (owner, name, purpose, size, sha256) and every batch
(its status, counts, timestamps, output files, and which of its lines are done). The API's reads and the batch runner
(blazar/serving/batches.py) read it: a restarted daemon resumes a batch at the lines this fold says are not done.

A line is counted once, by its first `batch.line_done`: a second one for the same index (which the runner never
records) changes nothing. An event whose id could not be ours (the log is data, and ids become file names in the
content store) is kept under `refused` and makes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from blazar.events.base import Recorded
from blazar.events.batches import (
    BATCH_ID,
    FILE_ID,
    BatchCancelled,
    BatchCancelling,
    BatchCompleted,
    BatchCreated,
    BatchError,
    BatchExpired,
    BatchFailed,
    BatchLineDone,
    BatchValidated,
    FileDeleted,
    FileUploaded,
)
from blazar.projections.base import Projection, RefusedEvent

# The statuses of a batch the runner still has work for.
OPEN = frozenset({"validating", "in_progress", "cancelling"})
TERMINAL = frozenset({"failed", "completed", "cancelled", "expired"})


@dataclass(frozen=True, slots=True)
class FileRow:
    file_id: str
    owner: str
    filename: str
    purpose: str
    bytes: int
    sha256: str
    created_at: float
    batch_id: str | None


@dataclass(frozen=True, slots=True)
class BatchTimes:
    """When a batch reached each status past `validating` (None: it has not)."""

    in_progress_at: float | None = None
    cancelling_at: float | None = None
    failed_at: float | None = None
    completed_at: float | None = None
    cancelled_at: float | None = None
    expired_at: float | None = None


@dataclass(slots=True)
class BatchRow:
    """A batch: what `/v1/batches` shows of it, and what the runner and the storage quota read (the lines done, what
    it holds on disk). The state's own is updated in place, once per line; the readers hand out copies."""

    batch_id: str
    owner: str
    input_file_id: str
    endpoint: str
    completion_window: str
    created_at: float
    expires_at: float
    status: str = "validating"
    total: int = 0
    completed: int = 0
    failed: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    errors: list[BatchError] = field(default_factory=list)
    metadata: dict[str, str] | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    times: BatchTimes = field(default_factory=BatchTimes)
    # The lines of an open batch that are done, each with whether it completed (emptied when the batch ends: which
    # lines ran is in its files then).
    done: dict[int, bool] = field(default_factory=dict)
    models: list[str] = field(default_factory=list)  # the models its lines name (as validated: a few)
    models_count: int = 0
    input_bytes: int = 0
    input_copied: bool = False  # it holds its own copy of its input (else a link to the uploaded file)
    result_bytes: int = 0  # its lines' results written so far


@dataclass(slots=True)
class BatchesState:
    """The `batches` projection's state: the stored files and the batches, by id."""

    files: dict[str, FileRow] = field(default_factory=dict)
    batches: dict[str, BatchRow] = field(default_factory=dict)
    refused: list[RefusedEvent] = field(default_factory=list)  # events whose id could not be ours


def _refused(rec: Recorded, what: str, ident: str) -> RefusedEvent:
    return RefusedEvent.of(rec, [f"{what} id {ident[:80]!r} is not one Blazar makes"])


_BATCH = (BatchCreated, BatchValidated, BatchFailed, BatchLineDone, BatchCancelling, BatchCompleted, BatchCancelled,
          BatchExpired)


class BatchesProjection(Projection[BatchesState]):
    node_local = True  # a file's bytes, and so its batches, are on one gateway's disk
    name = "batches"
    state_type = BatchesState
    # 2: what each batch holds on disk (its input, its lines' results), models counted not listed; 3: a typed state
    version = 3
    types = frozenset({FileUploaded.TYPE, FileDeleted.TYPE, *(t.TYPE for t in _BATCH)})

    def initial(self) -> BatchesState:
        return BatchesState()

    def apply(self, state: BatchesState, rec: Recorded) -> BatchesState:
        ev = rec.event
        if isinstance(ev, FileUploaded | FileDeleted):
            if not FILE_ID.fullmatch(ev.file_id):
                state.refused.append(_refused(rec, "file", ev.file_id))
            elif isinstance(ev, FileUploaded):
                state.files[ev.file_id] = FileRow(file_id=ev.file_id, owner=ev.owner, filename=ev.filename,
                                                  purpose=ev.purpose, bytes=ev.bytes, sha256=ev.sha256,
                                                  created_at=rec.ts, batch_id=ev.batch_id)
            else:
                state.files.pop(ev.file_id, None)
            return state
        assert isinstance(ev, _BATCH)
        if not BATCH_ID.fullmatch(ev.batch_id):
            state.refused.append(_refused(rec, "batch", ev.batch_id))
            return state
        if isinstance(ev, BatchCreated):
            state.batches[ev.batch_id] = _created(ev, rec.ts)
            return state
        b = state.batches.get(ev.batch_id)
        if b is None or b.status in TERMINAL:
            return state  # an event for a batch that ended (or that this log never created) changes nothing
        if isinstance(ev, BatchLineDone):
            if ev.index not in b.done and 0 <= ev.index < b.total:
                completed = ev.status == "completed"
                b.done[ev.index] = completed
                if completed:
                    b.completed += 1
                else:
                    b.failed += 1
                b.prompt_tokens += ev.prompt_tokens
                b.completion_tokens += ev.completion_tokens
                b.result_bytes += max(0, ev.result_bytes)
        elif isinstance(ev, BatchValidated):
            b.status, b.total, b.models, b.models_count = "in_progress", ev.lines, list(ev.models), ev.models_count
            b.times = replace(b.times, in_progress_at=rec.ts)
        elif isinstance(ev, BatchCancelling):
            b.status = "cancelling"
            b.times = replace(b.times, cancelling_at=rec.ts)
        else:
            if isinstance(ev, BatchFailed):
                b.status, b.errors, b.times = "failed", list(ev.errors), replace(b.times, failed_at=rec.ts)
            elif isinstance(ev, BatchCompleted):
                b.status, b.times = "completed", replace(b.times, completed_at=rec.ts)
            elif isinstance(ev, BatchCancelled):
                b.status, b.times = "cancelled", replace(b.times, cancelled_at=rec.ts)
            else:
                b.status, b.times = "expired", replace(b.times, expired_at=rec.ts)
                b.failed += ev.expired_lines  # OpenAI counts a line that expired as failed
            b.output_file_id, b.error_file_id = ev.output_file_id, ev.error_file_id
            b.done = {}  # an ended batch runs nothing: which lines ran is in its files
        return state


def _created(ev: BatchCreated, ts: float) -> BatchRow:
    return BatchRow(batch_id=ev.batch_id, owner=ev.owner, input_file_id=ev.input_file_id, endpoint=ev.endpoint,
                    completion_window=ev.completion_window, created_at=ts, expires_at=ts + ev.window_s,
                    metadata=ev.metadata, input_bytes=max(0, ev.input_bytes), input_copied=ev.input_copied)


# -- readers -----------------------------------------------------------------------------------------------------------

def file_row(state: BatchesState, file_id: str) -> FileRow | None:
    return state.files.get(file_id)


def file_rows(state: BatchesState, owner: str | None = None) -> list[FileRow]:
    """Every stored file (of `owner` when given), oldest first."""
    rows = [f for f in state.files.values() if owner is None or f.owner == owner]
    return sorted(rows, key=lambda r: (r.created_at, r.file_id))


def created_row(rec: Recorded) -> BatchRow:
    """A batch as its `batch.created` made it: what the create call answers, whatever the runner did since."""
    assert isinstance(rec.event, BatchCreated)
    return _created(rec.event, rec.ts)


def batch_row(state: BatchesState, batch_id: str) -> BatchRow | None:
    """Batch `batch_id` as it is now (a copy: the state's own moves on with each line), or None."""
    b = state.batches.get(batch_id)
    return None if b is None else replace(b)


def batch_rows(state: BatchesState, owner: str | None = None) -> list[BatchRow]:
    """Every batch (of `owner` when given), newest first (as OpenAI lists them); copies."""
    rows = [replace(b) for b in state.batches.values() if owner is None or b.owner == owner]
    return sorted(rows, key=lambda r: (r.created_at, r.batch_id), reverse=True)


def open_batches(state: BatchesState) -> list[BatchRow]:
    """The batches with work left (validating, in progress, cancelling), oldest first: the runner's queue (copies)."""
    rows = [replace(b) for b in state.batches.values() if b.status in OPEN]
    return sorted(rows, key=lambda r: (r.created_at, r.batch_id))


def done_lines(state: BatchesState, batch_id: str) -> dict[int, bool]:
    """The lines of an open batch that are done, each with whether it completed (else it failed); a copy."""
    b = state.batches.get(batch_id)
    return {} if b is None else dict(b.done)


def line_done(state: BatchesState, batch_id: str, index: int) -> bool:
    """Whether line `index` of an open batch has its outcome recorded (the runner never runs it again)."""
    b = state.batches.get(batch_id)
    return b is not None and index in b.done


# -- what an owner holds -----------------------------------------------------------------------------------------------

def storage_used(state: BatchesState, owner: str) -> int:
    """Bytes of the content store that are `owner`'s: its files (uploads, and the output and error files of its
    batches), the results its open batches' lines have written so far (its batches' output to be), and the input an
    open batch still holds on disk: its own copy, or its link to a file deleted since (each such file once)."""
    files = state.files
    used = sum(f.bytes for f in files.values() if f.owner == owner)
    held: dict[str, int] = {}
    for b in state.batches.values():
        if b.owner != owner or b.status not in OPEN:
            continue
        used += b.result_bytes
        if b.input_copied:
            used += b.input_bytes
        elif b.input_file_id not in files:
            held[b.input_file_id] = b.input_bytes
    return used + sum(held.values())


def open_count(state: BatchesState, owner: str) -> int:
    """How many of `owner`'s batches are open (validating, in progress or cancelling)."""
    return sum(1 for b in state.batches.values() if b.owner == owner and b.status in OPEN)
