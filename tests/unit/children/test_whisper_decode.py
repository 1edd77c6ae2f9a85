"""The whisper child's decode (blazar/children/whisper.py): what whisper hears is what decoding finds, as
faster-whisper's own decode_audio makes it, and decoding stops at the bound the gateway names in the form, so the
child cannot be made to transcribe past max_audio_s by a file whose header lies (the real model's answers are
tests/integration/test_speech_children.py)."""

from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np
import pytest

from blazar.adapters.engines.kinds import BEAM_FIELD, MAX_AUDIO_FIELD
from blazar.children import whisper
from blazar.children.whisper import SAMPLE_RATE, Child, Options, decode
from blazar.errors import ChildRefused
from tests.support.hostile_media import MP3_FRAME_SAMPLES, MP3_RATE, CountingContainer, count_packets, lying_mp3, mp3


@pytest.fixture(scope="module")
def lie() -> bytes:
    """Two minutes of MP3 whose Info header claims 10 frames."""
    return lying_mp3(120.0, claimed_frames=10)


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[CountingContainer]:
    return count_packets(monkeypatch)


def test_the_samples_are_faster_whispers_own() -> None:
    decode_audio = pytest.importorskip("faster_whisper").decode_audio
    clip = mp3(2.0)
    ours = decode(clip, 10.0)
    theirs = decode_audio(io.BytesIO(clip), sampling_rate=SAMPLE_RATE)
    assert ours.dtype == np.float32 and len(ours) == len(theirs)
    assert np.allclose(ours, theirs, atol=1 / 32768)


def test_a_lying_mp3_is_decoded_whole_within_the_bound(lie: bytes) -> None:
    assert len(decode(lie, 130.0)) / SAMPLE_RATE == pytest.approx(120.0, abs=0.1)


def test_decoding_stops_at_the_bound_and_refuses(lie: bytes, opened: list[CountingContainer]) -> None:
    with pytest.raises(ChildRefused) as e:
        decode(lie, 10.0)
    assert (e.value.http_status, e.value.code, e.value.param) == (400, "audio_too_long", "file")
    assert "longer than the limit of 10 s (inputs.max_audio_s)" in e.value.message
    at_limit = math.ceil(10 * MP3_RATE / MP3_FRAME_SAMPLES)  # 278 of the file's 3,333 frames
    [container] = opened
    assert at_limit < container.packets <= at_limit + 4, container.packets


def form(**fields: str) -> dict[str, tuple[str | None, bytes]]:
    return {"file": ("a.mp3", b"ID3"), **{k: (None, v.encode()) for k, v in fields.items()}}


def test_the_bound_is_the_gateways_field_else_the_childs_own() -> None:
    child = Child(Path("model"), "key", 1, 1 << 20, max_audio_s=3600.0)
    assert Options(form(), child).max_audio_s == 3600.0
    assert Options(form(**{MAX_AUDIO_FIELD: "10.5"}), child).max_audio_s == 10.5
    for bad in ("ten", "0", "-5", "nan", "inf"):
        with pytest.raises(ChildRefused) as e:
            Options(form(**{MAX_AUDIO_FIELD: bad}), child)
        assert e.value.http_status == 400 and e.value.param == MAX_AUDIO_FIELD
    assert whisper.MAX_AUDIO_FIELD == MAX_AUDIO_FIELD  # the one contract, written on both sides


def test_a_request_may_ask_for_fewer_beams_than_the_childs_never_more() -> None:
    child = Child(Path("model"), "key", 1, 1 << 20, beam_size=5)
    assert Options(form(), child).beam_size == 5
    assert Options(form(**{BEAM_FIELD: "1"}), child).beam_size == 1
    assert Options(form(**{BEAM_FIELD: "9"}), child).beam_size == 5
    for bad in ("0", "one", "-1", "17"):
        with pytest.raises(ChildRefused) as e:
            Options(form(**{BEAM_FIELD: bad}), child)
        assert e.value.http_status == 400 and e.value.param == BEAM_FIELD
    assert whisper.BEAM_FIELD == BEAM_FIELD
