"""File and batch events: OpenAI's `/v1/files` and `/v1/batches` as an event-sourced job (blazar/serving/batches.py
runs it, blazar/projections/batches.py folds it). Control events on the streams `file:<id>` and `batch:<id>`.

The log keeps ids, sizes, hashes, owners, statuses and token counts; never a file's content nor a line's prompt or
answer (those live in the content store under the home, blazar/store/files.py). `owner` is the key that made the
file or batch ("key:<name>"), "" for the machine's owner (auth off, or the CLI's admin token): another key sees
neither.

Both are node-local (`NodeLocal`): a file's bytes are on the disk of the gateway that stored it, so where several
gateways share the log each sees, and runs, only its own files and batches.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from blazar.events.base import NodeLocal
from blazar.events.bounds import ID, NAME, WORD, Bound, Clip, bound_of, entries, items
from blazar.events.types import register, upcaster

# Ids are ours, and become file names in the content store: the fold trusts no other shape (the log is data).
FILE_ID = re.compile(r"file-[0-9a-f]{24}")
BATCH_ID = re.compile(r"batch_[0-9a-f]{24}")

FilePurpose = Literal["batch", "batch_output", "user_data"]
BatchEndpoint = Literal["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"]
# How a line ended: answered (any status the pipeline gave, 2xx or not) or never run (the batch expired first).
LineStatus = Literal["completed", "failed"]
# A batch's lines may name any number of models: `batch.validated` names this many of them (sorted) and counts them
# all, so the event stays small whatever a client's file holds (20,000 250-character names made one 5 MB event).
MAX_MODELS_LISTED = 16
MAX_ERRORS_LISTED = 40  # problems a failed batch lists (OpenAI's `errors.data`; every line is still checked)


class _FileEvent(NodeLocal):
    AUDIT = True
    file_id: str
    owner: str = ""

    def stream_key(self) -> str:
        return f"file:{self.file_id}"


@register
class FileUploaded(_FileEvent):
    """A file stored: uploaded by a client, or written by a batch (its output and error files)."""

    TYPE = "file.uploaded"

    filename: str
    purpose: FilePurpose
    bytes: int
    sha256: str
    batch_id: str | None = None  # the batch that wrote it (purpose batch_output)


@register
class FileDeleted(_FileEvent):
    """A file deleted: its content removed from the store."""

    TYPE = "file.deleted"


class BatchError(BaseModel):
    """One reason a batch failed validation (OpenAI's `errors.data[]`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    code: Annotated[str, WORD]
    message: Annotated[str, Clip(240)]
    line: int | None = None  # 1-based, as OpenAI counts the input file's lines
    param: Annotated[str | None, ID] = None


class _BatchEvent(NodeLocal):
    AUDIT = True
    batch_id: str

    def stream_key(self) -> str:
        return f"batch:{self.batch_id}"


@register
class BatchCreated(_BatchEvent):
    """A batch made from an uploaded file, its lines not yet checked (`validating`)."""

    TYPE = "batch.created"

    owner: str = ""
    input_file_id: str
    endpoint: BatchEndpoint
    completion_window: str
    window_s: float  # the completion window in seconds: unfinished lines expire this long after creation
    # At most 16 pairs, keys of 64 and values of 512 characters (blazar/api/batches.py)
    metadata: Annotated[dict[str, str] | None, entries(16, Bound(64 * 6 + 2), Bound(512 * 6 + 2))] = None
    # The input file's size, held on disk by the batch's own link to it until the batch ends (its key's storage
    # counts it once the file itself is deleted), and whether that link is a copy (a filesystem without hard links:
    # then the batch's copy counts as well).
    input_bytes: int = 0
    input_copied: bool = False


@register
class BatchValidated(_BatchEvent):
    """Every line checked: the batch is `in_progress` with this many lines (`request_counts.total`).

    v2: `models` names at most MAX_MODELS_LISTED of the models its lines name (the first in sort order) and
    `models_count` counts them all (v1 listed every one)."""

    TYPE = "batch.validated"
    V = 2

    lines: int
    # the first of the models its lines name, sorted
    models: Annotated[list[str], items(MAX_MODELS_LISTED, NAME)] = Field(max_length=MAX_MODELS_LISTED)
    models_count: int  # how many distinct models its lines name


@upcaster(BatchValidated.TYPE, 1)
def _validated_v1(payload: dict[str, Any]) -> dict[str, Any]:
    """v1 -> v2: the whole list counted, its first MAX_MODELS_LISTED names kept (a v1 list was sorted)."""
    models = list(payload.get("models") or [])
    return {**payload, "models": models[:MAX_MODELS_LISTED], "models_count": len(models)}


@register
class BatchFailed(_BatchEvent):
    """The input file did not validate, and nothing ran (OpenAI's `failed`, with `errors`); or a line's answer found
    no room in its key's storage quota, and the batch stopped there (`errors` says so; the answers kept so far are
    in its output and error files)."""

    TYPE = "batch.failed"

    errors: Annotated[list[BatchError], items(MAX_ERRORS_LISTED, bound_of(BatchError))]
    # A batch that failed while it ran (its key's storage quota reached): the answers it kept are in these files.
    output_file_id: str | None = None
    error_file_id: str | None = None


@register
class BatchLineDone(_BatchEvent):
    """One line's outcome: the pipeline answered it (`trace_id` is the request's trace) with `status_code`. Its
    answer is in the content store, never here. A line has at most one of these: the runner skips a done line."""

    TYPE = "batch.line_done"

    index: int  # 0-based line of the input file
    status: LineStatus
    status_code: int
    trace_id: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    result_bytes: int = 0  # the size of its result line in the content store (its key's storage counts it)


@register
class BatchCancelling(_BatchEvent):
    """The owner asked to cancel: no line starts any more; lines running finish."""

    TYPE = "batch.cancelling"


class _BatchEnded(_BatchEvent):
    output_file_id: str | None = None
    error_file_id: str | None = None


@register
class BatchCompleted(_BatchEnded):
    """Every line ran; its output and error files are written."""

    TYPE = "batch.completed"


@register
class BatchCancelled(_BatchEnded):
    """Cancelled: the lines that ran are in its files, the others never ran."""

    TYPE = "batch.cancelled"


@register
class BatchExpired(_BatchEnded):
    """The completion window passed before every line ran: the unfinished ones are in the error file as expired."""

    TYPE = "batch.expired"

    expired_lines: int
