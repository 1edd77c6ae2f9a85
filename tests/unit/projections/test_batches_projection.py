"""The `batches` projection, fed events: a batch's statuses, counts and done lines (what a restarted runner resumes
from), files owned and deleted, and events it will not trust."""

from __future__ import annotations

from blazar.events.batches import (
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
from blazar.projections.base import fold
from blazar.projections.batches import (
    BatchesProjection,
    BatchesState,
    BatchTimes,
    batch_row,
    batch_rows,
    created_row,
    done_lines,
    file_row,
    file_rows,
    line_done,
    open_batches,
    open_count,
    storage_used,
)
from tests.support.events import EPOCH, recs
from tests.support.states import state_bytes, through_checkpoint

B = "batch_" + "a" * 24
B2 = "batch_" + "b" * 24
F = "file-" + "1" * 24
OUT = "file-" + "2" * 24


def state_of(*events: object) -> BatchesState:
    p = BatchesProjection()
    return fold(p, recs(*events))  # type: ignore[arg-type]


def created(batch_id: str = B, owner: str = "key:alice", window_s: float = 86400.0) -> BatchCreated:
    return BatchCreated(batch_id=batch_id, owner=owner, input_file_id=F, endpoint="/v1/chat/completions",
                        completion_window="24h", window_s=window_s)


def validated(lines: int) -> BatchValidated:
    return BatchValidated(batch_id=B, lines=lines, models=["gemma"], models_count=1)


def done(index: int, status: str = "completed", batch_id: str = B) -> BatchLineDone:
    return BatchLineDone(batch_id=batch_id, index=index, status=status,  # type: ignore[arg-type]
                         status_code=200 if status == "completed" else 404, trace_id=f"{index:032x}",
                         prompt_tokens=5, completion_tokens=3)


def test_a_batch_goes_from_validating_to_in_progress_and_counts_each_line_once() -> None:
    s = state_of(created(), validated(3), done(0), done(2, "failed"),
                 done(0, "failed"))  # a second outcome for a line changes nothing
    row = batch_row(s, B)
    assert row is not None and row.status == "in_progress"
    assert (row.total, row.completed, row.failed) == (3, 1, 1)
    assert (row.prompt_tokens, row.completion_tokens) == (10, 6)
    assert done_lines(s, B) == {0: True, 2: False}
    assert line_done(s, B, 0) and not line_done(s, B, 1) and line_done(s, B, 2)
    assert row.created_at == EPOCH + 1 and row.expires_at == EPOCH + 1 + 86400.0
    assert [b.batch_id for b in open_batches(s)] == [B]


def test_the_create_answer_is_the_batch_as_created_even_once_the_runner_moved_it_on() -> None:
    events = recs(created(), validated(3))
    moved = batch_row(fold(BatchesProjection(), events), B)
    assert moved is not None and moved.status == "in_progress"
    first = created_row(events[0])
    assert (first.batch_id, first.status, first.total, first.owner) == (B, "validating", 0, "key:alice")
    assert first.created_at == moved.created_at and first.expires_at == moved.expires_at


def test_a_line_outside_the_batch_is_not_counted() -> None:
    s = state_of(created(), validated(2), done(5), done(-1))
    row = batch_row(s, B)
    assert row is not None and (row.completed, row.failed) == (0, 0)


def test_a_batch_that_fails_validation_keeps_its_errors_and_runs_nothing() -> None:
    error = BatchError(code="invalid_json_line", message="line 2 is not valid JSON", line=2)
    s = state_of(created(), BatchFailed(batch_id=B, errors=[error]), done(0))
    row = batch_row(s, B)
    assert row is not None and row.status == "failed" and row.errors == [error]
    assert row.times.failed_at == EPOCH + 2 and row.completed == 0
    assert open_batches(s) == []


def test_cancelling_then_cancelled_and_the_ended_batch_holds_its_files() -> None:
    s = state_of(created(), validated(4), done(0), BatchCancelling(
        batch_id=B), done(1), BatchCancelled(batch_id=B, output_file_id=OUT))
    row = batch_row(s, B)
    assert row is not None and row.status == "cancelled" and row.output_file_id == OUT
    assert row.completed == 2 and row.times == BatchTimes(in_progress_at=EPOCH + 2, cancelling_at=EPOCH + 4,
                                                          cancelled_at=EPOCH + 6)
    assert open_batches(s) == [] and done_lines(s, B) == {}
    # Nothing changes an ended batch.
    again = state_of(created(), validated(4), BatchCompleted(batch_id=B),
                     done(3), BatchCancelling(batch_id=B))
    row = batch_row(again, B)
    assert row is not None and row.status == "completed" and row.completed == 0


def test_an_expired_batch_counts_its_unfinished_lines_as_failed() -> None:
    s = state_of(created(window_s=60), validated(5), done(0),
                 BatchExpired(batch_id=B, error_file_id=OUT, expired_lines=4))
    row = batch_row(s, B)
    assert row is not None and row.status == "expired" and (row.completed, row.failed) == (1, 4)
    assert row.error_file_id == OUT and row.expires_at == EPOCH + 1 + 60


def test_batches_and_files_belong_to_their_owner() -> None:
    s = state_of(created(B, "key:alice"), created(B2, "key:bob"),
                 FileUploaded(file_id=F, owner="key:alice", filename="in.jsonl", purpose="batch", bytes=10,
                              sha256="0" * 64),
                 FileUploaded(file_id=OUT, owner="key:bob", filename="b.jsonl", purpose="batch_output", bytes=3,
                              sha256="1" * 64, batch_id=B2))
    assert [b.batch_id for b in batch_rows(s, "key:alice")] == [B]
    assert [b.batch_id for b in batch_rows(s)] == [B2, B]  # newest first
    assert [f.file_id for f in file_rows(s, "key:bob")] == [OUT]
    row = file_row(s, F)
    assert row is not None and (row.owner, row.bytes, row.purpose) == ("key:alice", 10, "batch")
    gone = state_of(FileUploaded(file_id=F, filename="x", purpose="batch", bytes=1, sha256="0" * 64),
                    FileDeleted(file_id=F))
    assert file_row(gone, F) is None


def test_ids_that_could_name_a_path_are_refused() -> None:
    s = state_of(FileUploaded(file_id="../../etc/passwd", filename="x", purpose="batch", bytes=1, sha256="0" * 64),
                 created("batch_../x"))
    assert file_rows(s) == [] and batch_rows(s) == []
    assert [(r.seq, r.type) for r in s.refused] == [(1, "file.uploaded"), (2, "batch.created")]


def test_what_an_owner_holds_is_its_files_its_open_batches_results_and_inputs_it_keeps_alive() -> None:
    f2 = "file-" + "3" * 24
    uploaded = FileUploaded(file_id=F, owner="key:alice", filename="in.jsonl", purpose="batch", bytes=1000,
                            sha256="0" * 64)
    other = FileUploaded(file_id=f2, owner="key:bob", filename="b.jsonl", purpose="batch", bytes=7, sha256="0" * 64)
    big = BatchLineDone(batch_id=B, index=1, status="completed", status_code=200, trace_id="1" * 32,
                        result_bytes=300)
    events: list[object] = [uploaded, other, BatchCreated(batch_id=B, owner="key:alice", input_file_id=F,
                                                          endpoint="/v1/chat/completions", completion_window="24h",
                                                          window_s=60, input_bytes=1000),
                            validated(3), done(0), big]
    s = state_of(*events)
    assert storage_used(s, "key:alice") == 1000 + 300 and storage_used(s, "key:bob") == 7
    assert open_count(s, "key:alice") == 1 and open_count(s, "key:bob") == 0
    # The file deleted: the batch's own link still holds its bytes, once however many batches hold it.
    again = BatchCreated(batch_id=B2, owner="key:alice", input_file_id=F, endpoint="/v1/chat/completions",
                         completion_window="24h", window_s=60, input_bytes=1000)
    s = state_of(*events, again, FileDeleted(file_id=F, owner="key:alice"))
    assert storage_used(s, "key:alice") == 1000 + 300 and open_count(s, "key:alice") == 2
    # A copy (no hard links) holds its own.
    copied = BatchCreated(batch_id=B2, owner="key:alice", input_file_id=F, endpoint="/v1/chat/completions",
                          completion_window="24h", window_s=60, input_bytes=1000, input_copied=True)
    assert storage_used(state_of(*events, copied), "key:alice") == 2000 + 300
    # Ended, the results are in its output file, which is what counts then.
    ended = [BatchCompleted(batch_id=B, output_file_id=OUT), FileUploaded(
        file_id=OUT, owner="key:alice", filename="out.jsonl", purpose="batch_output", bytes=310, sha256="0" * 64)]
    s = state_of(*events, *ended)
    assert storage_used(s, "key:alice") == 1000 + 310 and open_count(s, "key:alice") == 0


def test_a_batch_half_done_resumes_from_a_checkpoint_with_its_lines_done() -> None:
    p = BatchesProjection()
    events = recs(created(), validated(4), done(0), done(2, "failed"), done(1), BatchCompleted(batch_id=B))
    restored = through_checkpoint(p, fold(p, events[:4]))
    assert done_lines(restored, B) == {0: True, 2: False} and line_done(restored, B, 2)
    assert state_bytes(p, fold(p, events[4:], restored)) == state_bytes(p, fold(p, events))
