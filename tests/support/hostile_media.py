"""Media files that lie or cost, made at test time with the tools Blazar itself decodes with: an MP3 (FFmpeg's
libmp3lame through `av`) whose Xing/Info header claims a few frames while it holds minutes, and a progressive JPEG
(Pillow) with one of its scans repeated until the file holds hundreds. Both decode: only what they say about
themselves, or what decoding them costs, is hostile. `count_packets` counts the decoding work done on a file. Used
by tests/unit/adapters/test_audio.py, tests/unit/children/test_whisper_decode.py, tests/unit/serving/test_media.py
and the end-to-end tests of the audio and image routes."""

from __future__ import annotations

import io
import math
import struct
from collections.abc import Iterator
from typing import Any

import av
import pytest
from PIL import Image

MP3_RATE = 16_000
MP3_FRAME_SAMPLES = 576  # an MPEG-2 layer III frame at 16 kHz


def mp3(seconds: float, rate: int = MP3_RATE) -> bytes:
    """A 440 Hz tone, `seconds` long, as a mono MP3 with FFmpeg's Info header (the frame count it states)."""
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp3") as out:
        stream = out.add_stream("libmp3lame", rate=rate, layout="mono")
        stream.bit_rate = 32_000
        total, pts = int(seconds * rate), 0
        while pts < total:
            n = min(rate, total - pts)
            pcm = struct.pack(f"<{n}h", *(int(8000 * math.sin(2 * math.pi * 440 * (pts + k) / rate))
                                          for k in range(n)))
            frame = av.AudioFrame(format="s16", layout="mono", samples=n)
            frame.planes[0].update(pcm)
            frame.sample_rate, frame.pts = rate, pts
            pts += n
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buf.getvalue()


def lying_mp3(seconds: float, claimed_frames: int = 10) -> bytes:
    """`mp3(seconds)` with its Info (or Xing) header's frame count rewritten to `claimed_frames`: FFmpeg then
    states a duration of claimed_frames x 576 / 16000 s (0.36 s for 10), while every frame is still there."""
    data = mp3(seconds)
    at = max(data.find(b"Xing"), data.find(b"Info"))
    assert at > 0, "FFmpeg wrote no Xing/Info header"
    (flags,) = struct.unpack(">I", data[at + 4:at + 8])
    assert flags & 1, "the header states no frame count"
    return data[:at + 8] + struct.pack(">I", claimed_frames) + data[at + 12:]


class CountingContainer:
    """An av container that counts the packets read from it (`demux`): the decoding work done on a file."""

    def __init__(self, container: Any) -> None:
        self.container, self.packets = container, 0

    def __enter__(self) -> CountingContainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.container.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.container, name)

    def demux(self, *streams: Any) -> Iterator[Any]:
        for packet in self.container.demux(*streams):
            self.packets += 1
            yield packet


def count_packets(monkeypatch: pytest.MonkeyPatch) -> list[CountingContainer]:
    """From now until the test ends, every container av opens, counting the packets read from it."""
    seen: list[CountingContainer] = []
    real = av.open

    def counting(*args: Any, **kwargs: Any) -> CountingContainer:
        seen.append(CountingContainer(real(*args, **kwargs)))
        return seen[-1]

    monkeypatch.setattr(av, "open", counting)
    return seen


def progressive_jpeg(size: tuple[int, int] = (64, 48)) -> bytes:
    """A progressive JPEG made by Pillow (libjpeg's script: 10 scans for colour), of a gradient."""
    img = Image.new("RGB", size)
    img.putdata([(x * 4 % 256, y * 5 % 256, (x + y) % 256) for y in range(size[1]) for x in range(size[0])])
    out = io.BytesIO()
    img.save(out, format="JPEG", progressive=True, quality=90)
    return out.getvalue()


def many_scan_jpeg(scans: int, size: tuple[int, int] = (64, 48)) -> bytes:
    """`progressive_jpeg(size)` with its third scan (the first AC scan of one chroma component) repeated until the
    file holds `scans` scans. libjpeg warns that the progression is odd and decodes every one of them, each over
    the whole image, so Pillow opens and decodes it as it would the original."""
    data = progressive_jpeg(size)
    starts = [i for i in range(len(data) - 1) if data[i:i + 2] == b"\xff\xda"]
    end = data.rindex(b"\xff\xd9")
    pieces = [data[a:b] for a, b in zip(starts, [*starts[1:], end], strict=True)]
    assert len(pieces) == 10 and scans >= len(pieces), (len(pieces), scans)
    return data[:starts[0]] + b"".join(pieces) + pieces[2] * (scans - len(pieces)) + data[end:]
