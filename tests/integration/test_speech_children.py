"""The speech children on the real models, straight (no gateway): Blazar's whisper child on Systran's
faster-whisper-base, spoken to by the official openai SDK, and piper's own server on the joe voice, spoken to by
blazar/adapters/audio.py's client. Each clip is made at test time by piper, so the round trip needs no recording:
"Hello from Blazar, this is a test" comes back with at most one word in ten wrong."""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import Iterator
from pathlib import Path

import av
import httpx
import openai
import pytest

from blazar.adapters.audio import PiperClient, SpeechEncoder, Synthesized, probe, speak
from blazar.adapters.engines.kinds import MAX_AUDIO_FIELD
from tests.support.hostile_media import lying_mp3
from tests.support.speech_children import Child, piper_child, whisper_child, word_errors

pytest.importorskip("faster_whisper", reason="the stt extra (faster-whisper) is not installed")
pytest.importorskip("piper", reason="the tts extra (piper-tts) is not installed")

SENTENCE = "Hello from Blazar, this is a test"
MAX_BYTES = 2_000_000
TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def whisper(whisper_base: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Child]:
    with whisper_child(whisper_base, tmp_path_factory.mktemp("whisper"), max_bytes=MAX_BYTES) as child:
        yield child


@pytest.fixture(scope="module")
def piper(joe: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Child]:
    with piper_child(joe[0], tmp_path_factory.mktemp("piper")) as child:
        yield child


def synthesize(piper: Child, text: str, **kw: float) -> Synthesized:
    async def go() -> Synthesized:
        client = PiperClient(piper.base_url)
        try:
            return await client.synthesize(text, **kw)  # type: ignore[arg-type]
        finally:
            await client.aclose()

    return asyncio.run(go())


@pytest.fixture(scope="module")
def hello_wav(piper: Child) -> bytes:
    said = synthesize(piper, SENTENCE)
    enc = SpeechEncoder("wav", said.sample_rate)
    return enc.feed(said.pcm) + enc.finish()


@pytest.fixture
def sdk(whisper: Child) -> openai.OpenAI:
    return openai.OpenAI(base_url=whisper.base_url + "/v1", api_key=whisper.key, timeout=TIMEOUT_S, max_retries=0)


def test_round_trip_piper_to_whisper_at_most_one_word_in_ten_wrong(sdk: openai.OpenAI, hello_wav: bytes) -> None:
    out = sdk.audio.transcriptions.create(model="whisper-1", file=("hello.wav", hello_wav))
    wrong, total = word_errors(SENTENCE, out.text)
    assert wrong * 10 <= total + 9, (out.text, wrong)  # one in ten, a partial ten counting as ten
    assert out.usage is not None and out.usage.type == "duration"
    assert out.usage.seconds == pytest.approx(probe(hello_wav).duration_s, abs=0.05)


def test_every_answer_carries_the_audio_seconds(sdk: openai.OpenAI, hello_wav: bytes) -> None:
    raw = sdk.audio.transcriptions.with_raw_response.create(model="whisper-1", file=("hello.wav", hello_wav),
                                                            response_format="text")
    assert float(raw.headers["x-audio-seconds"]) == pytest.approx(probe(hello_wav).duration_s, abs=0.05)
    assert word_errors(SENTENCE, raw.parse())[0] <= 1


def test_text_srt_and_vtt(sdk: openai.OpenAI, hello_wav: bytes) -> None:
    text = sdk.audio.transcriptions.create(model="whisper-1", file=("a.wav", hello_wav), response_format="text")
    assert isinstance(text, str) and word_errors(SENTENCE, text)[0] <= 1
    srt = sdk.audio.transcriptions.create(model="whisper-1", file=("a.wav", hello_wav), response_format="srt")
    lines = srt.strip().splitlines()
    assert lines[0] == "1" and lines[1].startswith("00:00:0") and " --> 00:00:0" in lines[1], srt
    vtt = sdk.audio.transcriptions.create(model="whisper-1", file=("a.wav", hello_wav), response_format="vtt")
    assert vtt.startswith("WEBVTT\n\n00:00:0") and "-->" in vtt


def test_verbose_json_with_segments_and_words(sdk: openai.OpenAI, hello_wav: bytes) -> None:
    out = sdk.audio.transcriptions.create(model="whisper-1", file=("a.wav", hello_wav),
                                          response_format="verbose_json",
                                          timestamp_granularities=["word", "segment"])
    duration = probe(hello_wav).duration_s
    assert (out.language, out.duration) == ("english", pytest.approx(duration, abs=0.05))
    assert out.segments and out.segments[0].id == 0 and out.segments[-1].end <= duration + 0.1
    assert out.words and len(out.words) >= 6
    assert [w.start for w in out.words] == sorted(w.start for w in out.words)
    assert word_errors(SENTENCE, " ".join(w.word for w in out.words))[0] <= 1


def test_stream_gives_deltas_then_the_whole_text(sdk: openai.OpenAI, hello_wav: bytes) -> None:
    events = list(sdk.audio.transcriptions.create(model="whisper-1", file=("a.wav", hello_wav), stream=True))
    kinds = [e.type for e in events]
    assert kinds[-1] == "transcript.text.done" and set(kinds[:-1]) == {"transcript.text.delta"}
    deltas = "".join(e.delta for e in events[:-1])  # type: ignore[union-attr]
    assert deltas.strip() == events[-1].text  # type: ignore[union-attr]
    assert word_errors(SENTENCE, deltas)[0] <= 1


def test_language_prompt_and_temperature_are_taken(sdk: openai.OpenAI, hello_wav: bytes) -> None:
    out = sdk.audio.transcriptions.create(model="whisper-1", file=("a.wav", hello_wav), language="en",
                                          prompt="Blazar is a control plane.", temperature=0.2,
                                          response_format="verbose_json")
    assert out.language == "english" and word_errors(SENTENCE, out.text)[0] <= 1
    with pytest.raises(openai.BadRequestError) as e:
        sdk.audio.transcriptions.create(model="whisper-1", file=("a.wav", hello_wav), language="klingon")
    assert e.value.body["param"] == "language"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError):
        sdk.audio.transcriptions.create(model="whisper-1", file=("a.wav", hello_wav), temperature=3)


def test_translation_of_english_speech_is_english_text(sdk: openai.OpenAI, hello_wav: bytes) -> None:
    out = sdk.audio.translations.create(model="whisper-1", file=("a.wav", hello_wav))
    assert word_errors(SENTENCE, out.text)[0] <= 1
    verbose = sdk.audio.translations.create(model="whisper-1", file=("a.wav", hello_wav),
                                            response_format="verbose_json")
    assert verbose.language == "english" and verbose.segments


def test_a_wrong_key_is_401_in_openais_shape(whisper: Child, hello_wav: bytes) -> None:
    wrong = openai.OpenAI(base_url=whisper.base_url + "/v1", api_key="not-the-key", max_retries=0, timeout=30)
    with pytest.raises(openai.AuthenticationError) as e:
        wrong.audio.transcriptions.create(model="whisper-1", file=("a.wav", hello_wav))
    assert e.value.body["code"] == "invalid_api_key"  # type: ignore[index]
    bare = httpx.post(whisper.base_url + "/v1/audio/transcriptions", files={"file": ("a.wav", hello_wav)},
                      timeout=30, trust_env=False)
    assert bare.status_code == 401 and bare.headers["x-audio-seconds"] == "0.000"


def test_not_audio_is_400_and_an_oversized_body_413(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        sdk.audio.transcriptions.create(model="whisper-1", file=("notes.mp3", b"these are not sounds " * 100))
    assert (e.value.body["param"], e.value.body["code"]) == ("file", "invalid_audio")  # type: ignore[index]
    assert e.value.body["type"] == "invalid_request_error"  # type: ignore[index]
    with pytest.raises(openai.APIStatusError) as big:
        sdk.audio.transcriptions.create(model="whisper-1", file=("big.wav", b"\0" * (MAX_BYTES + 1)))
    assert big.value.status_code == 413


def test_the_child_stops_decoding_at_the_bound_the_gateway_names(sdk: openai.OpenAI) -> None:
    # Two minutes of MP3 whose header claims a third of a second: the child measures it by decoding, and stops at
    # the bound in the form (the gateway sends its max_audio_s with every request), so it transcribes none of it.
    lie = lying_mp3(120.0, claimed_frames=10)
    with pytest.raises(openai.BadRequestError) as e:
        sdk.audio.transcriptions.create(model="whisper-1", file=("short.mp3", lie),
                                        extra_body={MAX_AUDIO_FIELD: "10"})
    assert (e.value.body["code"], e.value.body["param"]) == ("audio_too_long", "file")  # type: ignore[index]
    assert "longer than the limit of 10 s (inputs.max_audio_s)" in e.value.message
    # Within the bound the same file is as long as its frames, whatever its header says.
    short = lying_mp3(4.0, claimed_frames=10)
    raw = sdk.audio.transcriptions.with_raw_response.create(model="whisper-1", file=("short.mp3", short),
                                                            extra_body={MAX_AUDIO_FIELD: "10"})
    assert float(raw.headers["x-audio-seconds"]) == pytest.approx(4.0, abs=0.1)


def test_mp3_and_opus_uploads_decode_like_wav(sdk: openai.OpenAI, piper: Child) -> None:
    said = synthesize(piper, SENTENCE)
    for fmt in ("mp3", "opus"):
        enc = SpeechEncoder(fmt, said.sample_rate)
        clip = enc.feed(said.pcm) + enc.finish()
        out = sdk.audio.transcriptions.create(model="whisper-1", file=(f"a.{fmt}", clip))
        assert word_errors(SENTENCE, out.text)[0] <= 1, (fmt, out.text)


def test_health_is_503_until_loaded(whisper_base: Path, tmp_path: Path) -> None:
    with whisper_child(whisper_base, tmp_path, wait=False) as child:
        seen: list[int] = []
        deadline = time.monotonic() + TIMEOUT_S
        while (not seen or seen[-1] != 200) and time.monotonic() < deadline:
            try:
                seen.append(httpx.get(child.base_url + "/health", timeout=5, trust_env=False).status_code)
            except httpx.TransportError:
                time.sleep(0.02)
        assert seen[0] == 503 and seen[-1] == 200 and set(seen) == {503, 200}, seen


def test_a_model_that_cannot_load_ends_the_child_saying_why(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    with whisper_child(tmp_path / "model", tmp_path / "w", wait=False) as child:
        code = child.proc.wait(timeout=TIMEOUT_S)
        assert code == 1 and "cannot load" in child.log_tail()


def test_piper_speaks_through_the_client_and_speed_shortens_it(piper: Child) -> None:
    normal, fast = synthesize(piper, SENTENCE), synthesize(piper, SENTENCE, length_scale=0.5)
    assert normal.sample_rate == 22_050 and normal.channels == 1
    assert 1.0 < normal.duration_s < 5.0
    assert fast.duration_s < normal.duration_s * 0.7

    async def info() -> dict[str, object]:
        client = PiperClient(piper.base_url)
        try:
            assert await client.ready()
            return await client.info()
        finally:
            await client.aclose()

    assert asyncio.run(info())["voice"]["name"] == "en_US-joe-medium"  # type: ignore[index]


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac", "wav"])
def test_speak_streams_each_format_sentence_by_sentence(piper: Child, fmt: str) -> None:
    text = "The first sentence is short. The second one is a little longer than the first."

    async def collect() -> list[bytes]:
        client = PiperClient(piper.base_url)
        try:
            return [chunk async for chunk in speak(client, text, fmt)]
        finally:
            await client.aclose()

    chunks = asyncio.run(collect())
    assert len(chunks) >= 2  # the first sentence is out before the second is made
    with av.open(io.BytesIO(b"".join(chunks))) as c:
        stream = c.streams.audio[0]
        seconds = sum(f.samples for f in c.decode(stream)) / stream.sample_rate
    assert 2.0 < seconds < 12.0
