"""Realtime voice sessions end to end against `blazar serve` with the three real children (Gemma 3 270M, Blazar's
whisper child on faster-whisper-base, piper's joe voice), through the official `openai` SDK's realtime client and the
console's page in headless Chromium: one daemon for the module (tests/support/voice_daemon.py), so its children start
once; each part of issue 42 in its own section below."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import re
import shutil
import subprocess
import sys
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from websockets.exceptions import ConnectionClosed

from tests.support import realtime_client
from tests.support import voice_daemon as voice
from tests.support.bounds import HANG_S
from tests.support.daemon import wait_for
from tests.support.voice_daemon import CHAT, PROFILE, STT, TTS, WAIT_S, VoiceDaemon

REPO = Path(__file__).resolve().parents[2]
voice_daemon = voice.voice_daemon  # the module's daemon: its three children start once for every section


async def until(conn: Any, last: str) -> list[Any]:
    """The server's events up to the first of type `last`, within WAIT_S: the children's cold starts and their work
    on two shared cores."""
    return await realtime_client.until(conn, last, WAIT_S, limit=100_000)  # audio deltas are many


async def answering_at_length(conn: Any) -> list[Any]:
    """A long spoken answer asked for (LONG, up to 400 tokens), read up to its first audio: it runs on."""
    await conn.conversation.item.create(item=LONG)  # type: ignore[arg-type]
    await until(conn, "conversation.item.done")
    await conn.response.create(response={"max_output_tokens": 400, "temperature": 0})
    return await until(conn, "response.output_audio.delta")


# -- V2: spoken answers (audio out), cancel, a dropped connection ------------------------------------------------------

QUESTION = {"type": "message", "role": "user", "content": [
    {"type": "input_text", "text": "Tell me about the sea. The sea is"}]}
LONG = {"type": "message", "role": "user", "content": [
    {"type": "input_text", "text": "Count from 1 to 500 in words: one, two, three, four, five, six, seven,"}]}


def _words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z']+", text.lower()) if len(w) > 2}


def _wav(pcm: bytes, rate: int = 24_000) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm)
    return buf.getvalue()


def _realtime(d: VoiceDaemon, model: str) -> list[str]:
    """The traces of the internal requests of realtime sessions made for `model`, oldest first."""
    return [e["trace_id"] for e in d.events("request.received")
            if e["data"]["route"] == "/v1/realtime" and e["data"]["model"] == model]


def _ended(d: VoiceDaemon, trace: str) -> dict[str, Any]:
    """The one terminal event of `trace` (waited for): the request ended, its slot given back with it."""
    ends = ("request.completed", "request.failed")
    wait_for(lambda: any(e["trace_id"] == trace for e in d.events(*ends)), f"the end of {trace}", timeout=HANG_S)
    ended = [e for e in d.events(*ends) if e["trace_id"] == trace]
    assert len(ended) == 1, ended
    return ended[0]


def _none_in_flight(d: VoiceDaemon) -> None:
    """No child has a request in flight (`blazar ps`): nothing of the session was left running."""
    wait_for(lambda: all(i["in_flight"] == 0 for i in json.loads(d.cli("ps", "--json").stdout)["instances"]),
             "no request in flight", timeout=HANG_S)


def _audio_s(d: VoiceDaemon, trace: str) -> float:
    audio = [e for e in d.events("request.audio") if e["trace_id"] == trace]
    assert len(audio) == 1, audio
    return float(audio[0]["data"]["audio_seconds"])


async def test_a_spoken_answer_is_audio_whisper_hears_as_its_transcript(voice_daemon: VoiceDaemon) -> None:
    d = voice_daemon
    async with d.aclient().realtime.connect(model=voice.CHAT) as conn:
        created = await conn.recv()
        assert created.session.output_modalities == ["audio"]  # a session with a voice speaks by default
        await conn.session.update(session={"type": "realtime", "max_output_tokens": 30, "temperature": 0, "audio": {
            "output": {"voice": "alloy", "format": {"type": "audio/pcm", "rate": 24000}}}})
        assert (await conn.recv()).type == "session.updated"
        await conn.conversation.item.create(item=QUESTION)  # type: ignore[arg-type]
        await until(conn, "conversation.item.done")
        await conn.response.create()
        events = await until(conn, "response.done")
    types = [e.type for e in events]
    assert "response.output_text.delta" not in types
    assert types[-6:] == ["response.output_audio.done", "response.output_audio_transcript.done",
                          "response.content_part.done", "response.output_item.done", "conversation.item.done",
                          "response.done"]
    transcript = "".join(e.delta for e in events if e.type == "response.output_audio_transcript.delta")
    done = events[-1].response
    assert done.status == "completed" and done.output[0].content[0].transcript == transcript
    assert done.usage.output_tokens <= 30 and _words(transcript), transcript
    pcm = b"".join(base64.b64decode(e.delta) for e in events if e.type == "response.output_audio.delta")
    assert len(pcm) > 24_000  # over half a second of speech
    heard = await asyncio.to_thread(lambda: d.client().audio.transcriptions.create(
        model=voice.STT, file=("answer.wav", _wav(pcm), "audio/wav")).text)
    shared = _words(heard) & _words(transcript)
    assert len(shared) >= min(2, len(_words(transcript))), (heard, transcript)
    await asyncio.to_thread(_spoken_once, d, len(pcm) / 48_000)


def _spoken_once(d: VoiceDaemon, seconds: float) -> None:
    """One speech request for the response, through the pipeline: completed, its audio recorded and charged."""
    speech = _realtime(d, voice.TTS)[-1]
    assert _ended(d, speech)["type"] == "request.completed"
    assert abs(_audio_s(d, speech) - seconds) < 0.1


async def test_response_cancel_mid_audio_ends_both_requests_and_keeps_what_was_sent(
        voice_daemon: VoiceDaemon) -> None:
    d = voice_daemon
    async with d.aclient().realtime.connect(model=voice.CHAT) as conn:
        await conn.recv()
        before = await answering_at_length(conn)
        await conn.response.cancel()
        events = before + await until(conn, "response.done")
        done = events[-1].response
        assert done.status == "cancelled" and done.status_details.reason == "client_cancelled"
        sent = "".join(e.delta for e in events if e.type == "response.output_audio_transcript.delta")
        item = done.output[0]
        assert item.status == "incomplete" and item.content[0].transcript == sent and sent
        # The session goes on: the next response is answered (its chat sees the answer as it was cut).
        await conn.response.create(response={"output_modalities": ["text"], "max_output_tokens": 4})
        assert (await until(conn, "response.done"))[-1].response.status == "completed"
    await asyncio.to_thread(_cut_short, d, -2)


def _cut_short(d: VoiceDaemon, chat_index: int) -> None:
    """The cancelled response's chat and speech requests both ended (no request left in flight), the speech one
    early (499) with the audio it made recorded and charged."""
    chat, speech = _realtime(d, voice.CHAT)[chat_index], _realtime(d, voice.TTS)[-1]
    assert (_ended(d, chat)["data"].get("completion_tokens") or 0) < 400
    failed = _ended(d, speech)
    assert failed["type"] == "request.failed" and failed["data"]["status"] == 499, failed
    assert _audio_s(d, speech) > 0


async def test_a_client_gone_mid_answer_leaves_no_request_running_and_the_speech_charged(
        voice_daemon: VoiceDaemon) -> None:
    d = voice_daemon
    async with d.aclient().realtime.connect(model=voice.CHAT) as conn:
        await conn.recv()
        await answering_at_length(conn)
    # The socket closed mid-answer: the chat and the speech request end, and what was spoken is on the key's day.
    await asyncio.to_thread(_cut_short, d, -1)
    await asyncio.to_thread(_none_in_flight, d)


async def test_a_key_without_the_voice_in_its_scope_gets_a_text_session_and_audio_refused_by_name(
        voice_daemon: VoiceDaemon) -> None:
    async with voice_daemon.aclient("chat-only").realtime.connect(model=voice.CHAT) as conn:
        created = await conn.recv()
        assert created.session.output_modalities == ["text"]
        await conn.session.update(session={"type": "realtime", "output_modalities": ["audio"]})
        refused = (await conn.recv()).error
        assert refused.code == "model_not_allowed" and voice.TTS in refused.message, refused


# --- V1: hearing (audio in: the buffer, server VAD, transcription, the turn's response) -----------------------------

HEARD_QUESTION = "What is the capital of France?"
CHUNK = 4800  # bytes of PCM16 at 24 kHz: 100 ms, as a microphone sends


def spoken(d: VoiceDaemon, text: str) -> bytes:
    """`text` spoken by joe through the daemon as PCM16 24 kHz mono (the session's default input format)."""
    return d.client().audio.speech.create(model="joe", voice="joe", input=text, response_format="pcm").read()


def words(text: str) -> set[str]:
    return set(re.findall(r"[a-z]+", text.lower()))


@pytest.fixture(scope="module")
def heard_question(voice_daemon: VoiceDaemon) -> bytes:
    """The question spoken, then a second of silence (server VAD ends the turn in audio time, not wall time)."""
    return spoken(voice_daemon, HEARD_QUESTION) + bytes(48_000)


async def append(conn: Any, audio: bytes) -> None:
    for i in range(0, len(audio), CHUNK):
        await conn.input_audio_buffer.append(audio=base64.b64encode(audio[i:i + CHUNK]).decode())


async def test_a_spoken_question_is_detected_committed_transcribed_and_answered(
        voice_daemon: VoiceDaemon, heard_question: bytes) -> None:
    async with voice_daemon.aclient().realtime.connect(model=PROFILE) as conn:
        created = await conn.recv()
        assert created.type == "session.created" and created.session.model == PROFILE
        assert created.session.audio.input.transcription.model == voice.STT
        await conn.session.update(session={"type": "realtime", "output_modalities": ["text"],
                                           "max_output_tokens": 16, "instructions": "Answer in a few words."})
        assert (await conn.recv()).type == "session.updated"
        await append(conn, heard_question)
        events = await until(conn, "response.done")
    types = [e.type for e in events]
    order = ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
             "input_audio_buffer.committed", "conversation.item.added",
             "conversation.item.input_audio_transcription.completed", "response.created", "response.done"]
    firsts = [types.index(t) if t in types else -1 for t in order]
    assert -1 not in firsts and firsts == sorted(firsts), types
    started, stopped, committed, added, heard = (next(e for e in events if e.type == t) for t in order[:5])
    assert started.item_id == stopped.item_id == committed.item_id == added.item.id == heard.item_id
    assert 0 <= started.audio_start_ms < stopped.audio_end_ms <= len(heard_question) // 48
    assert added.item.role == "user" and added.item.content[0].type == "input_audio"
    assert len(words(heard.transcript) & words(HEARD_QUESTION)) >= 3, heard.transcript
    done = events[-1].response
    assert done.status == "completed" and done.output[0].content[0].text, [e for e in events if e.type == "error"]
    assert 0 < done.usage.output_tokens <= 16
    received = await asyncio.to_thread(voice_daemon.events, "request.received")
    routes = {e["data"]["model"]: e["data"]["route"] for e in received if e["data"]["route"] == "/v1/realtime"}
    assert routes.keys() >= {voice.STT, voice.CHAT}  # the transcription and the chat, each a request of its own


async def test_a_key_without_scope_for_the_profiles_speech_models_is_refused_at_connect(
        voice_daemon: VoiceDaemon) -> None:
    async with voice_daemon.aclient("chat-only").realtime.connect(model=PROFILE) as conn:
        refused = await conn.recv()
        assert refused.type == "error" and refused.error.code == "model_not_allowed", refused
        with pytest.raises(ConnectionClosed) as closed:
            await conn.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008


async def test_a_keys_daily_audio_seconds_bound_what_a_session_hears(voice_daemon: VoiceDaemon,
                                                                     heard_question: bytes) -> None:
    """A key with one second of audio a day: its first turn (about two seconds) is heard and charged; the next is
    refused by the limit, told as an `error` and the item's `transcription.failed`, and the session goes on."""
    d = voice_daemon
    secret = d.key("sparing", "--daily-audio-s", "1")
    client = openai.AsyncOpenAI(base_url=f"{d.base}/v1", api_key=secret, max_retries=0, timeout=WAIT_S)
    async with client.realtime.connect(model=PROFILE) as conn:
        await conn.recv()
        await conn.session.update(session={"type": "realtime", "output_modalities": ["text"],
                                           "max_output_tokens": 4})
        assert (await conn.recv()).type == "session.updated"
        await append(conn, heard_question)
        first = await until(conn, "response.done")
        assert any(e.type == "conversation.item.input_audio_transcription.completed" for e in first)
        await append(conn, heard_question)
        second = await until(conn, "conversation.item.input_audio_transcription.failed")
    refused = next(e for e in second if e.type == "error").error
    assert refused.code == "rate_limit_exceeded" and "daily_audio_s" in refused.message, refused
    assert second[-1].error.code == "rate_limit_exceeded"


async def test_the_chat_model_alone_on_a_chat_only_key_is_a_text_session_that_names_what_it_lacks(
        voice_daemon: VoiceDaemon) -> None:
    async with voice_daemon.aclient("chat-only").realtime.connect(model=voice.CHAT) as conn:
        assert (await conn.recv()).session.audio.input.transcription is None
        await conn.input_audio_buffer.append(audio=base64.b64encode(bytes(4800)).decode())
        refused = await conn.recv()
    assert refused.type == "error" and refused.error.code == "model_not_allowed"
    assert voice.STT in refused.error.message


async def test_a_manual_turn_is_committed_by_the_client_and_answered_on_response_create(
        voice_daemon: VoiceDaemon, heard_question: bytes) -> None:
    async with voice_daemon.aclient().realtime.connect(model=PROFILE) as conn:
        await conn.recv()
        await conn.session.update(session={"type": "realtime", "output_modalities": ["text"],
                                           "max_output_tokens": 16,
                                           "audio": {"input": {"turn_detection": None}}})
        updated = await conn.recv()
        assert updated.type == "session.updated" and updated.session.audio.input.turn_detection is None
        await conn.input_audio_buffer.commit()
        assert (await conn.recv()).error.code == "input_audio_buffer_commit_empty"
        await append(conn, heard_question)
        await conn.input_audio_buffer.commit()
        await conn.response.create()  # at once: the response waits for the transcript
        events = await until(conn, "response.done")
    types = [e.type for e in events]
    assert "input_audio_buffer.speech_started" not in types
    assert types.index("input_audio_buffer.committed") < types.index("response.created")
    heard = next(e for e in events if e.type == "conversation.item.input_audio_transcription.completed")
    assert len(words(heard.transcript) & words(HEARD_QUESTION)) >= 3, heard.transcript
    assert types.index("conversation.item.input_audio_transcription.completed") < types.index(
        "response.output_item.added")
    assert events[-1].response.status == "completed"


# --- The whole turn: a question spoken into the session comes back spoken; the user's voice interrupts an answer ----


async def test_a_spoken_question_is_answered_in_speech_whisper_hears_and_the_turn_is_one_trace(
        voice_daemon: VoiceDaemon, heard_question: bytes) -> None:
    """Piper's question into a session on the profile, with its defaults (server VAD, spoken answers): the answer's
    audio, transcribed by whisper, has the words of its transcript; the turn is one `realtime.turn` naming its three
    internal requests with the timings of each part, and `blazar why TURN` tells them."""
    d = voice_daemon
    async with d.aclient().realtime.connect(model=PROFILE) as conn:
        created = await conn.recv()
        assert created.session.output_modalities == ["audio"]
        await conn.session.update(session={"type": "realtime", "max_output_tokens": 24, "temperature": 0})
        assert (await conn.recv()).type == "session.updated"
        await append(conn, heard_question)
        events = await until(conn, "response.done")
    types = [e.type for e in events]
    assert types.index("conversation.item.input_audio_transcription.completed") < types.index(
        "response.output_audio.delta")
    done = events[-1].response
    assert done.status == "completed", [e for e in events if e.type == "error"]
    transcript = done.output[0].content[0].transcript
    pcm = b"".join(base64.b64decode(e.delta) for e in events if e.type == "response.output_audio.delta")
    assert transcript and len(pcm) > 24_000
    heard = await asyncio.to_thread(lambda: d.client().audio.transcriptions.create(
        model=voice.STT, file=("answer.wav", _wav(pcm), "audio/wav")).text)
    assert len(_words(heard) & _words(transcript)) >= min(2, len(_words(transcript))), (heard, transcript)
    turn = await asyncio.to_thread(_turn_of, d, created.session.id)
    data = turn["data"]
    assert data["status"] == "completed" and (data["model"], data["stt"], data["tts"]) == (PROFILE, voice.STT,
                                                                                          voice.TTS)
    assert data["vad"]["speech_stopped_ms"] > data["vad"]["speech_started_ms"] >= 0
    for part in ("transcription", "chat", "speech"):
        assert data[part]["trace_id"], part
    assert data["speech"]["first_ms"] > 0 and data["speech"]["audio_seconds"] > 0.5
    told = json.loads((await asyncio.to_thread(d.cli, "why", turn["trace_id"], "--json")).stdout)
    assert "first audio" in told["verdict"] and "transcription" in told["verdict"], told["verdict"]


def _turn_of(d: VoiceDaemon, session_id: str) -> dict[str, Any]:
    """The session's one `realtime.turn` (request events are group-committed: waited for)."""
    def found() -> list[dict[str, Any]]:
        return [e for e in d.events("realtime.turn") if e["data"]["session_id"] == session_id]
    turns = wait_for(found, f"the realtime.turn of {session_id}", timeout=HANG_S)
    assert len(turns) == 1, turns
    return turns[0]


async def test_the_user_speaking_over_an_answer_interrupts_it_and_the_answer_is_cut_to_what_was_sent(
        voice_daemon: VoiceDaemon, heard_question: bytes) -> None:
    d = voice_daemon
    async with d.aclient().realtime.connect(model=PROFILE) as conn:
        await conn.recv()
        before = await answering_at_length(conn)
        await append(conn, heard_question)  # the user speaks: server VAD hears it start
        events = before + await until(conn, "conversation.item.truncated")
    types = [e.type for e in events]
    assert types.index("input_audio_buffer.speech_started") < types.index("response.done")
    done = next(e for e in events if e.type == "response.done").response
    assert done.status == "cancelled" and done.status_details.reason == "turn_detected"
    sent = b"".join(base64.b64decode(e.delta) for e in events if e.type == "response.output_audio.delta")
    cut = events[-1]
    # What was sent, to one delta (500 ms): a delta being sent as the cancel lands may or may not have gone out.
    assert cut.item_id == done.output[0].id and cut.audio_end_ms > 0 and abs(cut.audio_end_ms - len(sent) / 48) <= 500
    await asyncio.to_thread(_cut_short, d, -1)


# ---- C: the console's Talk view in headless Chromium ---------------------------------------------------------------
# The page on the daemon's console, an admin key entered as a user does, Chromium's fake microphone playing a question
# spoken by piper (then silence, once: `%noloop`). What the page shows is read from its DOM: `#talk`'s data-state,
# data-sent-bytes (PCM appended), data-played-bytes (PCM scheduled for playback), its transcript lines and errors.

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
needs_chromium = pytest.mark.skipif(CHROMIUM is None or CHROMEDRIVER is None,
                                    reason="Debian's chromium and chromium-driver are not installed "
                                           "(apt-get install chromium chromium-driver; .ci/run installs them)")
TALK_QUESTION = "What is the capital of France?"
TALK_SILENCE_S = 4.0  # after the question: VAD ends the turn after 0.5 s of it; the rest keeps the file from ending


def spoken_question_wav(d: VoiceDaemon, path: Path) -> Path:
    """The question spoken by joe through the daemon (a WAV at the voice's rate), then silence."""
    spoken = d.client().audio.speech.create(model=TTS, voice=TTS, input=TALK_QUESTION, response_format="wav")
    with wave.open(io.BytesIO(spoken.content)) as w:
        rate, width, channels = w.getframerate(), w.getsampwidth(), w.getnchannels()
        frames = w.readframes(w.getnframes())
    assert (width, channels) == (2, 1) and len(frames) > rate  # over half a second of PCM16 mono speech
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(frames + b"\0\0" * int(rate * TALK_SILENCE_S))
    return path


@pytest.fixture(scope="module")
def talk_page(voice_daemon: VoiceDaemon, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Chromium on the daemon's console with its fake microphone playing the question, an admin key entered."""
    from selenium import webdriver

    wav = spoken_question_wav(voice_daemon, tmp_path_factory.mktemp("talk") / "question.wav")
    secret = voice_daemon.key("console", "--admin")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--no-proxy-server",
                "--disable-extensions", "--window-size=1440,2000", "--autoplay-policy=no-user-gesture-required",
                "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
                f"--use-file-for-fake-audio-capture={wav}%noloop"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=str(CHROMEDRIVER)))
    driver.set_page_load_timeout(60)
    try:
        driver.get(f"{voice_daemon.base}/console")
        driver.find_element("id", "key-input").send_keys(secret)
        driver.find_element("id", "key-save").click()
        talk_dom(driver, lambda v: v["state"] == "idle", "the Talk view")
        wait_for(lambda: driver.find_elements("css selector", "#conn.ok"), "the console to work with the key")
        browser_errors(driver)  # the 401s before the key was entered are the console's own (test_console_browser.py)
        yield driver
    finally:
        driver.quit()


TALK_DOM = """const v = document.getElementById('talk');
return {state: v.dataset.state, session: v.dataset.session || '', sent: Number(v.dataset.sentBytes || 0),
        played: Number(v.dataset.playedBytes || 0), max: v.dataset.maxOutputTokens || '',
        status: document.getElementById('talk-state').textContent,
        user: [...document.querySelectorAll('#talk-log li.user .text')].map((n) => n.textContent),
        answer: [...document.querySelectorAll('#talk-log li.answer .text')].map((n) => n.textContent),
        traces: [...document.querySelectorAll('#talk-log li.answer[data-trace]')].map((n) => n.dataset.trace),
        errors: [...document.querySelectorAll('#talk-errors li')].map((n) => [n.dataset.code, n.dataset.answers,
                                                                            n.textContent])};"""


def talk_dom(driver: Any, ready: Any, what: str, timeout: float = WAIT_S) -> dict[str, Any]:
    """The Talk view's state once `ready(state)` holds (polled, bounded by `timeout`)."""
    last: dict[str, Any] = {}

    def check() -> dict[str, Any] | None:
        nonlocal last
        last = driver.execute_script(TALK_DOM)
        return last if ready(last) else None
    try:
        return wait_for(check, what, timeout=timeout)
    except AssertionError as e:
        raise AssertionError(f"{e}; the Talk view: {last}") from None


def browser_errors(driver: Any) -> list[str]:
    """The browser log's errors since the last call: a failed load, a script error, a CSP violation."""
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def start_talk(driver: Any, model: str, max_tokens: int = 24) -> dict[str, Any]:
    """Start a conversation on `model` with answers of `max_tokens` at most (the base model would ramble on)."""
    for field, value in (("talk-model", model), ("talk-max", str(max_tokens))):
        box = driver.find_element("id", field)
        box.clear()
        box.send_keys(value)
    driver.find_element("id", "talk-start").click()
    return talk_dom(driver, lambda v: v["state"] == "live" and v["session"], "the session to open (session.created)",
                    timeout=60)


@needs_chromium
def test_talk_opens_a_session_with_the_key_as_a_subprotocol_and_streams_the_microphone(
        voice_daemon: VoiceDaemon, talk_page: Any) -> None:
    live = start_talk(talk_page, CHAT)
    assert live["session"].startswith("sess_") and CHAT in live["status"]
    talk_dom(talk_page, lambda v: v["max"] == "24", "the page's max tokens in session.updated")
    # The fake microphone's audio goes out as appends, and the server took them: until the voice pipeline serves
    # audio each is answered `audio_not_supported`; with it, the question's speech starts a user turn.
    heard = talk_dom(talk_page, lambda v: v["sent"] >= 24_000 and (v["user"] or any(
        answers == "input_audio_buffer.append" for _, answers, _ in v["errors"])), "the server to answer the audio")
    assert heard["sent"] % 2 == 0  # whole PCM16 samples
    assert browser_errors(talk_page) == []  # no CSP violation (the worklet, the socket), no script error
    talk_page.find_element("id", "talk-stop").click()
    talk_dom(talk_page, lambda v: v["state"] == "closed", "the session to close")


# Test-side instrumentation (never in the page; a reload drops it): a silent microphone, so the server hears no turn
# of its own, and the page's socket caught on its next send, so server events can be fed to the page as if the server
# had sent them.
FAKE_SERVER = """const silent = () => new AudioContext().createMediaStreamDestination().stream;
navigator.mediaDevices.getUserMedia = async () => silent();
const send = WebSocket.prototype.send;
WebSocket.prototype.send = function (data) { window.talkSocket = this; return send.call(this, data); };"""
FEED = "window.talkSocket.dispatchEvent(new MessageEvent('message', {data: JSON.stringify(arguments[0])}))"


@needs_chromium
def test_talk_plays_audio_deltas_and_stops_playing_when_the_user_speaks_over_them(
        voice_daemon: VoiceDaemon, talk_page: Any) -> None:
    """The page's side of a turn, whatever the server serves yet: server events fed into its socket."""
    talk_page.execute_script(FAKE_SERVER)
    try:
        start_talk(talk_page, CHAT)
        wait_for(lambda: talk_page.execute_script("return Boolean(window.talkSocket)"), "the page's socket")
        fed_turn(talk_page)
    finally:
        talk_page.refresh()  # the page as it is served again, for the tests after this one
        talk_dom(talk_page, lambda v: v["state"] == "idle", "the Talk view after the reload")


def fed_turn(talk_page: Any) -> None:
    # 10 s of PCM16 24 kHz per delta: the 30 s queued still play when the user speaks over them (a bound, as HANG_S)
    ten_s = base64.b64encode(b"\x00\x10" * 240_000).decode()

    def feed(**event: Any) -> None:
        talk_page.execute_script(FEED, event)

    feed(type="input_audio_buffer.speech_started", item_id="item_u1", audio_start_ms=0)
    feed(type="conversation.item.input_audio_transcription.completed", item_id="item_u1", content_index=0,
         transcript="<b>Hello</b>?")
    feed(type="response.created", response={"id": "resp_1"})
    for _ in range(3):
        feed(type="response.output_audio_transcript.delta", response_id="resp_1", item_id="item_a1", delta="Hi. ")
        feed(type="response.output_audio.delta", response_id="resp_1", item_id="item_a1", delta=ten_s)
    played = talk_dom(talk_page, lambda v: v["played"] == 3 * 480_000, "30 s queued for playback")
    assert played["user"] == ["<b>Hello</b>?"]  # shown as text, never as HTML
    assert played["answer"] == ["Hi. Hi. Hi. "]
    assert talk_page.execute_script("return document.getElementById('talk').dataset.interrupted") == "0"
    feed(type="input_audio_buffer.speech_started", item_id="item_u2", audio_start_ms=5000)  # while it plays
    assert talk_page.execute_script("return document.getElementById('talk').dataset.interrupted") == "1"
    feed(type="error", error={"type": "invalid_request_error", "code": "some_code", "message": "said <i>so</i>"})
    told = talk_dom(talk_page, lambda v: any(code == "some_code" for code, _, _ in v["errors"]), "the error listed")
    assert ["some_code", "", "some_code: said <i>so</i>"] in told["errors"]
    assert browser_errors(talk_page) == []
    talk_page.find_element("id", "talk-stop").click()
    talk_dom(talk_page, lambda v: v["state"] == "closed", "the session to close")


@needs_chromium
def test_talk_hears_the_question_and_plays_the_spoken_answer(voice_daemon: VoiceDaemon, talk_page: Any) -> None:
    """NEEDS V1 (audio in) and V2 (audio out): the whole turn through the page."""
    start_talk(talk_page, CHAT)
    # V1: the user's words, transcribed by whisper (the page shows conversation.item.input_audio_transcription).
    def heard(v: dict[str, Any]) -> bool:
        refused = [text for _, answers, text in v["errors"] if answers == "input_audio_buffer.append"]
        assert not refused, f"the server refused the microphone's audio: {refused}"  # fails at once, not at the bound
        return any("france" in u.lower() or "capital" in u.lower() for u in v["user"])

    talk_dom(talk_page, heard, "the user's transcript", timeout=120)
    # V2: the answer's transcript and its audio played as it arrives.
    answered = talk_dom(talk_page, lambda v: any(a.strip() for a in v["answer"]) and v["played"] > 0,
                        "the spoken answer", timeout=120)
    assert answered["played"] % 2 == 0
    # The turn's trace (W's realtime.turn, else the request's) links to the console's why view.
    traced = talk_dom(talk_page, lambda v: v["traces"], "the answer's trace link", timeout=60)
    talk_page.find_element("css selector", "#talk-log li.answer[data-trace] button.link").click()
    wait_for(lambda: talk_page.find_element("id", "why-trace").text == traced["traces"][0], "the why view")
    assert browser_errors(talk_page) == []
    talk_page.find_element("id", "talk-stop").click()
    talk_dom(talk_page, lambda v: v["state"] == "closed", "the session to close")
    admin = {"Authorization": f"Bearer {voice_daemon.secrets['console']}"}

    def idle() -> bool:  # stop closed the socket: what the session ran ends (the chat's child was used)
        rows = httpx.get(f"{voice_daemon.base}/api/blazar/ps", headers=admin, timeout=30, trust_env=False).json()
        return CHAT in {r["model"] for r in rows["instances"]} and all(r["in_flight"] == 0 for r in rows["instances"])
    wait_for(idle, "no child busy after stop", timeout=60)


# --- Part E (bench): bench/realtime_latency.py runs end to end -------------------------------------------------------

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
    # The voice pipeline: one turn heard, transcribed, answered and spoken in the session.
    assert proc.returncode == 0, proc.stderr
    assert "error" not in realtime, realtime
    turn = realtime["turns"][0]
    assert "france" in turn["transcript"].lower()
    assert 0 < turn["decided"] <= turn["transcribed"] and turn["decided"] < turn["first_audio"]
    assert turn["first_token"] > 0 and turn["vad_hangover_audio_ms"] > 0
    assert report["ratio"] > 0 and set(report["targets"]) >= {"median_met", "p95_met", "ratio_met"}
