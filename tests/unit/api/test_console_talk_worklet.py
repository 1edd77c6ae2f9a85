"""The Talk view's microphone tap (blazar/api/console_static/talk-worklet.js) run under node with the AudioWorklet
globals stubbed: whatever the capture rate, it posts PCM16 at 24 kHz in 100 ms blocks, a tone keeps its pitch and
its level, and full scale is clipped, not wrapped."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from blazar.api.console import STATIC_DIR

NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed (.ci/run installs nodejs)")

# Feeds `seconds` of a sine (frequency, amplitude) in 128-frame render quanta, as the audio thread does, and prints
# what the processor posted: the block sizes, the samples' count, zero crossings, and the peak.
HARNESS = """
const [source, rate, freq, amp, seconds] = JSON.parse(process.argv[1]);
const posted = [];
class AudioWorkletProcessor { constructor() { this.port = { postMessage: (b) => posted.push(new Int16Array(b)) }; } }
let Processor = null;
new Function("sampleRate", "AudioWorkletProcessor", "registerProcessor", source)(
  rate, AudioWorkletProcessor, (name, cls) => { Processor = cls; });
const tap = new Processor();
const total = Math.round(rate * seconds);
for (let i = 0; i < total; i += 128) {
  const quantum = new Float32Array(128).map((_, j) => amp * Math.sin(2 * Math.PI * freq * (i + j) / rate));
  tap.process([[quantum]]);
}
tap.process([]);  // no input (a track that ended): nothing posted, the node stays alive
const all = posted.flatMap((b) => [...b]);
let crossings = 0;
for (let i = 1; i < all.length; i += 1) if ((all[i - 1] < 0) !== (all[i] < 0)) crossings += 1;
console.log(JSON.stringify({ blocks: [...new Set(posted.map((b) => b.length))], samples: all.length, crossings,
  peak: Math.max(...all), low: Math.min(...all) }));
"""


def tap(rate: int, freq: float = 440.0, amp: float = 0.5, seconds: float = 1.0) -> dict[str, int]:
    source = (STATIC_DIR / "talk-worklet.js").read_text()
    assert NODE is not None
    out = subprocess.run([NODE, "-e", HARNESS, json.dumps([source, rate, freq, amp, seconds])], capture_output=True,
                         text=True, timeout=60, check=True)
    return dict(json.loads(out.stdout))


@pytest.mark.parametrize("rate", [16000, 44100, 48000])
def test_any_capture_rate_becomes_24_khz_with_the_tone_s_pitch_and_level(rate: int) -> None:
    got = tap(rate)
    assert got["blocks"] == [2400]  # 100 ms of 24 kHz
    assert got["samples"] == 24000  # 1 s: every whole block
    assert abs(got["crossings"] / 2 - 440.0) < 3  # the pitch is kept (crossings per second / 2)
    assert 16000 <= got["peak"] <= 16384 and -16385 <= got["low"] <= -16000  # half scale stays half scale


def test_full_scale_is_clipped_not_wrapped() -> None:
    got = tap(48000, amp=1.5, seconds=0.2)
    assert got["peak"] == 32767 and got["low"] == -32768
