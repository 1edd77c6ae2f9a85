"""The read side of `/v1/files` and `/v1/batches`: a caller's own files and batches, in OpenAI's object shapes.

Keys are tenants: `owner` is the key that made a file or batch ("key:<name>"), "" for the machine's owner. A file or
batch of another owner is not found (404), exactly as one that does not exist.
"""

from __future__ import annotations

from typing import Any

from blazar.context import Blazar
from blazar.projections.batches import (
    BatchesState,
    BatchRow,
    FileRow,
    batch_row,
    batch_rows,
    created_row,
    file_row,
    file_rows,
    storage_used,
)

# `created_row`: the batch its `batch.created` record made, as the create call answers it.
__all__ = ["BatchRow", "FileRow", "batch_json", "created_row", "file_json", "own_batch", "own_batches", "own_file",
           "own_files", "storage_of"]


def _state(app: Blazar) -> BatchesState:
    state: BatchesState = app.runner.state("batches")
    return state


def own_file(app: Blazar, file_id: str, owner: str) -> FileRow | None:
    row = file_row(_state(app), file_id)
    return row if row is not None and row.owner == owner else None


def own_files(app: Blazar, owner: str) -> list[FileRow]:
    return file_rows(_state(app), owner)


def own_batch(app: Blazar, batch_id: str, owner: str) -> BatchRow | None:
    row = batch_row(_state(app), batch_id)
    return row if row is not None and row.owner == owner else None


def own_batches(app: Blazar, owner: str) -> list[BatchRow]:
    return batch_rows(_state(app), owner)


def storage_of(app: Blazar, owner: str) -> int:
    """The bytes of the content store `owner` holds, as its storage quota counts them (recorded ones)."""
    return storage_used(_state(app), owner)


def file_json(row: FileRow) -> dict[str, Any]:
    return {"id": row.file_id, "object": "file", "bytes": row.bytes, "created_at": int(row.created_at),
            "filename": row.filename, "purpose": row.purpose, "status": "processed", "expires_at": None,
            "status_details": None}


def _ts(value: float | None) -> int | None:
    return None if value is None else int(value)


def batch_json(row: BatchRow) -> dict[str, Any]:
    t = row.times
    return {
        "id": row.batch_id, "object": "batch", "endpoint": row.endpoint, "input_file_id": row.input_file_id,
        "completion_window": row.completion_window, "status": row.status,
        "errors": {"object": "list", "data": [e.model_dump(mode="json") for e in row.errors]} if row.errors else None,
        "output_file_id": row.output_file_id, "error_file_id": row.error_file_id,
        "created_at": int(row.created_at), "expires_at": int(row.expires_at),
        "in_progress_at": _ts(t.in_progress_at), "finalizing_at": None,
        "completed_at": _ts(t.completed_at), "failed_at": _ts(t.failed_at),
        "expired_at": _ts(t.expired_at), "cancelling_at": _ts(t.cancelling_at),
        "cancelled_at": _ts(t.cancelled_at),
        "request_counts": {"total": row.total, "completed": row.completed, "failed": row.failed},
        "metadata": row.metadata,
        "usage": {"input_tokens": row.prompt_tokens, "output_tokens": row.completion_tokens,
                  "total_tokens": row.prompt_tokens + row.completion_tokens,
                  "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}},
    }
