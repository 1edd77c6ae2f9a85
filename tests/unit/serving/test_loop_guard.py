"""The loop guard (blazar/serving/loop_guard.py): which answers end in a loop, what the guard takes off the chunks
and the chunk it ends the answer with."""

from __future__ import annotations

import random
import string
from typing import Any

import pytest

from blazar.serving.loop_guard import (
    MAX_PERIOD_CHARS,
    REPEATS,
    SPAN_CHARS,
    Loop,
    LoopGuard,
    looping_period,
)


def _chunk(text: str, *, n: int = 1, finish: str | None = None) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 7, "model": "engine-name",
            "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}],
            "timings": {"prompt_n": 90, "cache_n": 10, "predicted_n": n, "predicted_ms": 5.0}}


def _feed(guard: LoopGuard, text: str, piece: int = 3) -> Loop | None:
    """Feeds `text` a few characters a chunk (the engine's token count: the chunks so far); the loop found."""
    for i in range(0, len(text), piece):
        if (loop := guard.feed(_chunk(text[i:i + piece], n=i // piece + 1))) is not None:
            return loop
    return None


@pytest.mark.parametrize(("text", "period"), [
    ("Say hi vuonna " * 40, len("Say hi vuonna ")),
    ("!" * SPAN_CHARS, 1),
    ("preamble that is not repeated. " + "<a><b>x</b></a> " * 40, len("<a><b>x</b></a> ")),
    # Three rounds of a long piece, however long the stretch must then be.
    ("x" * 7 + "".join(f"line {i} of a long paragraph. " for i in range(20)) * REPEATS,
     len("".join(f"line {i} of a long paragraph. " for i in range(20)))),
])
def test_a_text_that_ends_in_one_piece_over_and_over_loops(text: str, period: int) -> None:
    assert looping_period(text) == period


@pytest.mark.parametrize("text", [
    "Say hi vuonna " * 20,  # 280 characters: under the shortest stretch
    "".join(f"| row {i} | {i * i} |\n" for i in range(60)),  # alike lines, no exact period
    "a paragraph " * 3 + " ".join(str(i) for i in range(200)),  # repeated, then moved on
    ("y" * (MAX_PERIOD_CHARS + 1)) + "z",  # no period at all
])
def test_a_text_that_only_resembles_itself_runs_on(text: str) -> None:
    assert looping_period(text) is None


def test_a_piece_longer_than_the_longest_looked_for_is_no_loop() -> None:
    piece = "".join(random.Random(1).choices(string.ascii_letters, k=MAX_PERIOD_CHARS + 5))
    assert looping_period(piece * REPEATS) is None


def test_a_loop_that_indents_deeper_each_round_is_still_one_loop() -> None:
    nested = "".join("\n" + "  " * i + "<user_name>" for i in range(60))
    guard = LoopGuard()
    loop = _feed(guard, nested, piece=5)
    assert loop is not None and loop.period_chars == len(" <user_name>") and loop.span_chars == SPAN_CHARS
    # Found within a check's worth of text after the stretch was whole; the tokens are the engine's count.
    said = len(" ".join("<user_name>" for _ in range(60)))
    assert loop.completion_tokens * 5 < len(nested) and said > SPAN_CHARS


def test_the_guard_takes_the_engines_per_token_timings_off_all_but_the_last_chunk() -> None:
    guard = LoopGuard()
    middle, last = _chunk("Paris"), _chunk("", finish="stop")
    assert guard.feed(middle) is None and "timings" not in middle
    assert guard.feed(last) is None and last["timings"]["predicted_n"] == 1
    assert guard.feed({"choices": []}) is None and guard.feed({"id": "x"}) is None
    assert LoopGuard.body_changes() == {"timings_per_token": True}


def test_the_finishing_chunk_is_a_stop_with_the_engines_usage_so_far() -> None:
    guard = LoopGuard()
    assert _feed(guard, "ab " * 200) is not None
    end = guard.finish_chunk()
    assert end["id"] == "chatcmpl-1" and end["object"] == "chat.completion.chunk" and end["model"] == "engine-name"
    assert end["choices"] == [{"index": 0, "delta": {}, "finish_reason": "stop"}]
    chunks = end["timings"]["predicted_n"]
    assert end["usage"] == {"prompt_tokens": 100, "completion_tokens": chunks, "total_tokens": 100 + chunks,
                            "prompt_tokens_details": {"cached_tokens": 10}}


def test_without_the_engines_timings_the_finishing_chunk_has_no_usage_and_counts_chunks() -> None:
    guard = LoopGuard()
    loop = None
    for _ in range(300):
        chunk = _chunk("ab ")
        del chunk["timings"]
        loop = loop or guard.feed(chunk)
    assert loop is not None and loop.completion_tokens <= 300
    assert "usage" not in guard.finish_chunk()


def test_reasoning_text_is_read_too() -> None:
    guard = LoopGuard()
    found = None
    for _ in range(200):
        chunk = _chunk("")
        chunk["choices"][0]["delta"] = {"reasoning_content": "hmm, "}
        found = found or guard.feed(chunk)
    assert found is not None and found.period_chars == len("hmm, ")
