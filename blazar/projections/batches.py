"""The `batches` projection: the files stored for `/v1/files` (owner, name, purpose, size, sha256) and every batch
(its status, counts, timestamps, output files, and which of its lines are done). The API's reads and the batch runner
(blazar/serving/batches.py) read it: a restarted daemon resumes a batch at the lines this fold says are not done.

A line is counted once, by its first `batch.line_done`: a second one for the same index (which the runner never
records) changes nothing. An event whose id could not be ours (the log is data, and ids become file names in the
content store) is kept under `refused` and makes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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
from blazar.projections.base import Projection, State, TypedState

# The statuses of a batch the runner still has work for.
OPEN = frozenset({"validating", "in_progress", "cancelling"})
TERMINAL = frozenset({"failed", "completed", "cancelled", "expired"})


class BatchesState(TypedState):
    """The `batches` projection's state, read through `file_row`, `file_rows`, `batch_row`, `batch_rows`,
    `open_batches` and `done_lines`."""

    __slots__ = ()


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
class BatchRow:
    batch_id: str
    owner: str
    input_file_id: str
    endpoint: str
    completion_window: str
    created_at: float
    expires_at: float
    status: str
    total: int
    completed: int
    failed: int
    prompt_tokens: int
    completion_tokens: int
    errors: list[BatchError]
    metadata: dict[str, str] | None
    output_file_id: str | None
    error_file_id: str | None
    times: dict[str, float]  # in_progress_at, failed_at, cancelling_at, cancelled_at, completed_at, expired_at, ...


class BatchesProjection(Projection[State]):
    node_local = True  # a file's bytes, and so its batches, are on one gateway's disk
    name = "batches"
    state_type = BatchesState
    version = 2  # 2: what each batch holds on disk (its input, its lines' results), models counted not listed
    types = frozenset({FileUploaded.TYPE, FileDeleted.TYPE, BatchCreated.TYPE, BatchValidated.TYPE, BatchFailed.TYPE,
                       BatchLineDone.TYPE, BatchCancelling.TYPE, BatchCompleted.TYPE, BatchCancelled.TYPE,
                       BatchExpired.TYPE})

    def initial(self) -> State:
        return {"files": {}, "batches": {}, "refused": []}

    def apply(self, state: State, rec: Recorded) -> State:
        ev = rec.event
        if isinstance(ev, FileUploaded | FileDeleted):
            if not FILE_ID.fullmatch(ev.file_id):
                state["refused"].append({"seq": rec.seq, "type": rec.type, "id": ev.file_id[:80]})
            elif isinstance(ev, FileUploaded):
                state["files"][ev.file_id] = {"owner": ev.owner, "filename": ev.filename, "purpose": ev.purpose,
                                              "bytes": ev.bytes, "sha256": ev.sha256, "created_at": rec.ts,
                                              "batch_id": ev.batch_id}
            else:
                state["files"].pop(ev.file_id, None)
            return state
        assert isinstance(ev, BatchCreated | BatchValidated | BatchFailed | BatchLineDone | BatchCancelling
                          | BatchCompleted | BatchCancelled | BatchExpired)
        if not BATCH_ID.fullmatch(ev.batch_id):
            state["refused"].append({"seq": rec.seq, "type": rec.type, "id": ev.batch_id[:80]})
            return state
        if isinstance(ev, BatchCreated):
            state["batches"][ev.batch_id] = _created(ev, rec.ts)
            return state
        b = state["batches"].get(ev.batch_id)
        if b is None or b["status"] in TERMINAL:
            return state  # an event for a batch that ended (or that this log never created) changes nothing
        if isinstance(ev, BatchValidated):
            b.update(status="in_progress", total=ev.lines, models=list(ev.models), models_count=ev.models_count)
            b["times"]["in_progress_at"] = rec.ts
        elif isinstance(ev, BatchFailed):
            b.update(status="failed", errors=[e.model_dump(mode="json") for e in ev.errors],
                     output_file_id=ev.output_file_id, error_file_id=ev.error_file_id)
            b["times"]["failed_at"] = rec.ts
            b["done"] = {}
        elif isinstance(ev, BatchLineDone):
            key = str(ev.index)
            if key not in b["done"] and 0 <= ev.index < b["total"]:
                b["done"][key] = ev.status == "completed"
                b["completed" if ev.status == "completed" else "failed"] += 1
                b["prompt_tokens"] += ev.prompt_tokens
                b["completion_tokens"] += ev.completion_tokens
                b["result_bytes"] += max(0, ev.result_bytes)
        elif isinstance(ev, BatchCancelling):
            b["status"] = "cancelling"
            b["times"]["cancelling_at"] = rec.ts
        else:
            ended = "completed" if isinstance(ev, BatchCompleted) else \
                "cancelled" if isinstance(ev, BatchCancelled) else "expired"
            b.update(status=ended, output_file_id=ev.output_file_id, error_file_id=ev.error_file_id)
            b["times"][f"{ended}_at"] = rec.ts
            if isinstance(ev, BatchExpired):
                b["failed"] += ev.expired_lines  # OpenAI counts a line that expired as failed
            b["done"] = {}  # an ended batch runs nothing: which lines ran is in its files
        return state


# -- readers -----------------------------------------------------------------------------------------------------------

def _raw(state: BatchesState) -> State:
    return state._raw


def _file(file_id: str, f: dict[str, Any]) -> FileRow:
    return FileRow(file_id=file_id, owner=f["owner"], filename=f["filename"], purpose=f["purpose"], bytes=f["bytes"],
                   sha256=f["sha256"], created_at=f["created_at"], batch_id=f.get("batch_id"))


def _batch(batch_id: str, b: dict[str, Any]) -> BatchRow:
    return BatchRow(batch_id=batch_id, owner=b["owner"], input_file_id=b["input_file_id"], endpoint=b["endpoint"],
                    completion_window=b["completion_window"], created_at=b["created_at"], expires_at=b["expires_at"],
                    status=b["status"], total=b["total"], completed=b["completed"], failed=b["failed"],
                    prompt_tokens=b["prompt_tokens"], completion_tokens=b["completion_tokens"],
                    errors=[BatchError.model_validate(e) for e in b["errors"]], metadata=b["metadata"],
                    output_file_id=b["output_file_id"], error_file_id=b["error_file_id"], times=dict(b["times"]))


def file_row(state: BatchesState, file_id: str) -> FileRow | None:
    f = _raw(state)["files"].get(file_id)
    return None if f is None else _file(file_id, f)


def file_rows(state: BatchesState, owner: str | None = None) -> list[FileRow]:
    """Every stored file (of `owner` when given), oldest first."""
    rows = [_file(i, f) for i, f in _raw(state)["files"].items() if owner is None or f["owner"] == owner]
    return sorted(rows, key=lambda r: (r.created_at, r.file_id))


def _created(ev: BatchCreated, ts: float) -> dict[str, Any]:
    return {"owner": ev.owner, "input_file_id": ev.input_file_id, "endpoint": ev.endpoint,
            "completion_window": ev.completion_window, "created_at": ts, "expires_at": ts + ev.window_s,
            "status": "validating", "total": 0, "completed": 0, "failed": 0, "prompt_tokens": 0,
            "completion_tokens": 0, "errors": [], "metadata": ev.metadata, "output_file_id": None,
            "error_file_id": None, "times": {}, "done": {}, "models": [], "models_count": 0,
            "input_bytes": max(0, ev.input_bytes), "input_copied": ev.input_copied, "result_bytes": 0}


def created_row(rec: Recorded) -> BatchRow:
    """A batch as its `batch.created` made it: what the create call answers, whatever the runner did since."""
    assert isinstance(rec.event, BatchCreated)
    return _batch(rec.event.batch_id, _created(rec.event, rec.ts))


def batch_row(state: BatchesState, batch_id: str) -> BatchRow | None:
    b = _raw(state)["batches"].get(batch_id)
    return None if b is None else _batch(batch_id, b)


def batch_rows(state: BatchesState, owner: str | None = None) -> list[BatchRow]:
    """Every batch (of `owner` when given), newest first (as OpenAI lists them)."""
    rows = [_batch(i, b) for i, b in _raw(state)["batches"].items() if owner is None or b["owner"] == owner]
    return sorted(rows, key=lambda r: (r.created_at, r.batch_id), reverse=True)


def open_batches(state: BatchesState) -> list[BatchRow]:
    """The batches with work left (validating, in progress, cancelling), oldest first: the runner's queue."""
    rows = [_batch(i, b) for i, b in _raw(state)["batches"].items() if b["status"] in OPEN]
    return sorted(rows, key=lambda r: (r.created_at, r.batch_id))


def done_lines(state: BatchesState, batch_id: str) -> dict[int, bool]:
    """The lines of an open batch that are done, each with whether it completed (else it failed)."""
    b = _raw(state)["batches"].get(batch_id)
    return {} if b is None else {int(k): bool(v) for k, v in b["done"].items()}


def line_done(state: BatchesState, batch_id: str, index: int) -> bool:
    """Whether line `index` of an open batch has its outcome recorded (the runner never runs it again)."""
    b = _raw(state)["batches"].get(batch_id)
    return b is not None and str(index) in b["done"]


# -- what an owner holds -----------------------------------------------------------------------------------------------

def storage_used(state: BatchesState, owner: str) -> int:
    """Bytes of the content store that are `owner`'s: its files (uploads, and the output and error files of its
    batches), the results its open batches' lines have written so far (its batches' output to be), and the input an
    open batch still holds on disk: its own copy, or its link to a file deleted since (each such file once)."""
    raw = _raw(state)
    files: dict[str, dict[str, Any]] = raw["files"]
    used: int = sum(int(f["bytes"]) for f in files.values() if f["owner"] == owner)
    held: dict[str, int] = {}
    for b in raw["batches"].values():
        if b["owner"] != owner or b["status"] not in OPEN:
            continue
        used += int(b["result_bytes"])
        if b["input_copied"]:
            used += int(b["input_bytes"])
        elif b["input_file_id"] not in files:
            held[b["input_file_id"]] = int(b["input_bytes"])
    return used + sum(held.values())


def open_count(state: BatchesState, owner: str) -> int:
    """How many of `owner`'s batches are open (validating, in progress or cancelling)."""
    return sum(1 for b in _raw(state)["batches"].values() if b["owner"] == owner and b["status"] in OPEN)
