"""blazar/adapters/audio.py on audio made at test time with FFmpeg's own encoders (through `av`): `probe` reads
what a file is, refuses what is not audio, and measures its length by decoding it (an MP3 whose header lies is as
long as its frames, and decoding stops at the limit: the packets it read are counted), every speech format
`SpeechEncoder` streams decodes back to the length that went in, and text is cut into the sentences piper speaks one
at a time."""

from __future__ import annotations

import io
import itertools
import math
import struct
from pathlib import Path

import av
import pytest

from blazar.adapters.audio import (
    CONTENT_TYPES,
    OUT_RATE,
    SPEECH_FORMATS,
    SpeechEncoder,
    length_scale_for,
    probe,
    split_sentences,
)
from blazar.errors import AudioError, AudioTooLong, NotAudio
from tests.support.hostile_media import MP3_FRAME_SAMPLES, MP3_RATE, CountingContainer, count_packets, lying_mp3

PIPER_RATE = 22_050


def tone(seconds: float, rate: int = PIPER_RATE, hz: float = 440.0) -> bytes:
    """A sine as 16-bit mono PCM, what piper hands over."""
    n = int(seconds * rate)
    return struct.pack(f"<{n}h", *(int(8000 * math.sin(2 * math.pi * hz * i / rate)) for i in range(n)))


def encoded(container: str, codec: str, seconds: float, rate: int = 44_100, channels: int = 2) -> bytes:
    """A file FFmpeg writes itself (not our encoder): a tone in `container` with `codec`."""
    buf = io.BytesIO()
    layout = "stereo" if channels == 2 else "mono"
    with av.open(buf, mode="w", format=container) as out:
        stream = out.add_stream(codec, rate=rate, layout=layout)
        pcm = tone(seconds, rate)
        frame = av.AudioFrame(format="s16", layout="mono", samples=len(pcm) // 2)
        frame.planes[0].update(pcm)
        frame.sample_rate, frame.pts = rate, 0
        for packet in stream.encode(frame):
            out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buf.getvalue()


def decoded_seconds(data: bytes) -> float:
    with av.open(io.BytesIO(data)) as c:
        stream = c.streams.audio[0]
        return sum(f.samples for f in c.decode(stream)) / stream.sample_rate


@pytest.mark.parametrize(("container", "codec", "name"), [("wav", "pcm_s16le", "wav"), ("mp3", "libmp3lame", "mp3"),
                                                          ("flac", "flac", "flac"), ("ogg", "libopus", "ogg")])
def test_probe_reads_generated_audio(container: str, codec: str, name: str) -> None:
    rate = 48_000 if codec == "libopus" else 44_100
    info = probe(encoded(container, codec, 1.5, rate=rate))
    assert info.container == name
    assert info.channels == 2 and info.sample_rate == rate
    assert info.duration_s == pytest.approx(1.5, abs=0.1)


def test_probe_reads_a_path_as_well_as_bytes(tmp_path: Path) -> None:
    path = tmp_path / "clip.mp3"
    path.write_bytes(encoded("mp3", "libmp3lame", 2.0, channels=1))
    info = probe(path)
    assert (info.codec.startswith("mp3"), info.channels) == (True, 1)
    assert info.duration_s == pytest.approx(2.0, abs=0.1)


@pytest.mark.parametrize("data", [b"", b"plain text, not audio at all " * 40, b"\x89PNG\r\n\x1a\n" + b"\0" * 200,
                                  b"RIFF\x24\x00\x00\x00WAVEfmt "])
def test_what_is_not_audio_is_refused_as_a_400(data: bytes) -> None:
    with pytest.raises(NotAudio) as e:
        probe(data)
    assert isinstance(e.value, AudioError) and e.value.http_status == 400


def test_a_duration_over_the_limit_is_refused_naming_the_limit() -> None:
    clip = encoded("wav", "pcm_s16le", 3.0)
    assert probe(clip, max_duration_s=5).duration_s == pytest.approx(3.0, abs=0.01)
    with pytest.raises(AudioTooLong, match=r"longer than the limit of 2 s \(inputs\.max_audio_s\)"):
        probe(clip, max_duration_s=2)


def stated_seconds(data: bytes) -> float:
    """The length the file says it has (FFmpeg's reading of its headers), without decoding a frame."""
    with av.open(io.BytesIO(data)) as c:
        stream = c.streams.audio[0]
        return float(stream.duration * stream.time_base)


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[CountingContainer]:
    """Every container `probe` opens, counting its packets."""
    return count_packets(monkeypatch)


@pytest.fixture(scope="module")
def lie() -> bytes:
    """Two minutes of MP3 whose Info header claims 10 frames."""
    return lying_mp3(120.0, claimed_frames=10)


def test_an_mp3_whose_header_claims_10_frames_is_as_long_as_decoding_finds(lie: bytes) -> None:
    assert stated_seconds(lie) < 1.0  # what the Info header says, and what the probe once believed
    assert probe(lie).duration_s == pytest.approx(120.0, abs=0.1)
    assert probe(lie, max_duration_s=130).duration_s == pytest.approx(120.0, abs=0.1)


def test_decoding_stops_the_moment_it_passes_the_limit(lie: bytes, opened: list[CountingContainer]) -> None:
    with pytest.raises(AudioTooLong, match=r"longer than the limit of 10 s \(inputs\.max_audio_s\)") as e:
        probe(lie, max_duration_s=10)
    assert e.value.http_status == 400 and e.value.code == "audio_too_long"
    # The file holds 120 s in 3,333 frames (576 samples at 16 kHz, 36 ms each); 10 s is 278 of them. The probe read
    # the packets up to the limit (the decoder answers a packet or two behind) and no more: the other 3,000 frames
    # of the upload were never read.
    at_limit = math.ceil(10 * MP3_RATE / MP3_FRAME_SAMPLES)
    [container] = opened
    assert at_limit < container.packets <= at_limit + 4, container.packets


def test_a_streamed_wav_without_lengths_is_counted_by_decoding() -> None:
    enc = SpeechEncoder("wav", PIPER_RATE)
    data = enc.feed(tone(1.0)) + enc.finish()
    assert data[4:8] == b"\xff\xff\xff\xff" and data[40:44] == b"\xff\xff\xff\xff"
    assert probe(data).duration_s == pytest.approx(1.0, abs=0.02)
    with pytest.raises(AudioTooLong):
        probe(data, max_duration_s=0.5)


@pytest.mark.parametrize("fmt", [f for f in SPEECH_FORMATS if f != "pcm"])
def test_every_speech_format_streams_and_decodes_back_to_its_length(fmt: str) -> None:
    enc = SpeechEncoder(fmt, PIPER_RATE)
    pcm = tone(3.0)
    step = PIPER_RATE // 5 * 2  # 200 ms chunks, as sentences arrive
    pieces = [enc.feed(pcm[i:i + step]) for i in range(0, len(pcm), step)]
    tail = enc.finish()
    # Streamed: bytes come out before the end, not all at finish().
    assert sum(len(p) for p in pieces[: len(pieces) // 2]) > 0
    data = b"".join(pieces) + tail
    assert decoded_seconds(data) == pytest.approx(3.0, abs=0.1)
    info = probe(data)
    assert info.channels == 1
    assert info.sample_rate in (OUT_RATE, 48_000)  # Ogg Opus always decodes at 48 kHz


def test_pcm_is_raw_24_khz_16_bit_mono() -> None:
    enc = SpeechEncoder("pcm", PIPER_RATE)
    data = enc.feed(tone(2.0)) + enc.finish()
    assert len(data) % 2 == 0
    assert len(data) / 2 / OUT_RATE == pytest.approx(2.0, abs=0.01)
    # Still the same tone: about 440 zero crossings up per second.
    samples = struct.unpack(f"<{len(data) // 2}h", data)
    ups = sum(1 for a, b in itertools.pairwise(samples) if a < 0 <= b)
    assert ups == pytest.approx(880, abs=5)


def test_formats_and_content_types_are_openais() -> None:
    assert set(SPEECH_FORMATS) == {"mp3", "opus", "aac", "flac", "wav", "pcm"}
    assert CONTENT_TYPES["mp3"] == "audio/mpeg"
    with pytest.raises(ValueError, match="unknown speech format"):
        SpeechEncoder("ogg", PIPER_RATE)


def test_speed_becomes_piper_length_scale_within_openais_range() -> None:
    assert length_scale_for(1.0) == 1.0
    assert length_scale_for(2.0) == 0.5
    assert length_scale_for(10.0) == 0.25 and length_scale_for(0.01) == 4.0


def test_sentences_split_at_stops_not_at_titles_initials_or_decimals() -> None:
    text = 'Hello from Blazar. Dr. Smith said "hi!" Then J. Doe left... What? Pi is 3.14 today\n\nA new one'
    assert split_sentences(text) == ["Hello from Blazar.", 'Dr. Smith said "hi!"', "Then J. Doe left...",
                                     "What?", "Pi is 3.14 today", "A new one"]


def test_sentences_keep_every_word_and_long_ones_are_cut_at_commas() -> None:
    long = ", ".join(f"clause number {i}" for i in range(60)) + "."
    parts = split_sentences(long, max_chars=100)
    assert all(len(p) <= 100 for p in parts) and len(parts) > 5
    assert " ".join(parts).split() == long.split()
    assert split_sentences("   ") == [] and split_sentences("... — !") == []
    assert split_sentences("Well... — Fine.") == ["Well...", "— Fine."]
