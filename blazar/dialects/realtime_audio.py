"""The Realtime API's audio formats: what a session's `audio.input.format` / `audio.output.format` names (the current
`{"type": "audio/pcm", "rate": 24000}`, `audio/pcmu`, `audio/pcma`, and the older session's strings `pcm16`,
`g711_ulaw`, `g711_alaw`), the bytes of each turned into 16-bit little-endian mono PCM at the format's own rate and
back, and the base64 of `input_audio_buffer.append`'s `audio` and `response.output_audio.delta`'s `delta`.

G.711 (µ-law and A-law, 8 kHz) is ITU-T's companding, written here as its two 256-entry decoding tables, each
sample encoded as the nearest level; the tests check both against FFmpeg's `pcm_mulaw` / `pcm_alaw` codecs.
Pure: no I/O, numpy only."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from blazar.errors import AudioFormatError

PCM_RATE = 24_000
G711_RATE = 8_000
# The SDK's append event allows up to 15 MiB of base64 per message; a session may ask less.
MAX_APPEND_B64_BYTES = 15 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class AudioFormat:
    type: str  # the current protocol's name: audio/pcm, audio/pcmu, audio/pcma
    rate: int  # samples per second of the format's bytes
    sample_bytes: int  # bytes per sample on the wire

    def ms(self, wire_bytes: int) -> int:
        """How many whole milliseconds `wire_bytes` of this format hold."""
        return wire_bytes // self.sample_bytes * 1000 // self.rate

    def session_value(self) -> dict[str, object]:
        """The format as `session.created` / `session.updated` report it."""
        return {"type": self.type, "rate": self.rate} if self.type == "audio/pcm" else {"type": self.type}


PCM = AudioFormat("audio/pcm", PCM_RATE, 2)
PCMU = AudioFormat("audio/pcmu", G711_RATE, 1)
PCMA = AudioFormat("audio/pcma", G711_RATE, 1)
_BY_TYPE = {f.type: f for f in (PCM, PCMU, PCMA)}
_LEGACY = {"pcm16": PCM, "g711_ulaw": PCMU, "g711_alaw": PCMA}


def audio_format(spec: str | Mapping[str, object] | None) -> AudioFormat:
    """The format a session names: a legacy string, or the current object (`type`, and `rate` only 24000 for PCM, as
    the API allows). None is the default, PCM 24 kHz."""
    if spec is None:
        return PCM
    if isinstance(spec, str):
        if spec in _LEGACY:
            return _LEGACY[spec]
        if spec in _BY_TYPE:
            return _BY_TYPE[spec]
        raise AudioFormatError(f"unknown audio format {spec!r}: expected one of {sorted(_LEGACY)}")
    kind = spec.get("type", "audio/pcm")
    fmt = _BY_TYPE.get(kind) if isinstance(kind, str) else None
    if fmt is None:
        raise AudioFormatError(f"unknown audio format type {kind!r}: expected one of {sorted(_BY_TYPE)}")
    rate = spec.get("rate")
    if rate is not None and rate != fmt.rate:
        raise AudioFormatError(f"{fmt.type} is {fmt.rate} Hz only, not {rate!r}")
    return fmt


# --- G.711 ---------------------------------------------------------------------------------------------------------

def _ulaw_decode_table() -> np.ndarray:
    codes = ~np.arange(256, dtype=np.int32) & 0xFF
    exponent = (codes >> 4) & 0x07
    mantissa = codes & 0x0F
    magnitude = (((mantissa << 3) + 0x84) << exponent) - 0x84
    return np.where(codes & 0x80, -magnitude, magnitude).astype(np.int16)


def _alaw_decode_table() -> np.ndarray:
    codes = np.arange(256, dtype=np.int32) ^ 0x55
    exponent = (codes >> 4) & 0x07
    mantissa = codes & 0x0F
    magnitude = np.where(exponent == 0, (mantissa << 4) + 8, ((mantissa << 4) + 0x108) << np.maximum(exponent - 1, 0))
    return np.where(codes & 0x80, magnitude, -magnitude).astype(np.int16)


_ULAW_OUT = _ulaw_decode_table()
_ALAW_OUT = _alaw_decode_table()


class _Quantizer:
    """A G.711 encoder as the nearest of the 256 decoded levels: the least error, as FFmpeg's encoder also aims for.
    (ITU's reference rounds toward zero within a segment; the two differ only between a level and its neighbour.)"""

    def __init__(self, levels: np.ndarray) -> None:
        self._codes = np.argsort(levels.astype(np.int32), kind="stable").astype(np.uint8)
        ordered = levels[self._codes].astype(np.int32)
        self._midpoints = (ordered[1:] + ordered[:-1]) / 2

    def __call__(self, pcm: np.ndarray) -> np.ndarray:
        return self._codes[np.searchsorted(self._midpoints, pcm.astype(np.int32))]


_ULAW_IN = _Quantizer(_ULAW_OUT)
_ALAW_IN = _Quantizer(_ALAW_OUT)


# --- bytes <-> PCM16 -------------------------------------------------------------------------------------------------

def decode(fmt: AudioFormat, data: bytes) -> bytes:
    """The format's bytes as 16-bit little-endian mono PCM at `fmt.rate`."""
    if fmt is PCM:
        if len(data) % 2:
            raise AudioFormatError("audio/pcm is 16-bit samples: an odd number of bytes is not whole samples")
        return data
    table = _ULAW_OUT if fmt is PCMU else _ALAW_OUT
    return table[np.frombuffer(data, dtype=np.uint8)].astype("<i2").tobytes()


def encode(fmt: AudioFormat, pcm: bytes) -> bytes:
    """16-bit little-endian mono PCM at `fmt.rate` as the format's bytes."""
    if len(pcm) % 2:
        raise AudioFormatError("PCM16 input must be whole 16-bit samples")
    if fmt is PCM:
        return pcm
    samples = np.frombuffer(pcm, dtype="<i2")
    return (_ULAW_IN if fmt is PCMU else _ALAW_IN)(samples).tobytes()


def decode_append(fmt: AudioFormat, audio_b64: str, *, max_b64_bytes: int = MAX_APPEND_B64_BYTES) -> bytes:
    """`input_audio_buffer.append`'s `audio` as PCM16 at `fmt.rate`: bounded before it is decoded, and refused when it
    is not base64 or not whole samples."""
    if len(audio_b64) > max_b64_bytes:
        raise AudioFormatError(f"audio is {len(audio_b64)} bytes of base64, over the {max_b64_bytes} a message "
                               "may carry")
    try:
        raw = base64.b64decode(audio_b64, validate=True)
    except (binascii.Error, ValueError) as e:
        raise AudioFormatError(f"audio is not base64: {e}") from None
    return decode(fmt, raw)


def encode_delta(fmt: AudioFormat, pcm: bytes) -> str:
    """PCM16 at `fmt.rate` as an output audio delta's base64."""
    return base64.b64encode(encode(fmt, pcm)).decode("ascii")
