"""The streaming resampler: a tone keeps its frequency and its place in time, any chunking gives the same samples."""

from __future__ import annotations

import numpy as np
import pytest

from blazar.adapters.resample import Pcm16Resampler, Resampler


def _tone(hz: float, rate: int, seconds: float) -> np.ndarray:
    return np.sin(2 * np.pi * hz * np.arange(int(rate * seconds)) / rate)


def _run(r: Resampler, x: np.ndarray, chunk: int) -> np.ndarray:
    return np.concatenate([r.feed(x[i:i + chunk]) for i in range(0, len(x), chunk)] + [r.flush()])


@pytest.mark.parametrize(("rin", "rout"), [(24_000, 16_000), (8_000, 16_000), (22_050, 24_000), (16_000, 8_000)])
def test_tone_keeps_its_frequency_and_phase(rin, rout):
    hz = 440.0
    y = _run(Resampler(rin, rout), _tone(hz, rin, 1.0), 4096)
    assert len(y) == rout  # one second in, one second out
    # No delay: the output is the tone sampled at the new rate (away from the edges, where the input starts from 0).
    edge = rout // 50
    assert np.max(np.abs(y[edge:-edge] - _tone(hz, rout, 1.0)[edge:-edge])) < 2e-3


def test_above_the_new_nyquist_is_filtered_out():
    # 10 kHz at 24 kHz would fold to 6 kHz at 16 kHz: the filter leaves little of it.
    y = _run(Resampler(24_000, 16_000), _tone(10_000, 24_000, 1.0), 4096)
    assert np.sqrt(np.mean(y[400:-400] ** 2)) < 0.01


def test_chunking_does_not_change_a_sample():
    x = np.random.default_rng(7).normal(0, 0.3, 24_000)
    whole = _run(Resampler(24_000, 16_000), x, len(x))
    for chunk in (1, 7, 480, 4800):
        assert np.array_equal(_run(Resampler(24_000, 16_000), x, chunk), whole)


def test_memory_is_bounded_by_the_filter():
    r = Resampler(24_000, 16_000)
    x = np.zeros(480)
    for _ in range(500):  # ten seconds in 20 ms chunks
        r.feed(x)
    assert len(r._history) < 100


def test_pcm16_bytes_any_split_and_clipped():
    tone = (0.5 * 32767 * _tone(440, 24_000, 0.5)).astype("<i2").tobytes()
    whole = Pcm16Resampler(24_000, 8_000)
    expected = whole.feed(tone) + whole.flush()
    assert len(expected) == 2 * 4_000
    split = Pcm16Resampler(24_000, 8_000)
    assert b"".join(split.feed(tone[i:i + 333]) for i in range(0, len(tone), 333)) + split.flush() == expected
    out = np.frombuffer(expected, dtype="<i2").astype(np.float64) / 32767
    assert np.max(np.abs(out[100:-100] - 0.5 * _tone(440, 8_000, 0.5)[100:-100])) < 2e-3
    # A full-scale square wave rings past full scale when filtered: clipped, never wrapped.
    square = np.where(np.arange(24_000) % 48 < 24, 32767, -32768).astype("<i2").tobytes()
    loud = Pcm16Resampler(24_000, 16_000)
    samples = np.frombuffer(loud.feed(square) + loud.flush(), dtype="<i2").astype(np.int64)
    float_out = Resampler(24_000, 16_000)
    square_f = np.frombuffer(square, dtype="<i2") / 32768.0
    unclipped = np.rint(np.concatenate([float_out.feed(square_f), float_out.flush()]) * 32768.0).astype(np.int64)
    assert unclipped.max() > 32767 and unclipped.min() < -32768  # the filter does overshoot
    assert np.array_equal(samples, np.clip(unclipped, -32768, 32767))


def test_pcm16_same_rate_passes_through():
    r = Pcm16Resampler(24_000, 24_000)
    assert r.feed(b"\x01\x02\x03") + r.feed(b"\x04") + r.flush() == b"\x01\x02\x03\x04"
