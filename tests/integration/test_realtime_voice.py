"""Realtime voice sessions end to end: `blazar serve` with the real Gemma 3 270M, Blazar's whisper child on
faster-whisper-base and piper's joe voice (tests/support/voice_daemon.py: one daemon for the module), driven as
clients drive them. Each part of issue 42 has its own section below."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

from blazar.serving.realtime.session import RealtimeSession
from tests.support import voice_daemon as voice
from tests.support.voice_daemon import CHAT, PROFILE, STT, TTS, VoiceDaemon

voice_daemon = voice.voice_daemon  # the module's daemon

REPO = Path(__file__).resolve().parents[2]


# --- Part E (bench): bench/realtime_latency.py runs end to end -------------------------------------------------------

# The voice pipeline is in this build when a session can hear and speak (issue 42's parts V1 and V2 add the ports);
# until then the benchmark's realtime lane must fail clearly, after, it must measure.
VOICE_BUILT = {"hear", "speak"} <= {f.name for f in dataclasses.fields(RealtimeSession)}


def test_the_latency_benchmark_measures_a_turn_through_the_chained_routes_and_the_realtime_session(
        voice_daemon: VoiceDaemon, tmp_path: Path) -> None:
    out = tmp_path / "latency.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "realtime_latency.py"), "--through", voice_daemon.base,
         "--key", voice_daemon.secrets["all"], "--profile", PROFILE, "--stt", STT, "--llm", CHAT, "--tts", TTS,
         "--turns", "1", "--warmup", "0", "--max-tokens", "16", "--out", str(out)],
        capture_output=True, text=True, timeout=2 * voice.WAIT_S, cwd=tmp_path)
    assert out.is_file(), proc.stderr  # the report is written whatever a lane says
    report = json.loads(out.read_text())
    assert report["turns"] == 1 and report["machine"]["cores"] >= 1
    # Chained: whisper heard piper's question; the client's steps follow one another from its VAD's 500 ms.
    chained = report["chained"]
    assert "error" not in chained, proc.stderr
    turn = chained["turns"][0]
    assert turn["question"] == "What is the capital of France?" and "france" in turn["transcript"].lower()
    assert turn["first_sentence"]
    assert turn["decided"] == 500 < turn["transcribed"] < turn["first_token"] <= turn["sentence_ms"] \
        < turn["first_audio"]
    assert chained["summary"]["first_audio"] == {"median": turn["first_audio"], "p95": turn["first_audio"]}
    assert "chained" in proc.stdout and "ms after the end of speech" in proc.stdout
    realtime = report["realtime"]
    if not VOICE_BUILT:  # this build serves text sessions only: the lane says why it measured nothing
        assert proc.returncode == 2, proc.stderr
        assert realtime["error"]["code"] in ("model_not_found", "audio_not_supported"), realtime
        assert f"realtime: refused: {realtime['error']['code']}" in proc.stderr
        return
    # NEEDS V1+V2 (the voice pipeline): one turn heard, transcribed, answered and spoken in the session.
    assert proc.returncode == 0, proc.stderr
    assert "error" not in realtime, realtime
    turn = realtime["turns"][0]
    assert "france" in turn["transcript"].lower()
    assert 0 < turn["decided"] <= turn["transcribed"] and turn["decided"] < turn["first_audio"]
    assert turn["first_token"] > 0 and turn["vad_hangover_audio_ms"] > 0
    assert report["ratio"] > 0 and set(report["targets"]) >= {"median_met", "p95_met", "ratio_met"}
