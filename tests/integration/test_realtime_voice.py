"""The Realtime API's voice sessions end to end: the official `openai` SDK's realtime client against `blazar serve`
with the real Gemma 3 270M, Blazar's whisper child on faster-whisper-base and piper's joe voice (one daemon for the
module: tests/support/voice_daemon.py). Speech for a test is made by piper through the daemon itself."""

from __future__ import annotations

import asyncio
import base64
import re
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed

from tests.support import voice_daemon as voice
from tests.support.voice_daemon import PROFILE, WAIT_S, VoiceDaemon

voice_daemon = voice.voice_daemon  # the module's daemon and its three children, started once


async def until(conn: Any, last: str, limit: int = 10_000) -> list[Any]:
    """The server's events up to and including the first of type `last` (bounded in time and count: the children's
    cold starts and work on two shared cores, WAIT_S)."""
    seen: list[Any] = []
    try:
        async with asyncio.timeout(WAIT_S):
            while len(seen) < limit:
                e = await conn.recv()
                seen.append(e)
                if e.type == last:
                    return seen
    except TimeoutError:
        pass
    raise AssertionError(f"no {last} in {len(seen)} events: {[e.type for e in seen]}")


# --- V1: hearing (audio in: the buffer, server VAD, transcription, the turn's response) -----------------------------

QUESTION = "What is the capital of France?"
CHUNK = 4800  # bytes of PCM16 at 24 kHz: 100 ms, as a microphone sends


def spoken(d: VoiceDaemon, text: str) -> bytes:
    """`text` spoken by joe through the daemon as PCM16 24 kHz mono (the session's default input format)."""
    return d.client().audio.speech.create(model="joe", voice="joe", input=text, response_format="pcm").read()


def words(text: str) -> set[str]:
    return set(re.findall(r"[a-z]+", text.lower()))


@pytest.fixture(scope="module")
def question(voice_daemon: VoiceDaemon) -> bytes:
    """The question spoken, then a second of silence (server VAD ends the turn in audio time, not wall time)."""
    return spoken(voice_daemon, QUESTION) + bytes(48_000)


async def append(conn: Any, audio: bytes) -> None:
    for i in range(0, len(audio), CHUNK):
        await conn.input_audio_buffer.append(audio=base64.b64encode(audio[i:i + CHUNK]).decode())


async def test_a_spoken_question_is_detected_committed_transcribed_and_answered(
        voice_daemon: VoiceDaemon, question: bytes) -> None:
    async with voice_daemon.aclient().realtime.connect(model=PROFILE) as conn:
        created = await conn.recv()
        assert created.type == "session.created" and created.session.model == PROFILE
        assert created.session.audio.input.transcription.model == voice.STT
        await conn.session.update(session={"type": "realtime", "output_modalities": ["text"],
                                           "max_output_tokens": 16, "instructions": "Answer in a few words."})
        assert (await conn.recv()).type == "session.updated"
        await append(conn, question)
        events = await until(conn, "response.done")
    types = [e.type for e in events]
    order = ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
             "input_audio_buffer.committed", "conversation.item.added",
             "conversation.item.input_audio_transcription.completed", "response.created", "response.done"]
    firsts = [types.index(t) if t in types else -1 for t in order]
    assert -1 not in firsts and firsts == sorted(firsts), types
    started, stopped, committed, added, heard = (next(e for e in events if e.type == t) for t in order[:5])
    assert started.item_id == stopped.item_id == committed.item_id == added.item.id == heard.item_id
    assert 0 <= started.audio_start_ms < stopped.audio_end_ms <= len(question) // 48
    assert added.item.role == "user" and added.item.content[0].type == "input_audio"
    assert len(words(heard.transcript) & words(QUESTION)) >= 3, heard.transcript
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


async def test_the_chat_model_alone_on_a_chat_only_key_is_a_text_session_that_names_what_it_lacks(
        voice_daemon: VoiceDaemon) -> None:
    async with voice_daemon.aclient("chat-only").realtime.connect(model=voice.CHAT) as conn:
        assert (await conn.recv()).session.audio.input.transcription is None
        await conn.input_audio_buffer.append(audio=base64.b64encode(bytes(4800)).decode())
        refused = await conn.recv()
    assert refused.type == "error" and refused.error.code == "model_not_allowed"
    assert voice.STT in refused.error.message


async def test_a_manual_turn_is_committed_by_the_client_and_answered_on_response_create(
        voice_daemon: VoiceDaemon, question: bytes) -> None:
    async with voice_daemon.aclient().realtime.connect(model=PROFILE) as conn:
        await conn.recv()
        await conn.session.update(session={"type": "realtime", "output_modalities": ["text"],
                                           "max_output_tokens": 16,
                                           "audio": {"input": {"turn_detection": None}}})
        updated = await conn.recv()
        assert updated.type == "session.updated" and updated.session.audio.input.turn_detection is None
        await conn.input_audio_buffer.commit()
        assert (await conn.recv()).error.code == "input_audio_buffer_commit_empty"
        await append(conn, question)
        await conn.input_audio_buffer.commit()
        await conn.response.create()  # at once: the response waits for the transcript
        events = await until(conn, "response.done")
    types = [e.type for e in events]
    assert "input_audio_buffer.speech_started" not in types
    assert types.index("input_audio_buffer.committed") < types.index("response.created")
    heard = next(e for e in events if e.type == "conversation.item.input_audio_transcription.completed")
    assert len(words(heard.transcript) & words(QUESTION)) >= 3, heard.transcript
    assert types.index("conversation.item.input_audio_transcription.completed") < types.index(
        "response.output_item.added")
    assert events[-1].response.status == "completed"
