"""A batch's input read a chunk at a time (blazar/serving/batch_input.py): the same request lines, numbers and offsets
as splitting the whole file, however the chunks cut it; a line's bytes kept only up to the bound; a line read again
by its offset. And what the check keeps and records is bounded whatever the file holds: `batch.validated` names at
most 16 models and counts them, `batch.failed` lists at most 100 problems of bounded length."""

from __future__ import annotations

import io
import random
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from blazar.events.batches import MAX_MODELS_LISTED, BatchFailed, BatchValidated
from blazar.events.types import decode, encode
from blazar.serving import batch_input
from blazar.serving.batch_input import Span, index, read_line, spans
from blazar.serving.batch_lines import MAX_ERRORS, MAX_LINES, MAX_MESSAGE, check, window_seconds
from blazar.serving.request import Request

BATCH = "batch_" + "a" * 24


def reference(data: bytes) -> list[tuple[int, int, bytes]]:
    """What the whole-file split said: (1-based number, offset, bytes) of each line that is not blank."""
    out, offset = [], 0
    for n, raw in enumerate(data.split(b"\n"), start=1):
        if raw.strip():
            out.append((n, offset, raw))
        offset += len(raw) + 1
    return out


def read_spans(data: bytes, keep: int = 1 << 30) -> list[Span]:
    return list(spans(io.BytesIO(data), keep))


pieces = st.lists(st.sampled_from([b"", b" ", b"\t", b"\r", b"x", b"{}", b"ab c", b"\x0b", b"\xc3\xa9"]), max_size=6)
files = st.lists(pieces.map(b"".join), max_size=30).map(b"\n".join)


@settings(max_examples=300, deadline=None)
@given(data=files, chunk=st.integers(min_value=1, max_value=9))
def test_chunked_reading_finds_the_lines_a_whole_file_split_finds(data: bytes, chunk: int) -> None:
    old = batch_input.CHUNK
    batch_input.CHUNK = chunk
    try:
        got = [(s.number, s.offset, s.data) for s in read_spans(data)]
        assert [(s.length) for s in read_spans(data)] == [len(raw) for _, _, raw in reference(data)]
    finally:
        batch_input.CHUNK = old
    assert got == reference(data)


def test_a_line_past_the_bound_is_measured_but_not_kept() -> None:
    data = b'{"a": 1}\n' + b"x" * 100 + b"\n\n  \n" + b"y" * 10
    got = read_spans(data, keep=50)
    assert [(s.number, s.length, s.data) for s in got] == [(1, 8, b'{"a": 1}'), (2, 100, None), (5, 10, b"y" * 10)]
    old = batch_input.CHUNK
    batch_input.CHUNK = 7  # the long line crosses many chunks
    try:
        assert [(s.number, s.length, s.data) for s in read_spans(data, keep=50)] == \
            [(s.number, s.length, s.data) for s in got]
    finally:
        batch_input.CHUNK = old


def test_a_line_is_read_again_by_its_offset_and_never_past_the_bound(tmp_path: Any) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"\n first\n\nsecond line\nlast")
    offsets = index(path)
    assert list(offsets) == [1, 9, 21]
    assert [read_line(path, o, 100) for o in offsets] == [b" first", b"second line", b"last"]
    assert read_line(path, offsets[1], 11) == b"second line"
    assert read_line(path, offsets[1], 10) is None


def ask(endpoint: str, body: dict[str, Any]) -> Request:
    if "prompt" not in body:
        raise ValueError("prompt: Field required " + "and something a client wrote " * 100)
    return Request(model=body["model"], engine_path=endpoint, body=None, stream=False)


def line(i: int, model: str = "m", **body: Any) -> bytes:
    return orjson.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions",
                         "body": {"model": model, "prompt": "p", **body}}) + b"\n"


def checked(data: bytes, max_line_bytes: int = 1 << 20) -> Any:
    return check(read_spans(data, keep=max_line_bytes), "/v1/completions", ask, max_line_bytes)


def test_validation_keeps_offsets_and_counts_models_listing_at_most_sixteen() -> None:
    # 20,000 lines, each naming its own 250-character model: the list made one 5,000,239-byte event.
    names = [f"{i:05d}" + "m" * 245 for i in range(20_000)]
    random.Random(38).shuffle(names)
    data = b"".join(line(i, names[i]) for i in range(20_000))
    result = checked(data)
    assert not result.errors and result.count == 20_000
    assert result.offsets[:2].tolist() == [0, len(line(0, names[0]))]
    assert result.models_count == 20_000 and result.models == sorted(names)[:MAX_MODELS_LISTED]
    event = BatchValidated(batch_id=BATCH, lines=result.count, models=result.models,
                           models_count=result.models_count)
    assert len(encode(event)) < 5_000


def test_an_old_event_listing_every_model_reads_as_the_first_sixteen_and_a_count() -> None:
    names = sorted(f"model-{i:03d}" for i in range(40))
    payload = orjson.dumps({"batch_id": BATCH, "lines": 40, "models": names})
    ev = decode(1, "batch.validated", 1, payload)
    assert isinstance(ev, BatchValidated)
    assert ev.models == names[:MAX_MODELS_LISTED] and ev.models_count == 40


def test_a_failed_batch_lists_a_bounded_number_of_bounded_problems() -> None:
    bad = b"".join(orjson.dumps({"custom_id": f"c{i}" + "i" * 500, "method": "POST", "url": "/v1/completions",
                                 "body": {"model": "m" * 250}}) + b"\n" for i in range(1_000))
    result = checked(bad + b"x" * 2_000 + b"\n", max_line_bytes=1_000)
    assert len(result.errors) == MAX_ERRORS and result.count == 0
    assert all(len(e.message) <= MAX_MESSAGE for e in result.errors)
    assert len(encode(BatchFailed(batch_id=BATCH, errors=result.errors))) < 40_000


def test_a_line_over_the_request_bound_and_too_many_lines_are_named() -> None:
    result = checked(line(0) + b'{"custom_id": "' + b"z" * 3_000 + b'"}\n' + line(2), max_line_bytes=1_000)
    assert [(e.line, e.code) for e in result.errors] == [(2, "line_too_large")]
    assert "3017 bytes" in result.errors[0].message
    many = checked(b"".join(line(i) for i in range(MAX_LINES + 5)) + b"{oops\n")
    assert many.errors[0].code == "too_many_requests"


def test_a_completion_window_is_short_whatever_its_digits() -> None:
    assert window_seconds("0" * 20 + "1h") is None
    assert window_seconds("0" * 5_000 + "1h") is None  # int() of 5,000 digits raised ValueError: a 500
    assert window_seconds("0001h") == 3600.0
