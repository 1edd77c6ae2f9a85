"""The whisper child's pure parts: OpenAI's response formats rendered from segments (blazar/children/transcript.py)
and the multipart form it reads (the real model's answers are tests/integration/test_speech_children.py)."""

from __future__ import annotations

import json

import httpx
import pytest

from blazar.children.transcript import Segment, Transcript, Word, done_event, render, sse
from blazar.children.whisper import parse_form
from blazar.errors import ChildRefused


def _seg(i: int, start: float, end: float, text: str, words: list[Word] | None = None) -> Segment:
    return Segment(id=i, seek=0, start=start, end=end, text=text, tokens=[1, 2], temperature=0.0, avg_logprob=-0.3,
                   compression_ratio=1.1, no_speech_prob=0.01, words=words or [])


T = Transcript("transcribe", "en", 3725.5, [
    _seg(0, 0.0, 1.5, " Hello there.", [Word(0.0, 0.6, " Hello"), Word(0.6, 1.5, " there.")]),
    _seg(1, 3661.25, 3725.5, " Goodbye."),
])


def test_json_and_text() -> None:
    body, ctype = render(T, "json", frozenset())
    assert ctype == "application/json"
    assert json.loads(body) == {"text": "Hello there. Goodbye.", "usage": {"type": "duration", "seconds": 3725.5}}
    assert render(T, "text", frozenset())[0] == b"Hello there. Goodbye.\n"


def test_srt_and_vtt_timestamps() -> None:
    srt = render(T, "srt", frozenset())[0].decode()
    assert srt == ("1\n00:00:00,000 --> 00:00:01,500\nHello there.\n\n"
                   "2\n01:01:01,250 --> 01:02:05,500\nGoodbye.\n\n")
    vtt = render(T, "vtt", frozenset())[0].decode()
    assert vtt.startswith("WEBVTT\n\n00:00:00.000 --> 00:00:01.500\nHello there.\n\n")
    assert "01:01:01.250 --> 01:02:05.500\nGoodbye." in vtt


def test_verbose_json_names_the_language_and_gives_words_only_when_asked() -> None:
    plain = json.loads(render(T, "verbose_json", frozenset())[0])
    assert (plain["task"], plain["language"], plain["duration"]) == ("transcribe", "english", 3725.5)
    assert [s["id"] for s in plain["segments"]] == [0, 1] and "words" not in plain
    words = json.loads(render(T, "verbose_json", frozenset({"word"}))[0])
    assert words["words"] == [{"word": "Hello", "start": 0.0, "end": 0.6}, {"word": "there.", "start": 0.6,
                                                                              "end": 1.5}]
    assert "segments" not in words
    both = json.loads(render(T, "verbose_json", frozenset({"word", "segment"}))[0])
    assert "segments" in both and "words" in both


def test_a_translation_is_in_english_and_has_no_usage_body() -> None:
    t = Transcript("translate", "de", 2.0, [_seg(0, 0, 2, " Good morning.")])
    assert json.loads(render(t, "json", frozenset())[0]) == {"text": "Good morning."}
    verbose = json.loads(render(t, "verbose_json", frozenset())[0])
    assert (verbose["task"], verbose["language"]) == ("translate", "english") and "usage" not in verbose


def test_stream_events_are_openais() -> None:
    assert sse(done_event("Hi.", 1.25)) == (b'data: {"type": "transcript.text.done", "text": "Hi.", "usage": '
                                            b'{"type": "duration", "seconds": 1.25}}\n\n')


def _form(files: dict[str, tuple[str, bytes]], data: dict[str, str | list[str]]) -> tuple[bytes, str]:
    req = httpx.Request("POST", "http://x/", files=files, data=data)
    return req.read(), req.headers["content-type"]


def test_the_form_as_the_openai_sdk_sends_it() -> None:
    audio = b"RIFF\r\n--\r\n\r\n\x00\xff" * 100  # bytes that look like delimiters and headers
    body, ctype = _form({"file": ("a.wav", audio)}, {"model": "whisper-1", "language": "en",
                                                     "timestamp_granularities[]": ["word", "segment"]})
    form = parse_form(body, ctype)
    assert form["file"] == ("a.wav", audio)
    assert form["model"] == (None, b"whisper-1") and form["language"] == (None, b"en")
    assert form["timestamp_granularities[]"][1] == b"word,segment"


def test_a_body_that_is_not_a_form_is_a_400() -> None:
    with pytest.raises(ChildRefused) as e:
        parse_form(b'{"file": 1}', "application/json")
    assert e.value.http_status == 400
