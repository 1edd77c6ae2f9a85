"""Small audio files made at test time: a tone as 16-bit mono WAV, audio any decoder reads."""

from __future__ import annotations

import io
import math
import struct
import wave


def tone_wav(seconds: float = 0.5, rate: int = 16000) -> bytes:
    """A 440 Hz tone as 16-bit mono WAV, `seconds` long at `rate` samples a second."""
    frames = b"".join(struct.pack("<h", int(8000 * math.sin(2 * math.pi * 440 * i / rate)))
                      for i in range(int(seconds * rate)))
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(frames)
    return buf.getvalue()
