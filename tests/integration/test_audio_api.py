"""OpenAI's audio API end to end: the official `openai` SDK against `blazar serve` with the real children: Blazar's
whisper child running Systran's faster-whisper-base, and piper's own server speaking the en_US-joe-medium voice.
Speech made by piper is transcribed by whisper (the round trip needs no recording); every format either way is
decoded back with av; the bounds (an MP3 whose header lies about its length among them), the key scope, the wrong
kind, a killed child, the CLI and `why` are each one test.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import av
import httpx2
import openai
import pytest

from tests.support import cli_zygote
from tests.support.blazar_home import read_events
from tests.support.daemon import start_serve, wait_for
from tests.support.homes import configure_all
from tests.support.hostile_media import lying_mp3
from tests.support.serving import blazar_cli, free_port, healthy, stop_daemon

STT = "whisper-base"
TTS = "joe"
CHAT = "gemma"  # a llama-server model: the wrong kind for the audio routes
# The sentence, and one more so that one word wrong is under one in ten.
SAID = "Hello from Blazar, this is a test. The quick brown fox jumps over the lazy dog."
MAX_AUDIO_MIB = 2
WAIT_S = 180.0  # a cold start of a child plus a transcription on two shared cores
REPEATS = 2  # the killed child's clip: SAID this many times


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def word_errors(expected: str, got: str) -> float:
    """Word error rate: the edit distance over words, per expected word."""
    a, b = words(expected), words(got)
    row = list(range(len(b) + 1))
    for i, wa in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, wb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (wa != wb))
    return row[len(b)] / max(1, len(a))


def decoded_seconds(data: bytes) -> float:
    """The length of encoded audio, by decoding all of it with av (FFmpeg)."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        samples = rate = 0
        for frame in container.decode(stream):
            samples += frame.samples
            rate = frame.sample_rate
    return samples / rate if rate else 0.0


class Daemon:
    def __init__(self, home: Path, port: int, proc: subprocess.Popen[bytes] | cli_zygote.Process) -> None:
        self.home, self.port, self.proc = home, port, proc
        self.base = f"http://127.0.0.1:{port}"
        self.secrets: dict[str, str] = {}

    def client(self, key: str = "all") -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base}/v1", api_key=self.secrets[key], max_retries=0, timeout=WAIT_S)

    def events(self, *types: str) -> list[dict[str, Any]]:
        return read_events(self.home, *types)

    def trace(self, trace_id: str) -> list[dict[str, Any]]:
        return [e for e in self.events() if e["trace_id"] == trace_id]

    def wait_trace(self, trace_id: str, last: str, timeout: float = 30) -> list[dict[str, Any]]:
        """Request events are group-committed: wait until the trace's last event is in the log."""
        return wait_for(lambda: (t := self.trace(trace_id)) and t[-1]["type"] == last and t, f"{last} of {trace_id}",
                        timeout=timeout)

    def cli(self, *args: str, check: bool = True, timeout: float = WAIT_S) -> subprocess.CompletedProcess:
        return blazar_cli(self.home, *args, check=check, timeout=timeout)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, whisper_base: Path, joe: tuple[Path, Path],
           gemma_path: Path) -> Iterator[Daemon]:
    home = tmp_path_factory.mktemp("audio-home")
    blazar_cli(home, "import", str(whisper_base), "--name", STT)
    blazar_cli(home, "import", str(joe[0]), "--name", TTS)
    blazar_cli(home, "import", str(gemma_path), "--name", CHAT)
    configure_all(home, {"max_audio_mib": MAX_AUDIO_MIB})
    port = free_port()
    log = home.parent / f"{home.name}-daemon.log"
    proc = start_serve(home, "--port", str(port), log=log)
    try:
        try:
            wait_for(lambda: healthy(port), "/health", proc=proc)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{log.read_text(errors='replace')[-8000:]}") from None
        d = Daemon(home, port, proc)
        for name, args in (("all", ()), ("speaker", ("--models", TTS)), ("metered", ("--daily-audio-s", "2")),
                           ("scribe", ("--models", STT))):
            d.secrets[name] = json.loads(d.cli("keys", "create", name, *args, "--json").stdout)["secret"]
        yield d
    finally:
        stop_daemon(proc)


@pytest.fixture(scope="module")
def spoken(daemon: Daemon) -> bytes:
    """SAID as WAV, made by piper through the gateway (the round trip's first half)."""
    return daemon.client().audio.speech.create(model=TTS, voice="joe", input=SAID, response_format="wav").content


def test_speech_then_transcription_round_trips_through_the_sdk(daemon: Daemon, spoken: bytes) -> None:
    assert 3.0 < decoded_seconds(spoken) < 15.0
    raw = daemon.client().audio.transcriptions.with_raw_response.create(
        model=STT, file=("said.wav", spoken, "audio/wav"))
    text = raw.parse().text
    assert word_errors(SAID, text) <= 0.1, text
    trace = raw.headers["x-blazar-trace-id"]
    steps = daemon.wait_trace(trace, "request.completed")
    types = [e["type"] for e in steps]
    assert types[:3] == ["request.received", "request.routed", "request.admitted"]
    heard = next(e["data"] for e in steps if e["type"] == "request.audio")
    assert float(raw.headers["x-audio-seconds"]) == pytest.approx(heard["audio_seconds"], abs=0.01)
    assert raw.headers["x-audio-language"] == "en"  # the language whisper detected, passed on from its child
    assert heard["kind"] == "whisper" and heard["route"] == "transcriptions" and heard["response_format"] == "json"
    assert abs(heard["audio_seconds"] - decoded_seconds(spoken)) < 0.5 and heard["real_time_factor"] > 0


@pytest.mark.parametrize("fmt", ["json", "text", "srt", "vtt", "verbose_json"])
def test_every_transcription_format(daemon: Daemon, spoken: bytes, fmt: str) -> None:
    out: Any = daemon.client().audio.transcriptions.create(
        model=STT, file=("said.wav", spoken, "audio/wav"), response_format=fmt)  # type: ignore[call-overload]
    if fmt == "json":
        text = out.text
    elif fmt == "verbose_json":
        text = out.text
        assert out.duration > 3.0 and out.segments and out.segments[0].end > out.segments[0].start
    else:
        assert isinstance(out, str)
        text = out
        if fmt == "srt":
            assert re.search(r"^1\r?\n\d\d:\d\d:\d\d,\d{3} --> \d\d:\d\d:\d\d,\d{3}", out, re.M), out
        if fmt == "vtt":
            assert out.startswith("WEBVTT") and re.search(r"\d\d:\d\d\.\d{3} --> ", out), out
        # What was said is the cues' text: not their numbers, timings or the header (against which the word error
        # rate of a whole subtitle file is over 1, and one misheard name failed it).
        text = " ".join(line for line in out.splitlines()
                        if line.strip() and "-->" not in line and not line.strip().isdigit() and line != "WEBVTT")
    assert "blazar" in text.lower() or word_errors(SAID, text) <= 0.2, text


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac", "wav", "pcm"])
def test_every_speech_format_decodes_back(daemon: Daemon, fmt: str) -> None:
    raw = daemon.client().audio.speech.with_raw_response.create(model=TTS, voice="joe", input="Good morning. "
                                                                "Blazar speaks.", response_format=fmt)  # type: ignore[arg-type]
    data = raw.content
    assert raw.headers["content-type"] == {"mp3": "audio/mpeg", "opus": "audio/opus", "aac": "audio/aac",
                                           "flac": "audio/flac", "wav": "audio/wav", "pcm": "audio/pcm"}[fmt]
    # pcm: raw 16-bit mono at the rate the header names
    seconds = len(data) / 2 / int(raw.headers["x-audio-sample-rate"]) if fmt == "pcm" else decoded_seconds(data)
    assert 0.8 < seconds < 6.0, (fmt, seconds)
    trace = raw.headers["x-blazar-trace-id"]
    made = next(e["data"] for e in daemon.wait_trace(trace, "request.completed") if e["type"] == "request.audio")
    assert made["kind"] == "piper" and made["response_format"] == fmt and made["input_chars"] == 28
    assert abs(made["audio_seconds"] - seconds) < 0.3


def test_speed_makes_speech_shorter(daemon: Daemon) -> None:
    def seconds(speed: float) -> float:
        return decoded_seconds(daemon.client().audio.speech.create(
            model=TTS, voice="joe", input=SAID, response_format="flac", speed=speed).content)

    assert seconds(2.0) < 0.7 * seconds(1.0)


def test_translation_answers_english(daemon: Daemon, spoken: bytes) -> None:
    out = daemon.client().audio.translations.create(model=STT, file=("said.wav", spoken, "audio/wav"))
    assert word_errors(SAID, out.text) <= 0.2, out.text


def test_stream_true_sends_deltas_then_the_whole_text(daemon: Daemon, spoken: bytes) -> None:
    stream = daemon.client().audio.transcriptions.create(model=STT, file=("said.wav", spoken, "audio/wav"),
                                                         stream=True)
    events = list(stream)
    deltas = [e.delta for e in events if e.type == "transcript.text.delta"]
    done = [e for e in events if e.type == "transcript.text.done"]
    assert deltas and len(done) == 1
    assert "".join(deltas).strip() == done[0].text.strip() and word_errors(SAID, done[0].text) <= 0.1


def test_voices_lists_the_piper_voice(daemon: Daemon) -> None:
    r = httpx2.get(f"{daemon.base}/v1/audio/voices", headers={"authorization": f"Bearer {daemon.secrets['all']}"},
                   trust_env=False, timeout=30)
    assert r.status_code == 200
    voices = {v["id"]: v for v in r.json()["data"]}
    assert set(voices) == {TTS} and voices[TTS]["sample_rate"] == 22050
    # A key sees the voices in its scope only, as /v1/models lists only its models.
    r = httpx2.get(f"{daemon.base}/v1/audio/voices", headers={"authorization": f"Bearer {daemon.secrets['scribe']}"},
                   trust_env=False, timeout=30)
    assert r.status_code == 200 and r.json()["data"] == []


def test_an_upload_that_is_not_audio_is_400(daemon: Daemon) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        daemon.client().audio.transcriptions.create(model=STT, file=("notes.wav", b"this is text, not sound" * 50,
                                                                     "audio/wav"))
    assert e.value.status_code == 400 and e.value.code == "not_audio"


def test_an_mp3_whose_header_understates_its_length_is_refused_at_max_audio_s(daemon: Daemon) -> None:
    # Two minutes of MP3 whose Info header claims 10 frames (a third of a second): the probe once believed the
    # header and whisper then transcribed all of it. The length is what decoding finds, and decoding stops at 60 s.
    lie = lying_mp3(120.0, claimed_frames=10)
    daemon.cli("config", "set", "inputs.max_audio_s", "60")
    try:
        with pytest.raises(openai.BadRequestError) as e:
            daemon.client().audio.transcriptions.create(model=STT, file=("short.mp3", lie, "audio/mpeg"))
    finally:
        daemon.cli("config", "set", "inputs.max_audio_s", "3600")
    assert e.value.status_code == 400 and e.value.code == "audio_too_long"
    assert e.value.body["type"] == "invalid_request_error"  # type: ignore[index]
    assert "longer than the limit of 60 s (inputs.max_audio_s)" in e.value.message
    refused = e.value.response.headers["x-blazar-trace-id"]
    # Refused once the key's checks passed, as the request's content was read: recorded, and the whisper child was
    # never asked (nothing routed).
    steps = daemon.wait_trace(refused, "request.rejected")
    assert [s["type"] for s in steps] == ["request.received", "request.rejected"]
    assert steps[-1]["data"]["reason"] == "invalid_request" and "max_audio_s" in steps[-1]["data"]["detail"]
    assert not list((daemon.home / "uploads").glob("*"))  # and the upload is gone


def test_an_upload_over_max_audio_mib_is_413(daemon: Daemon) -> None:
    big = b"RIFF" + os.urandom((MAX_AUDIO_MIB << 20) + 4096)
    with pytest.raises(openai.APIStatusError) as e:
        daemon.client().audio.transcriptions.create(model=STT, file=("big.wav", big, "audio/wav"))
    assert e.value.status_code == 413 and "max_audio_mib" in e.value.message
    assert not list((daemon.home / "uploads").glob("*"))  # nothing left behind


def test_a_key_scoped_to_another_model_is_403(daemon: Daemon, spoken: bytes) -> None:
    with pytest.raises(openai.PermissionDeniedError) as e:
        daemon.client("speaker").audio.transcriptions.create(model=STT, file=("said.wav", spoken, "audio/wav"))
    assert e.value.status_code == 403 and e.value.code == "model_not_allowed"
    # ... and its own model serves it; its audio seconds are its usage.
    daemon.client("speaker").audio.speech.create(model=TTS, voice="joe", input="Mine.", response_format="wav")
    row = wait_for(lambda: (r := json.loads(daemon.cli("keys", "show", "speaker", "--json").stdout))
                   ["audio_seconds_today"] > 0 and r, "the key's audio seconds")
    assert row["audio_seconds_today"] < 5.0


def test_a_keys_daily_audio_seconds_are_a_limit_of_their_own(daemon: Daemon) -> None:
    said = "Good morning. This sentence is long enough to make more than two seconds of speech."
    daemon.client("metered").audio.speech.create(model=TTS, voice="joe", input=said, response_format="wav")
    row = wait_for(lambda: (r := json.loads(daemon.cli("keys", "show", "metered", "--json").stdout))
                   ["audio_seconds_today"] > 0 and r, "the key's audio seconds")
    assert row["audio_seconds_today"] > 2 and row["daily_audio_s"] == 2 and row["tokens_today"] == 0
    with pytest.raises(openai.RateLimitError) as e:  # the limiter was charged before the log was
        daemon.client("metered").audio.speech.create(model=TTS, voice="joe", input="More.", response_format="wav")
    assert e.value.code == "rate_limit_exceeded" and "daily_audio_s" in e.value.message
    assert e.value.response.headers.get("retry-after")
    daemon.client("all").audio.speech.create(model=TTS, voice="joe", input="Mine.", response_format="wav")


def test_a_model_of_the_wrong_kind_is_400(daemon: Daemon, spoken: bytes) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        daemon.client().audio.speech.create(model=STT, voice="joe", input="Hello.")
    assert "whisper" in e.value.message and "/v1/audio/transcriptions" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        daemon.client().audio.transcriptions.create(model=CHAT, file=("said.wav", spoken, "audio/wav"))
    assert "llama-server" in e.value.message


def test_a_killed_whisper_child_mid_request_is_a_clean_error_and_the_next_request_recovers(
        daemon: Daemon, spoken: bytes) -> None:
    wav = _repeat_wav(spoken, REPEATS)  # seconds of work for the child: the kill lands while it has the request
    trace = "audio-kill-" + os.urandom(8).hex()
    result: dict[str, Any] = {}

    def ask() -> None:
        try:
            result["text"] = daemon.client().with_options(default_headers={"x-blazar-trace-id": trace}) \
                .audio.transcriptions.create(model=STT, file=("long.wav", wav, "audio/wav")).text
        except openai.APIStatusError as e:
            result["error"] = e

    t = threading.Thread(target=ask)
    t.start()
    wait_for(lambda: any(e["type"] == "request.admitted" for e in daemon.trace(trace)), "the request admitted",
             timeout=WAIT_S)
    instance = next(e for e in daemon.trace(trace) if e["type"] == "request.routed")["data"]["instance_id"]
    pid = next(e["data"]["pid"] for e in daemon.events("instance.started") if e["data"]["instance_id"] == instance)
    time.sleep(0.5)
    os.kill(pid, signal.SIGKILL)
    t.join(WAIT_S)
    assert not t.is_alive()
    if "error" in result:  # the answer broke: an error in OpenAI's shape, never a hang or a half answer
        err = result["error"]
        assert err.status_code in (502, 503) and err.body and isinstance(err.message, str)
    else:  # the child's connection broke before any answer: the request was routed again, to a new child
        assert word_errors(" ".join([SAID] * REPEATS), result["text"]) <= 0.1
        assert "request.rerouted" in [e["type"] for e in daemon.wait_trace(trace, "request.completed")]
    exited = wait_for(lambda: next((e["data"] for e in daemon.events("instance.exited")
                                    if e["data"]["instance_id"] == instance), None), "the killed child's exit")
    assert exited["reason"] == "crashed"
    again = daemon.client().audio.transcriptions.create(model=STT, file=("said.wav", spoken, "audio/wav"))
    assert word_errors(SAID, again.text) <= 0.1


def _repeat_wav(wav: bytes, times: int) -> bytes:
    import wave

    with wave.open(io.BytesIO(wav)) as w:  # a streamed WAV: its header's lengths are unknown (0xFFFFFFFF)
        channels, width, rate = w.getnchannels(), w.getsampwidth(), w.getframerate()
        frames = w.readframes(w.getnframes())
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(frames * times)
    return out.getvalue()


def test_blazar_speak_and_transcribe_through_the_daemon(daemon: Daemon, tmp_path: Path) -> None:
    out = tmp_path / "said.flac"
    daemon.cli("speak", SAID, "--out", str(out))
    assert 3.0 < decoded_seconds(out.read_bytes()) < 15.0
    text = daemon.cli("transcribe", str(out), "--model", STT, "--language", "en").stdout
    assert word_errors(SAID, text) <= 0.1, text
    srt = daemon.cli("transcribe", str(out), "--format", "srt").stdout
    assert " --> " in srt
    bad = daemon.cli("speak", "Hello.", "--model", STT, "--out", str(tmp_path / "x.wav"), check=False)
    assert bad.returncode != 0 and "whisper" in bad.stderr and not (tmp_path / "x.wav").exists()


def test_why_explains_an_audio_request(daemon: Daemon, spoken: bytes) -> None:
    raw = daemon.client().audio.transcriptions.with_raw_response.create(model=STT,
                                                                          file=("said.wav", spoken, "audio/wav"))
    trace = raw.headers["x-blazar-trace-id"]
    daemon.wait_trace(trace, "request.completed")
    text = daemon.cli("why", trace).stdout
    assert "whisper transcribed" in text and "real-time factor" in text and STT in text, text
    figures = json.loads(daemon.cli("why", trace, "--json").stdout)["figures"]
    assert figures["audio_seconds"] > 3.0 and figures["real_time_factor"] > 0


def test_metrics_count_audio_seconds_and_the_real_time_factor(daemon: Daemon) -> None:
    admin = (daemon.home / "run" / "admin.token").read_text().strip()
    text = httpx2.get(f"{daemon.base}/metrics", headers={"authorization": f"Bearer {admin}"}, trust_env=False,
                      timeout=30).text
    assert re.search(rf'blazar_audio_seconds_total{{model="{STT}",route="transcriptions"}} [1-9]', text)
    assert re.search(rf'blazar_audio_seconds_total{{model="{TTS}",route="speech"}} [1-9]', text)
    assert f'blazar_audio_real_time_factor_count{{model="{STT}"}}' in text
    assert 'blazar_route_requests_total{route="/v1/audio/speech"}' in text


def test_sessions_and_sse_speech_are_refused_in_openai_s_shape(daemon: Daemon, spoken: bytes) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        daemon.client().with_options(default_headers={"x-blazar-session": "chat-1"}).audio.transcriptions.create(
            model=STT, file=("said.wav", spoken, "audio/wav"))
    assert "sessions" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        daemon.client().audio.speech.create(model=TTS, voice="joe", input="Hi.", stream_format="sse")
    assert e.value.status_code == 400 and "stream_format" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        daemon.client().audio.speech.create(model=TTS, voice="joe", input="Hi.", speed=5.0)
    assert "speed" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:  # piper would answer 500 to text with nothing to say
        daemon.client().audio.speech.create(model=TTS, voice="joe", input="... —")
    assert "nothing to say" in e.value.message


def test_a_multi_speaker_voice_refuses_a_name_it_lacks_and_names_its_speakers(
        daemon: Daemon, joe: tuple[Path, Path], tmp_path: Path) -> None:
    # joe's voice with a config that says two speakers: the route checks the name before piper sees it.
    onnx = tmp_path / "duo.onnx"
    onnx.symlink_to(joe[0])
    config = json.loads(joe[1].read_text())
    (tmp_path / "duo.onnx.json").write_text(json.dumps({**config, "num_speakers": 2,
                                                        "speaker_id_map": {"ann": 0, "bob": 1}}))
    blazar_cli(daemon.home, "import", str(onnx), "--name", "duo")
    # The CLI tells the running daemon: the very next request sees the model (no poll interval to wait out).
    assert "duo" in {m.id for m in daemon.client().models.list()}
    with pytest.raises(openai.BadRequestError) as e:
        daemon.client().audio.speech.create(model="duo", voice="alloy", input="Hello.")
    assert "'alloy' is not a speaker of 'duo'" in e.value.message and "ann, bob" in e.value.message
    assert not [x for x in daemon.events("instance.starting") if x["data"]["model"] == "duo"]  # refused, not loaded
    r = httpx2.get(f"{daemon.base}/v1/audio/voices", headers={"authorization": f"Bearer {daemon.secrets['all']}"},
                   trust_env=False, timeout=30)
    assert {v["id"]: v["speakers"] for v in r.json()["data"]}["duo"] == ["ann", "bob"]
    gone = blazar_cli(daemon.home, "rm", "duo", check=False)
    assert gone.returncode == 0, gone.stderr
    assert "duo" not in {m.id for m in daemon.client().models.list()}
