"""Benchmark: what server-side voice activity detection costs a realtime session, in CPU per second of audio.

The streaming VAD (blazar/adapters/vad.py: the 24 kHz input resampled to 16 kHz, Silero's model on each 32 ms
window, the turn rule) is fed --seconds of audio in --chunk-ms chunks, as a client's `input_audio_buffer.append`
messages would arrive: speech-like noise bursts (so the model's work is the same as on speech) and silence. The CPU
time of this process (time.process_time: the model runs on one thread) is split into the resampler's and the
model's share, and divided by the seconds of audio:

    total_ms_per_audio_s      the VAD's CPU per second of audio (1000 would be one core, kept busy)
    resample_ms_per_audio_s   the resampler's part of it
    realtime_factor           seconds of audio one core detects in a second

Run: `.venv/bin/python bench/realtime_vad.py [--seconds 60] [--chunk-ms 20] [--out FILE]`. The table goes to
stdout, the numbers to FILE as JSON."""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from blazar.adapters.resample import Resampler
from blazar.adapters.vad import StreamingVad
from blazar.adapters.vad_rule import ServerVad

RATE = 24_000


def _audio(seconds: int) -> bytes:
    """Alternating seconds of loud noise bursts and silence, as 24 kHz PCM16."""
    rng = np.random.default_rng(0)
    x = rng.normal(0, 0.2, RATE * seconds) * np.repeat(np.arange(seconds) % 2 == 0, RATE)
    return (np.clip(x, -1, 1) * 32767).astype("<i2").tobytes()


def _cpu(feed: Callable[[bytes], Any], audio: bytes, chunk: int) -> float:
    start = time.process_time()
    for i in range(0, len(audio), chunk):
        feed(audio[i:i + chunk])
    return time.process_time() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--chunk-ms", type=int, default=20)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    audio, chunk = _audio(args.seconds), RATE * 2 * args.chunk_ms // 1000
    vad = StreamingVad(ServerVad(), RATE)
    vad.feed(audio[:chunk])  # the model's session loaded outside the measure
    total = _cpu(vad.feed, audio, chunk)
    resampler = Resampler(RATE, 16_000)
    resample = _cpu(lambda b: resampler.feed(np.frombuffer(b, dtype="<i2").astype(np.float64) / 32768), audio, chunk)
    result = {
        "machine": platform.processor() or platform.machine(),
        "seconds": args.seconds, "chunk_ms": args.chunk_ms,
        "total_ms_per_audio_s": round(1000 * total / args.seconds, 2),
        "resample_ms_per_audio_s": round(1000 * resample / args.seconds, 2),
        "realtime_factor": round(args.seconds / total, 1),
    }
    for k, v in result.items():
        print(f"{k:26} {v}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
