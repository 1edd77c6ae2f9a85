"""A streaming resampler between two sample rates, for the realtime session's audio: the client's 24 kHz (or 8 kHz
G.711) to the 16 kHz the VAD and whisper hear, and a voice's rate to the session's.

A rational polyphase filter (a Kaiser-windowed sinc, cut below the lower rate's Nyquist): output sample n is the
filtered input at time n / out_rate, centred, so a position in the output is the same millisecond in the input (no
group delay to correct) at the cost of `HALF_TAPS` input samples of look-ahead. Each output depends only on the input
samples, never on how they were chunked, so the same audio fed in 20 ms or 200 ms chunks gives the same samples.
Memory is bounded: the filter's width of history, whatever the length of the stream. `Resampler` works on float
samples (the VAD's input); `Pcm16Resampler` on the protocol's 16-bit bytes (the buffer committed to whisper, a
voice's speech to the session's rate)."""

from __future__ import annotations

import math

import numpy as np

HALF_TAPS = 16  # input samples either side of an output: about 60 dB of stopband with the Kaiser window below
_BETA = 6.0
_ROLLOFF = 0.92  # the cut-off as a fraction of the lower Nyquist: the band above it is what aliasing would fold down


def _phase_weights(up: int, down: int) -> np.ndarray:
    """(up, 2 * HALF_TAPS) weights: row p gives the output at phase p / up between two input samples."""
    cutoff = 0.5 * min(1.0 / up, 1.0 / down) * _ROLLOFF  # cycles per sample at the upsampled rate
    offsets = np.arange(-HALF_TAPS + 1, HALF_TAPS + 1)  # input sample j - c for j in the window
    u = np.arange(up)[:, None] - offsets[None, :] * up  # the distance, in upsampled samples, from each tap
    half = HALF_TAPS * up
    window = np.kaiser(2 * half + 1, _BETA)[np.clip(u + half, 0, 2 * half)]
    h = 2 * cutoff * np.sinc(2 * cutoff * u) * window
    return h / h.sum(axis=1, keepdims=True)  # each phase passes DC at unit gain


class Resampler:
    """Float samples in at `in_rate`, float samples out at `out_rate`, chunk by chunk."""

    def __init__(self, in_rate: int, out_rate: int) -> None:
        g = math.gcd(in_rate, out_rate)
        self.up, self.down = out_rate // g, in_rate // g
        self._weights = _phase_weights(self.up, self.down)
        self._history = np.zeros(HALF_TAPS - 1, dtype=np.float64)  # the stream starts after silence
        self._first = -(HALF_TAPS - 1)  # the input index of _history[0]
        self._seen = 0  # input samples fed
        self._next = 0  # the next output sample's index

    def feed(self, samples: np.ndarray) -> np.ndarray:
        """The output samples that `samples` completes (those whose window of input is now all here)."""
        self._history = np.concatenate([self._history, samples.astype(np.float64)])
        self._seen += len(samples)
        return self._emit(self._seen)

    def flush(self) -> np.ndarray:
        """The rest, as if silence followed: the outputs up to the end of the input. The stream ends here."""
        end = self._seen
        self._history = np.concatenate([self._history, np.zeros(HALF_TAPS)])
        self._seen += HALF_TAPS
        return self._emit(self._seen, limit=-(-end * self.up // self.down))

    def _emit(self, available: int, limit: int | None = None) -> np.ndarray:
        # Output n needs input up to floor(n * down / up) + HALF_TAPS.
        last = ((available - HALF_TAPS) * self.up - 1) // self.down if available >= HALF_TAPS else -1
        if limit is not None:
            last = min(last, limit - 1)
        n = np.arange(self._next, last + 1)
        if not len(n):
            return np.zeros(0, dtype=np.float64)
        centre, phase = np.divmod(n * self.down, self.up)
        index = centre[:, None] + np.arange(-HALF_TAPS + 1, HALF_TAPS + 1)[None, :] - self._first
        out = (self._history[index] * self._weights[phase]).sum(axis=1)
        self._next = last + 1
        keep_from = (self._next * self.down) // self.up - HALF_TAPS + 1  # the next output's first input
        drop = max(0, keep_from - self._first)
        self._history = self._history[drop:]
        self._first += drop
        return out


class Pcm16Resampler:
    """16-bit little-endian mono PCM bytes in at one rate, out at another: a sample split between two chunks is kept
    for the next, the output rounded and clipped to 16 bits. The same rate passes the bytes through."""

    def __init__(self, in_rate: int, out_rate: int) -> None:
        self._resampler = Resampler(in_rate, out_rate) if in_rate != out_rate else None
        self._odd = b""

    def feed(self, pcm16: bytes) -> bytes:
        data = self._odd + pcm16
        whole = len(data) - len(data) % 2
        self._odd = data[whole:]
        if self._resampler is None:
            return data[:whole]
        return _to_pcm16(self._resampler.feed(np.frombuffer(data[:whole], dtype="<i2") / 32768.0))

    def flush(self) -> bytes:
        """The rest of the stream (a dangling half sample is dropped)."""
        self._odd = b""
        return b"" if self._resampler is None else _to_pcm16(self._resampler.flush())


def _to_pcm16(samples: np.ndarray) -> bytes:
    return np.clip(np.rint(samples * 32768.0), -32768, 32767).astype("<i2").tobytes()
