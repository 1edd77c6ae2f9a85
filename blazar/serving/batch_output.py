"""A batch's end (blazar/serving/batches.py decides it): its output and error files written from its lines' results
on disk, a line at a time in input order, and the events that record them and the end, appended together.

    output   each line answered with a 2xx, its result line as written when it ran
    error    each line answered otherwise; for an expired batch, then a `batch_expired` line for each line that never
             ran (its custom_id read again from the input)

The files' ids are derived from the batch's, so a finish interrupted between writing and recording writes the same
files again. A file that would hold nothing is not made.
"""

from __future__ import annotations

import asyncio
import hashlib
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from blazar.events.base import Event
from blazar.events.batches import (
    BatchCancelled,
    BatchCompleted,
    BatchError,
    BatchExpired,
    BatchFailed,
    FileUploaded,
)
from blazar.projections.batches import BatchRow
from blazar.serving import batch_input, batch_lines
from blazar.store.files import FileStore

Ending = Literal["completed", "cancelled", "expired", "failed"]


def derived_file_id(batch_id: str, which: str) -> str:
    """The id of a batch's output or error file, the same however often its finishing is tried again (a crash
    between writing it and recording it leaves no second copy)."""
    return "file-" + hashlib.sha256(f"{batch_id}:{which}".encode()).hexdigest()[:24]


async def ending(store: FileStore, b: BatchRow, done: dict[int, bool], how: Ending, errors: list[BatchError],
                 offsets: array[int] | None, max_line_bytes: int) -> list[Event]:
    """Write the batch's files; the events that record them and its end (`errors` for one that failed)."""
    unfinished = [i for i in range(b.total) if i not in done] if how == "expired" else []
    if unfinished and offsets is None:
        try:
            offsets = await asyncio.to_thread(batch_input.index, store.input_path(b.batch_id))
        except OSError:
            offsets = None  # the input is gone: the unfinished lines cannot be named, only counted
    events: list[Event] = []
    files: dict[str, str | None] = {}
    for which in ("output", "error"):
        answered = [i for i in sorted(done) if done[i] == (which == "output")]
        expired = unfinished if which == "error" and offsets is not None and len(offsets) == b.total else []
        files[which] = None
        if not answered and not expired:
            continue
        file_id = derived_file_id(b.batch_id, which)
        content = _content(store, b.batch_id, answered, [offsets[i] for i in expired] if offsets else [],
                           max_line_bytes)
        stored = await asyncio.to_thread(store.write_file, file_id, content)
        if not stored.bytes:  # none of its lines' results was on disk (a home restored without them)
            await asyncio.to_thread(store.remove_file, file_id)
            continue
        events.append(FileUploaded(file_id=file_id, owner=b.owner, filename=f"{b.batch_id}_{which}.jsonl",
                                   purpose="batch_output", bytes=stored.bytes, sha256=stored.sha256,
                                   batch_id=b.batch_id))
        files[which] = file_id
    out_id, err_id = files["output"], files["error"]
    if how == "completed":
        events.append(BatchCompleted(batch_id=b.batch_id, output_file_id=out_id, error_file_id=err_id))
    elif how == "cancelled":
        events.append(BatchCancelled(batch_id=b.batch_id, output_file_id=out_id, error_file_id=err_id))
    elif how == "failed":
        events.append(BatchFailed(batch_id=b.batch_id, errors=errors, output_file_id=out_id, error_file_id=err_id))
    else:
        events.append(BatchExpired(batch_id=b.batch_id, output_file_id=out_id, error_file_id=err_id,
                                   expired_lines=len(unfinished)))
    return events


def _content(store: FileStore, batch_id: str, answered: list[int], expired: list[int],
             max_line_bytes: int) -> Iterator[bytes]:
    """A file's lines, read from disk one at a time as it is written (in a worker thread): the answered lines'
    results, then a `batch_expired` line for each line at these offsets of the input."""
    for index in answered:
        data = store.read_line(batch_id, index)
        if data is not None:
            yield data
    if expired:
        yield from _expired_lines(store.input_path(batch_id), expired, max_line_bytes)


def _expired_lines(path: Path, offsets: list[int], max_line_bytes: int) -> Iterator[bytes]:
    """A `batch_expired` line for each of these lines of the input, named by its custom_id (read from disk; a line
    that cannot be read again is still there, with an empty custom_id)."""
    try:
        handle = path.open("rb")
    except OSError:
        for _ in offsets:
            yield batch_lines.expired("")
        return
    with handle:
        for offset in offsets:
            try:
                raw = batch_input.read_at(handle, offset, max_line_bytes)
                custom_id = batch_lines.parse(raw).custom_id if raw is not None else ""
            except (OSError, ValueError, KeyError, TypeError):
                custom_id = ""
            yield batch_lines.expired(custom_id)
