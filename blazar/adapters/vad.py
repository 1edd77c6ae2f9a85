"""Server-side voice activity detection for a realtime session: Silero VAD (the ONNX model faster-whisper ships in
its assets, run by onnxruntime, both of the `stt` extra) over the session's input, streamed.

`StreamingVad.feed` takes PCM16 chunks of any size at the session's rate, resamples them to the model's 16 kHz
(`resample.Resampler`, no delay, so a window's milliseconds are the input's), runs the model one 512-sample window
(32 ms) at a time with the 64 samples before it as context and its LSTM state carried, and gives the `vad_rule`
events those windows decide. The model runs one window per call so that the probabilities, and so the events, do not
depend on how the audio was chunked; memory is the resampler's history plus less than one window."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from typing import Any

import numpy as np

from blazar.adapters.resample import Resampler
from blazar.adapters.vad_rule import ServerVad, TurnRule, VadEvent
from blazar.errors import EngineExtraMissing

MODEL_RATE = 16_000
WINDOW = 512  # samples per model call at 16 kHz: 32 ms
CONTEXT = 64  # samples of the previous window the model sees before each one
WINDOW_MS = WINDOW * 1000 // MODEL_RATE


def silero_path() -> Path:
    """The Silero VAD model inside faster-whisper's package, found without importing faster-whisper (CTranslate2)."""
    spec = importlib.util.find_spec("faster_whisper")
    if spec is None or spec.origin is None or importlib.util.find_spec("onnxruntime") is None:
        raise EngineExtraMissing("voice activity detection needs the `stt` extra, which is not installed: "
                                 "pip install 'blazar[stt]'")
    return Path(spec.origin).parent / "assets" / "silero_vad_v6.onnx"


@functools.cache
def _session() -> Any:
    """One onnxruntime session per process, shared by every stream (their state is their own): one thread, as a
    32 ms window is too small to split."""
    import onnxruntime

    opts = onnxruntime.SessionOptions()
    opts.inter_op_num_threads = 1
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 4
    return onnxruntime.InferenceSession(str(silero_path()), providers=["CPUExecutionProvider"], sess_options=opts)


class SileroWindows:
    """The model over consecutive 16 kHz windows: the speech probability of each, the state carried between them."""

    def __init__(self) -> None:
        self._session = _session()
        self._h = np.zeros((1, 1, 128), dtype=np.float32)
        self._c = np.zeros((1, 1, 128), dtype=np.float32)
        self._context = np.zeros(CONTEXT, dtype=np.float32)

    def probability(self, window: np.ndarray) -> float:
        frame = np.concatenate([self._context, window.astype(np.float32)])[None, :]
        out, self._h, self._c = self._session.run(None, {"input": frame, "h": self._h, "c": self._c})
        self._context = frame[0, -CONTEXT:]
        return float(out.reshape(-1)[0])


class StreamingVad:
    """One session's detector: PCM16 at `rate` in, speech started / stopped events out."""

    def __init__(self, params: ServerVad, rate: int, pause_ms: int | None = None) -> None:
        self.rule = TurnRule(params, pause_ms)
        self._model = SileroWindows()
        self._resampler = Resampler(rate, MODEL_RATE)
        self._odd = b""  # a sample split between two chunks
        self._pending = np.zeros(0, dtype=np.float64)  # 16 kHz samples short of a window
        self._windows = 0  # windows run so far: the next one starts at _windows * 32 ms

    def feed(self, pcm16: bytes) -> list[VadEvent]:
        data = self._odd + pcm16
        whole = len(data) - len(data) % 2
        self._odd = data[whole:]
        samples = np.frombuffer(data[:whole], dtype="<i2").astype(np.float64) / 32768.0
        self._pending = np.concatenate([self._pending, self._resampler.feed(samples)])
        events: list[VadEvent] = []
        ready = len(self._pending) // WINDOW
        for i in range(ready):
            start_ms = self._windows * WINDOW_MS
            p = self._model.probability(self._pending[i * WINDOW:(i + 1) * WINDOW])
            self._windows += 1
            event = self.rule.window(p, start_ms, start_ms + WINDOW_MS)
            if event is not None:
                events.append(event)
        self._pending = self._pending[ready * WINDOW:]
        return events
