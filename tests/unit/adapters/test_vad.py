"""The streaming VAD on the real Silero model: a sentence spoken by piper (the joe voice the speech tests use),
padded with silence, is one turn whose positions follow the speech and the parameters; silence and noise are none;
the chunking changes nothing."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import wave
from pathlib import Path

import av
import numpy as np
import pytest

from blazar.adapters.vad import WINDOW_MS, StreamingVad, silero_path
from blazar.adapters.vad_rule import ServerVad, SpeechStarted, SpeechStopped
from blazar.errors import EngineExtraMissing
from tests.support.bounds import HANG_S
from tests.support.homes import session_file
from tests.support.speech_models import joe_voice

RATE = 24_000
PAD_MS = 1000


def _speak(path: Path) -> Path:
    """piper's own command line (a child: Blazar never imports piper) writes the sentence as a WAV."""
    onnx, _ = joe_voice()
    subprocess.run([sys.executable, "-m", "piper", "-m", str(onnx), "-f", str(path)],
                   input=b"The quick brown fox jumps over the lazy dog.", check=True, timeout=HANG_S,
                   capture_output=True)
    return path


def _at_24k(path: Path) -> np.ndarray:
    """The WAV at the session's 24 kHz, resampled by FFmpeg (not by the resampler under test)."""
    with wave.open(str(path)) as w:
        rate, pcm = w.getframerate(), np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    frame = av.AudioFrame.from_ndarray(pcm[None, :], format="s16", layout="mono")
    frame.sample_rate = rate
    resampler = av.AudioResampler(format="s16", layout="mono", rate=RATE)
    return np.concatenate([f.to_ndarray().reshape(-1) for f in resampler.resample(frame) + resampler.resample(None)])


@pytest.fixture(scope="module")
def sentence() -> tuple[bytes, int, int]:
    """The sentence with a second of silence before and two after, and where its speech starts and ends in ms (where
    its 10 ms level first and last passes 2% of its loudest: piper's own leading and trailing quiet excluded)."""
    speech = _at_24k(session_file("vad-sentence.wav", _speak))
    frames = speech[: len(speech) // 240 * 240].reshape(-1, 240).astype(np.float64)
    level = np.sqrt(np.mean(frames ** 2, axis=1))
    loud = np.nonzero(level > 0.02 * level.max())[0]
    pad = np.zeros(RATE * PAD_MS // 1000, dtype="<i2")
    audio = np.concatenate([pad, speech.astype("<i2"), pad, pad]).tobytes()
    return audio, PAD_MS + int(loud[0]) * 10, PAD_MS + (int(loud[-1]) + 1) * 10


def _detect(audio: bytes, chunk_ms: int, params: ServerVad) -> list[object]:
    vad = StreamingVad(params, RATE)
    step = RATE * 2 * chunk_ms // 1000
    events: list[object] = []
    for i in range(0, len(audio), step):
        events += vad.feed(audio[i:i + step])
    return events


@pytest.mark.parametrize("params", [ServerVad(), ServerVad(threshold=0.6, prefix_padding_ms=100,
                                                            silence_duration_ms=800)])
def test_a_spoken_sentence_is_one_turn(sentence, params):
    audio, speech_from, speech_to = sentence
    events = _detect(audio, 20, params)
    assert [type(e) for e in events] == [SpeechStarted, SpeechStopped]
    started, stopped = events
    assert isinstance(started, SpeechStarted) and isinstance(stopped, SpeechStopped)
    # Speech is found within a few windows of where it begins (never more than a window before it), and the item
    # starts prefix_padding_ms before that.
    first_speech_ms = started.audio_start_ms + params.prefix_padding_ms
    assert speech_from - WINDOW_MS <= first_speech_ms <= speech_from + 6 * WINDOW_MS
    # It stops after silence_duration_ms of quiet following the last speech, within a few windows of hangover.
    assert speech_to + params.silence_duration_ms <= stopped.audio_end_ms
    assert stopped.audio_end_ms <= speech_to + params.silence_duration_ms + 6 * WINDOW_MS


def test_chunk_size_does_not_change_the_events(sentence):
    audio, _, _ = sentence
    assert _detect(audio, 20, ServerVad()) == _detect(audio, 200, ServerVad())


def test_odd_byte_chunks_are_whole_samples(sentence):
    audio, _, _ = sentence
    vad = StreamingVad(ServerVad(), RATE)
    events = [e for i in range(0, len(audio), 4801) for e in vad.feed(audio[i:i + 4801])]
    assert events == _detect(audio, 20, ServerVad())


def test_silence_and_noise_are_not_speech():
    rng = np.random.default_rng(3)
    silence = np.zeros(RATE * 3, dtype="<i2").tobytes()
    hiss = (rng.normal(0, 0.03, RATE * 3) * 32767).astype("<i2").tobytes()
    hum = (0.3 * 32767 * np.sin(2 * np.pi * 60 * np.arange(RATE * 3) / RATE)).astype("<i2").tobytes()
    for audio in (silence, hiss, hum):
        assert _detect(audio, 100, ServerVad()) == []


def test_without_the_stt_extra_the_vad_says_what_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnxruntime" else real(name, *a))
    with pytest.raises(EngineExtraMissing, match=r"pip install 'blazar\[stt\]'"):
        silero_path()
