"""The Realtime API's audio formats: names (current and legacy), G.711 against FFmpeg's own codecs, base64 framing
and its bounds."""

from __future__ import annotations

import base64

import av
import numpy as np
import pytest

from blazar.dialects.realtime_audio import (
    PCM,
    PCMA,
    PCMU,
    audio_format,
    decode,
    decode_append,
    encode,
    encode_delta,
)
from blazar.errors import AudioFormatError

ALL_SAMPLES = np.arange(-32768, 32768, dtype=np.int16)


def _ffmpeg_encode(codec: str, pcm: np.ndarray) -> bytes:
    ctx = av.CodecContext.create(codec, "w")
    ctx.sample_rate, ctx.layout, ctx.format = 8000, "mono", "s16"
    frame = av.AudioFrame.from_ndarray(pcm[None, :], format="s16", layout="mono")
    frame.sample_rate = 8000
    return b"".join(bytes(p) for p in ctx.encode(frame) + ctx.encode(None))


def _ffmpeg_decode(codec: str, data: bytes) -> np.ndarray:
    ctx = av.CodecContext.create(codec, "r")
    ctx.sample_rate, ctx.layout = 8000, "mono"
    frames = ctx.decode(av.Packet(data))
    return np.concatenate([f.to_ndarray().reshape(-1) for f in frames]).astype(np.int16)


@pytest.mark.parametrize(("fmt", "codec"), [(PCMU, "pcm_mulaw"), (PCMA, "pcm_alaw")])
def test_g711_matches_ffmpeg_both_ways(fmt, codec):
    # Every one of the 256 codes decodes to FFmpeg's sample.
    codes = bytes(range(256))
    levels = np.frombuffer(decode(fmt, codes), dtype="<i2").astype(np.int32)
    assert np.array_equal(levels, _ffmpeg_decode(codec, codes))
    # Every 16-bit sample encodes to FFmpeg's byte, except within FFmpeg's table step (4) of a point halfway between
    # two levels, where either neighbour is as near.
    ours = np.frombuffer(encode(fmt, ALL_SAMPLES.astype("<i2").tobytes()), dtype=np.uint8)
    theirs = np.frombuffer(_ffmpeg_encode(codec, ALL_SAMPLES), dtype=np.uint8)
    ordered = np.sort(levels)
    halfway = (ordered[1:] + ordered[:-1]) / 2
    x = ALL_SAMPLES.astype(np.float64)
    after = np.clip(np.searchsorted(halfway, x), 1, len(halfway) - 1)
    near = np.minimum(np.abs(x - halfway[after - 1]), np.abs(x - halfway[after])) <= 4
    differ = ours != theirs
    assert near[differ].all()
    assert differ.sum() < 0.01 * len(ALL_SAMPLES)
    error = np.abs(levels[ours] - ALL_SAMPLES)
    assert np.all(error <= np.abs(levels[theirs] - ALL_SAMPLES) + 4)


@pytest.mark.parametrize("fmt", [PCMU, PCMA])
def test_g711_round_trip_is_close(fmt):
    # Companding loses precision in proportion to the level: a decoded sample is within its segment's step.
    pcm = ALL_SAMPLES[::7]
    back = np.frombuffer(decode(fmt, encode(fmt, pcm.astype("<i2").tobytes())), dtype="<i2").astype(np.int32)
    assert np.all(np.abs(back - pcm) <= np.maximum(np.abs(pcm.astype(np.int32)) // 16, 16) + 8)


def test_format_names_current_and_legacy():
    assert audio_format(None) is PCM
    assert audio_format("pcm16") is PCM and audio_format("g711_ulaw") is PCMU and audio_format("g711_alaw") is PCMA
    assert audio_format({"type": "audio/pcm", "rate": 24000}) is PCM
    assert audio_format({"type": "audio/pcmu"}) is PCMU and audio_format({"type": "audio/pcma"}) is PCMA
    assert PCM.session_value() == {"type": "audio/pcm", "rate": 24000}
    assert PCMU.session_value() == {"type": "audio/pcmu"}
    assert PCM.ms(48_000) == 1000 and PCMU.ms(800) == 100


@pytest.mark.parametrize(("spec", "says"), [
    ("mp3", "unknown audio format 'mp3'"),
    ({"type": "audio/opus"}, "unknown audio format type 'audio/opus'"),
    ({"type": "audio/pcm", "rate": 16000}, "audio/pcm is 24000 Hz only"),
])
def test_unknown_formats_are_refused_by_name(spec, says):
    with pytest.raises(AudioFormatError, match=says.replace("(", r"\(")):
        audio_format(spec)


def test_append_and_delta_framing():
    pcm = np.arange(-100, 100, dtype="<i2").tobytes()
    assert decode_append(PCM, base64.b64encode(pcm).decode()) == pcm
    assert base64.b64decode(encode_delta(PCMU, pcm)) == encode(PCMU, pcm)
    assert decode_append(PCMU, encode_delta(PCMU, pcm)) == decode(PCMU, encode(PCMU, pcm))


@pytest.mark.parametrize(("audio", "bound", "says"), [
    ("not base64!", 1000, "not base64"),
    (base64.b64encode(b"\x00" * 3).decode(), 1000, "odd number of bytes"),
    (base64.b64encode(b"\x00" * 300).decode(), 100, "over the 100 a message may carry"),
])
def test_bad_appends_are_refused(audio, bound, says):
    with pytest.raises(AudioFormatError, match=says):
        decode_append(PCM, audio, max_b64_bytes=bound)
