"""Realtime voice sessions end to end: the official `openai` SDK's realtime client against `blazar serve` with the real
Gemma 3 270M, Blazar's whisper child on faster-whisper-base and piper's joe voice (tests/support/voice_daemon.py:
one daemon for the module, so its children start once). Each part of issue 42 has its own section below."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import re
import wave
from typing import Any

from tests.support import voice_daemon as vd
from tests.support.bounds import HANG_S
from tests.support.daemon import wait_for
from tests.support.voice_daemon import VoiceDaemon

voice_daemon = vd.voice_daemon  # the module-scoped daemon


async def until(conn: Any, last: str) -> list[Any]:
    """The server's events up to and including the first of type `last` (bounded in time and count)."""
    seen: list[Any] = []
    async with asyncio.timeout(HANG_S):
        while len(seen) < 100_000:
            e = await conn.recv()
            seen.append(e)
            if e.type == last:
                return seen
    raise AssertionError(f"no {last} in {len(seen)} events")


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
    async with d.aclient().realtime.connect(model=vd.CHAT) as conn:
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
        model=vd.STT, file=("answer.wav", _wav(pcm), "audio/wav")).text)
    shared = _words(heard) & _words(transcript)
    assert len(shared) >= min(2, len(_words(transcript))), (heard, transcript)
    await asyncio.to_thread(_spoken_once, d, len(pcm) / 48_000)


def _spoken_once(d: VoiceDaemon, seconds: float) -> None:
    """One speech request for the response, through the pipeline: completed, its audio recorded and charged."""
    speech = _realtime(d, vd.TTS)[-1]
    assert _ended(d, speech)["type"] == "request.completed"
    assert abs(_audio_s(d, speech) - seconds) < 0.1


async def test_response_cancel_mid_audio_ends_both_requests_and_keeps_what_was_sent(
        voice_daemon: VoiceDaemon) -> None:
    d = voice_daemon
    async with d.aclient().realtime.connect(model=vd.CHAT) as conn:
        await conn.recv()
        await conn.conversation.item.create(item=LONG)  # type: ignore[arg-type]
        await until(conn, "conversation.item.done")
        await conn.response.create(response={"max_output_tokens": 400, "temperature": 0})
        before = await until(conn, "response.output_audio.delta")
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
    chat, speech = _realtime(d, vd.CHAT)[chat_index], _realtime(d, vd.TTS)[-1]
    assert (_ended(d, chat)["data"].get("completion_tokens") or 0) < 400
    failed = _ended(d, speech)
    assert failed["type"] == "request.failed" and failed["data"]["status"] == 499, failed
    assert _audio_s(d, speech) > 0


async def test_a_client_gone_mid_answer_leaves_no_request_running_and_the_speech_charged(
        voice_daemon: VoiceDaemon) -> None:
    d = voice_daemon
    async with d.aclient().realtime.connect(model=vd.CHAT) as conn:
        await conn.recv()
        await conn.conversation.item.create(item=LONG)  # type: ignore[arg-type]
        await until(conn, "conversation.item.done")
        await conn.response.create(response={"max_output_tokens": 400, "temperature": 0})
        await until(conn, "response.output_audio.delta")
    # The socket closed mid-answer: the chat and the speech request end, and what was spoken is on the key's day.
    await asyncio.to_thread(_cut_short, d, -1)
    await asyncio.to_thread(_none_in_flight, d)


async def test_a_key_without_the_voice_in_its_scope_gets_a_text_session_and_audio_refused_by_name(
        voice_daemon: VoiceDaemon) -> None:
    async with voice_daemon.aclient("chat-only").realtime.connect(model=vd.CHAT) as conn:
        created = await conn.recv()
        assert created.session.output_modalities == ["text"]
        await conn.session.update(session={"type": "realtime", "output_modalities": ["audio"]})
        refused = (await conn.recv()).error
        assert refused.code == "model_not_allowed" and vd.TTS in refused.message, refused
