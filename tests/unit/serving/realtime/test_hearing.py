"""A realtime session's audio in, driven event by event against fakes: a HearPort that answers with scripted words,
a VAD that hears loud 32 ms windows as speech (through the real turn rule), and the fake chat of test_session.py.
What the client sees, in order, what audio whisper is asked to hear, and what chat the turn's response asks."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import numpy as np
import orjson

from blazar.adapters.vad_rule import ServerVad, TurnRule, VadEvent
from blazar.errors import RealtimeHearRefused
from blazar.serving.realtime.hearing import GUESS_PAUSE_MS
from blazar.serving.realtime.port import Absent, Heard, Usage
from blazar.serving.realtime.session import Bounds, RealtimeSession
from tests.support.bounds import HANG_S
from tests.unit.serving.realtime.test_session import FakeChat, user

RATE = 24_000


class FakeHear:
    """Answers each transcription with `text` (after `hold`, when given), or refuses with `refuse`."""

    def __init__(self, text: str = "what is the capital of france", hold: asyncio.Event | None = None,
                 refuse: RealtimeHearRefused | None = None) -> None:
        self.text, self.hold, self.refuse = text, hold, refuse
        self.heard: list[bytes] = []

    async def transcribe(self, pcm16_16k: bytes, *, language: str | None, prompt: str | None) -> Heard:
        self.heard.append(pcm16_16k)
        if self.hold is not None:
            await self.hold.wait()
        if self.refuse is not None:
            raise self.refuse
        return Heard(self.text, "trace-1", 12.0, len(pcm16_16k) / 32_000)


class LoudVad:
    """Speech where a 32 ms window's RMS is over 1000, decided by the real turn rule; chunking does not matter."""

    def __init__(self, params: ServerVad, rate: int) -> None:
        self.rule = TurnRule(params)
        self.window = rate * 32 // 1000
        self.pending = np.zeros(0, dtype=np.int16)
        self.windows = 0

    def feed(self, pcm16: bytes) -> list[VadEvent]:
        self.pending = np.concatenate([self.pending, np.frombuffer(pcm16, dtype="<i2")])
        events = []
        while len(self.pending) >= self.window:
            w, self.pending = self.pending[:self.window], self.pending[self.window:]
            loud = float(np.sqrt(np.mean(w.astype(np.float64) ** 2))) > 1000
            e = self.rule.window(1.0 if loud else 0.0, self.windows * 32, self.windows * 32 + 32)
            self.windows += 1
            if e is not None:
                events.append(e)
        return events


def tone(ms: int) -> bytes:
    t = np.arange(RATE * ms // 1000) / RATE
    return (8000 * np.sin(2 * np.pi * 220 * t)).astype("<i2").tobytes()


def silence(ms: int) -> bytes:
    return bytes(RATE * ms // 1000 * 2)


class Client:
    def __init__(self, chat: FakeChat | None = None, hear: FakeHear | None = None, *, max_buffer_s: float = 60.0,
                 absent: Absent | None = None) -> None:
        self.seen: list[dict[str, Any]] = []
        self.chat = chat or FakeChat(["Paris", Usage(9, 1)])
        self.hear = hear if hear is not None or absent is not None else FakeHear()

        async def send(e: dict[str, Any]) -> None:
            self.seen.append(e)

        more: dict[str, Any] = {"hear_absent": absent} if absent is not None else {}
        self.session = RealtimeSession("desk", self.chat, send, Bounds(8, 64, max_buffer_s=max_buffer_s), llm="gemma",
                                       stt="whisper-base", hear=self.hear, **more)
        if self.session.hearing is not None:
            self.session.hearing._vad_factory = LoudVad

    async def say(self, **e: Any) -> list[dict[str, Any]]:
        before = len(self.seen)
        await self.session.receive(orjson.dumps(e))
        return self.seen[before:]

    async def append(self, audio: bytes, chunk: int = 4800) -> list[dict[str, Any]]:
        before = len(self.seen)
        for i in range(0, len(audio), chunk):
            await self.session.receive(orjson.dumps({"type": "input_audio_buffer.append",
                                                     "audio": base64.b64encode(audio[i:i + chunk]).decode()}))
        return self.seen[before:]

    async def settle(self) -> list[dict[str, Any]]:
        """The events once the transcriptions and the response running have ended."""
        before = len(self.seen)
        assert self.session.hearing is not None
        await asyncio.wait_for(self.session.hearing.settled(), HANG_S)
        if self.session.running is not None:
            await asyncio.wait({self.session.running}, timeout=HANG_S)
        return self.seen[before:]

    def types(self) -> list[str]:
        return [e["type"] for e in self.seen]


async def test_a_spoken_turn_is_started_stopped_committed_transcribed_then_answered_from_its_transcript() -> None:
    c = Client()
    await c.session.start()
    assert c.seen[0]["session"]["audio"]["input"]["transcription"] == {"model": "whisper-base"}
    out = await c.append(silence(1000) + tone(1500) + silence(1000))
    started, stopped = out[0], out[1]
    assert [e["type"] for e in out[:3]] == ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
                                            "input_audio_buffer.committed"]
    assert 1000 - 300 - 32 <= started["audio_start_ms"] <= 1000 - 300 + 32  # the prefix padding before the speech
    assert 2500 + 500 <= stopped["audio_end_ms"] <= 2500 + 500 + 64  # the silence that ended it
    assert started["item_id"] == stopped["item_id"] == out[2]["item_id"]
    await c.settle()
    types = c.types()
    assert types.index("conversation.item.input_audio_transcription.completed") < types.index("response.created")
    heard = next(e for e in c.seen if e["type"] == "conversation.item.input_audio_transcription.completed")
    assert heard["transcript"] == "what is the capital of france" and heard["item_id"] == started["item_id"]
    # Whisper heard the turn at 16 kHz: from the padded start to the stop, none of the silence before.
    (audio,) = c.hear.heard
    assert abs(len(audio) / 32 - (stopped["audio_end_ms"] - started["audio_start_ms"])) <= 2
    body = c.chat.bodies[0]
    assert body["model"] == "gemma" and body["messages"] == [{"role": "user",
                                                              "content": "what is the capital of france"}]
    item = c.session.items[0]
    assert item["content"] == [{"type": "input_audio", "transcript": "what is the capital of france"}]
    assert c.seen[-1]["type"] == "response.done" and c.seen[-1]["response"]["status"] == "completed"


async def test_the_turn_is_found_whatever_the_chunking() -> None:
    positions = []
    for chunk in (960, 4801 * 2, 48_000):
        c = Client()
        out = await c.append(silence(700) + tone(800) + silence(900), chunk=chunk)
        positions.append([(e.get("audio_start_ms"), e.get("audio_end_ms")) for e in out
                          if e["type"].startswith("input_audio_buffer.speech")])
        await c.settle()
    assert positions[0] == positions[1] == positions[2] and len(positions[0]) == 2


async def test_without_create_response_a_turn_is_heard_and_not_answered() -> None:
    c = Client()
    await c.say(type="session.update", session={"audio": {"input": {"turn_detection": {
        "type": "server_vad", "create_response": False}}}})
    await c.append(tone(500) + silence(800))
    await c.settle()
    assert "conversation.item.input_audio_transcription.completed" in c.types()
    assert "response.created" not in c.types() and c.chat.bodies == []


async def test_a_manual_commit_then_response_create_waits_for_the_transcript() -> None:
    hold = asyncio.Event()
    c = Client(hear=FakeHear(hold=hold))
    await c.say(type="session.update", session={"audio": {"input": {"turn_detection": None}}})
    assert c.seen[-1]["session"]["audio"]["input"]["turn_detection"] is None
    empty = await c.say(type="input_audio_buffer.commit", event_id="e1")
    assert empty[0]["error"]["code"] == "input_audio_buffer_commit_empty" and empty[0]["error"]["event_id"] == "e1"
    await c.append(tone(80))
    short = await c.say(type="input_audio_buffer.commit")
    assert short[0]["error"]["code"] == "input_audio_buffer_commit_empty" and "80.00ms" in short[0]["error"]["message"]
    out = await c.append(tone(400))
    assert out == []  # no turn detection: no speech events
    committed = await c.say(type="input_audio_buffer.commit")
    assert [e["type"] for e in committed] == ["input_audio_buffer.committed", "conversation.item.added",
                                              "conversation.item.done"]
    await c.say(type="response.create")
    for _ in range(100):  # the response's task runs up to its wait for the transcript (bounded: a few steps)
        if "response.created" in c.types():
            break
        await asyncio.sleep(0)
    assert "response.created" in c.types() and c.chat.bodies == []
    hold.set()
    await c.settle()
    assert c.chat.bodies[0]["messages"][-1] == {"role": "user", "content": "what is the capital of france"}
    assert len(c.hear.heard[0]) == 480 * 32  # the whole buffer: 480 ms at 16 kHz


async def test_clear_empties_the_buffer() -> None:
    c = Client()
    await c.say(type="session.update", session={"audio": {"input": {"turn_detection": None}}})
    await c.append(tone(300))
    assert (await c.say(type="input_audio_buffer.clear"))[0]["type"] == "input_audio_buffer.cleared"
    assert (await c.say(type="input_audio_buffer.commit"))[0]["error"]["code"] == "input_audio_buffer_commit_empty"


async def test_a_full_buffer_refuses_the_append_and_keeps_what_it_held() -> None:
    c = Client(max_buffer_s=1.0)
    await c.say(type="session.update", session={"audio": {"input": {"turn_detection": None}}})
    await c.append(tone(900), chunk=RATE * 2)
    full = await c.append(tone(200), chunk=RATE * 2)
    assert full[0]["error"]["code"] == "input_audio_buffer_full"
    await c.say(type="input_audio_buffer.commit")
    await c.settle()
    assert len(c.hear.heard[0]) == 900 * 32


async def test_silence_with_turn_detection_is_not_held() -> None:
    c = Client(max_buffer_s=1.0)
    out = await c.append(silence(5000))
    assert out == []  # no speech, no error: only the prefix padding's worth is kept
    held = c.session.hearing
    assert held is not None and len(held._buffer) <= (300 + 100 + 200) * 32


async def test_speech_during_a_response_interrupts_it() -> None:
    hold = asyncio.Event()
    c = Client(chat=FakeChat(["The", " answer", Usage(3, 2)], hold=hold))
    await c.say(type="conversation.item.create", item=user("Hi"))
    await c.say(type="response.create")
    await c.append(tone(300))
    done = [e for e in c.seen if e["type"] == "response.done"]
    assert done and done[0]["response"]["status"] == "cancelled"
    assert c.types().index("input_audio_buffer.speech_started") < c.types().index("response.done")
    hold.set()


async def test_without_interrupt_response_speech_lets_the_response_run() -> None:
    hold = asyncio.Event()
    c = Client(chat=FakeChat(["The", Usage(3, 1)], hold=hold))
    await c.say(type="session.update", session={"audio": {"input": {"turn_detection": {
        "type": "server_vad", "interrupt_response": False, "create_response": False}}}})
    await c.say(type="conversation.item.create", item=user("Hi"))
    await c.say(type="response.create")
    await c.append(tone(300))
    assert "input_audio_buffer.speech_started" in c.types() and "response.done" not in c.types()
    hold.set()
    await c.settle()
    assert c.seen[-1]["response"]["status"] == "completed"


async def test_a_refused_transcription_is_an_error_and_a_failed_item_and_no_response() -> None:
    c = Client(hear=FakeHear(refuse=RealtimeHearRefused("key k used 60.0 s of audio today", "rate_limit_exceeded")))
    await c.append(tone(400) + silence(800))
    await c.settle()
    err = next(e for e in c.seen if e["type"] == "error")
    failed = next(e for e in c.seen if e["type"] == "conversation.item.input_audio_transcription.failed")
    assert err["error"]["code"] == "rate_limit_exceeded" and failed["error"]["code"] == "rate_limit_exceeded"
    assert "response.created" not in c.types() and c.chat.bodies == []


async def test_audio_input_settings_are_checked_whole_and_shown() -> None:
    c = Client()
    ok = await c.say(type="session.update", session={"audio": {"input": {
        "format": {"type": "audio/pcmu"}, "transcription": {"model": "whisper-1", "language": "en", "prompt": "Paris"},
        "noise_reduction": None}}})
    shown = ok[0]["session"]["audio"]["input"]
    assert shown["format"] == {"type": "audio/pcmu"}
    assert shown["transcription"] == {"model": "whisper-base", "language": "en", "prompt": "Paris"}
    assert shown["turn_detection"]["type"] == "server_vad"
    for asked, code in (({"format": {"type": "audio/opus"}}, "invalid_audio_format"),
                        ({"turn_detection": {"type": "semantic_vad"}}, "invalid_turn_detection"),
                        ({"noise_reduction": {"type": "near_field"}}, "noise_reduction_not_supported"),
                        ({"transcription": {"language": "not a language"}}, "invalid_value"),
                        ({"echo": 1}, "invalid_value"),
                        ({"format": "pcm16", "turn_detection": {"type": "server_vad", "threshold": 3}},
                         "invalid_turn_detection")):
        refused = await c.say(type="session.update", session={"audio": {"input": asked}}, event_id="u")
        assert refused[0]["error"]["code"] == code and refused[0]["error"]["event_id"] == "u", (asked, refused)
    assert c.session.hearing is not None and c.session.hearing.settings.format.type == "audio/pcmu"


async def test_g711_input_is_decoded_and_heard_at_16_khz() -> None:
    from blazar.dialects.realtime_audio import PCMU, encode

    c = Client()
    await c.say(type="session.update", session={"audio": {"input": {"format": "g711_ulaw", "turn_detection": None}}})
    t = np.arange(8000 * 500 // 1000) / 8000
    pcm8k = (8000 * np.sin(2 * np.pi * 220 * t)).astype("<i2").tobytes()
    await c.append(encode(PCMU, pcm8k), chunk=800)
    await c.say(type="input_audio_buffer.commit")
    await c.settle()
    assert abs(len(c.hear.heard[0]) - 500 * 32) <= 64


async def test_bad_audio_is_refused_and_the_session_goes_on() -> None:
    c = Client()
    bad = await c.say(type="input_audio_buffer.append", audio="not base64!", event_id="a")
    assert bad[0]["error"]["code"] == "invalid_audio_format" and bad[0]["error"]["event_id"] == "a"
    odd = await c.say(type="input_audio_buffer.append", audio=base64.b64encode(b"abc").decode())
    assert odd[0]["error"]["code"] == "invalid_audio_format"
    assert (await c.say(type="input_audio_buffer.append"))[0]["error"]["param"] == "audio"


async def test_an_audio_item_created_by_the_client_is_transcribed_or_keeps_its_transcript() -> None:
    c = Client()
    audio = base64.b64encode(tone(300)).decode()
    await c.say(type="conversation.item.create", item={"type": "message", "role": "user",
                                                        "content": [{"type": "input_audio", "audio": audio}]})
    await c.say(type="conversation.item.create", item={
        "type": "message", "role": "user", "content": [{"type": "input_audio", "audio": audio,
                                                        "transcript": "and of Spain?"}]})
    await c.say(type="response.create")
    await c.settle()
    assert len(c.hear.heard) == 1 and abs(len(c.hear.heard[0]) - 300 * 32) <= 64
    assert [m["content"] for m in c.chat.bodies[0]["messages"]] == ["what is the capital of france", "and of Spain?"]
    two = await c.say(type="conversation.item.create", item={"type": "message", "role": "user", "content": [
        {"type": "input_audio", "audio": audio}, {"type": "input_text", "text": "x"}]})
    assert two[0]["error"]["code"] == "invalid_value"


async def test_a_session_that_does_not_hear_says_why() -> None:
    lacks = Absent("model_not_allowed", "key k may not use whisper-base")
    c = Client(absent=lacks)
    await c.session.start()
    assert c.seen[0]["session"]["audio"]["input"]["transcription"] is None
    for e in ({"type": "input_audio_buffer.append", "audio": "AAAA"}, {"type": "input_audio_buffer.commit"},
              {"type": "session.update", "session": {"audio": {"input": {"turn_detection": None}}}},
              {"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [
                  {"type": "input_audio", "audio": "AAAA"}]}}):
        out = await c.say(**e)
        assert out[0]["error"]["code"] == "model_not_allowed" and "whisper-base" in out[0]["error"]["message"], out
    seen: list[dict[str, Any]] = []

    async def send(e: dict[str, Any]) -> None:
        seen.append(e)

    plain = RealtimeSession("gemma", FakeChat([]), send, Bounds(8, 64))  # a store without a whisper model
    await plain.receive(orjson.dumps({"type": "input_audio_buffer.commit"}))
    assert seen[0]["error"]["code"] == "audio_not_supported"
    assert "blazar pull whisper-base" in seen[0]["error"]["message"]


# -- heard early: the speech so far goes to whisper at a pause, before VAD ends the turn ------------------------------


class PausingVad(LoudVad):
    """LoudVad whose rule also tells pauses (as the session's real detector does)."""

    def __init__(self, params: ServerVad, rate: int) -> None:
        super().__init__(params, rate)
        self.rule = TurnRule(params, pause_ms=GUESS_PAUSE_MS)


class FlakyHear(FakeHear):
    """Refuses its first transcription, answers the rest."""

    async def transcribe(self, pcm16_16k: bytes, *, language: str | None, prompt: str | None) -> Heard:
        if not self.heard:
            self.heard.append(pcm16_16k)
            raise RealtimeHearRefused("whisper is busy", "engine_error")
        return await super().transcribe(pcm16_16k, language=language, prompt=prompt)


def pausing(hear: FakeHear | None = None) -> Client:
    c = Client(hear=hear)
    assert c.session.hearing is not None
    c.session.hearing._vad_factory = PausingVad
    return c


async def test_a_turn_heard_at_its_pause_is_transcribed_once_from_the_speech_before_the_silence() -> None:
    c = pausing()
    await c.append(silence(400) + tone(800) + silence(900))
    await c.settle()
    # One transcription, asked at the pause: the speech and its padding, not the 500 ms of silence that ended the turn.
    (audio,) = c.hear.heard
    assert 0.8 <= len(audio) / 32_000 <= 0.8 + 0.3 + 0.1
    heard = next(e for e in c.seen if e["type"] == "conversation.item.input_audio_transcription.completed")
    assert heard["transcript"] == "what is the capital of france"
    assert c.seen[-1]["type"] == "response.done" and c.chat.bodies[0]["messages"][-1]["content"] == heard["transcript"]


async def test_speech_that_resumes_after_a_pause_is_heard_whole() -> None:
    c = pausing()
    await c.append(silence(400) + tone(600) + silence(250) + tone(600) + silence(900))
    await c.settle()
    # The guess at the first pause was dropped: the turn's transcript is of both parts of the speech.
    assert len(c.hear.heard[-1]) / 32_000 >= 0.6 + 0.25 + 0.6
    assert c.types().count("conversation.item.input_audio_transcription.completed") == 1
    assert c.types().count("input_audio_buffer.committed") == 1


async def test_a_guess_that_fails_is_heard_again_whole() -> None:
    c = pausing(FlakyHear())
    await c.append(silence(400) + tone(800) + silence(900))
    await c.settle()
    assert len(c.hear.heard) == 2 and len(c.hear.heard[1]) > len(c.hear.heard[0])  # the committed turn, silence too
    assert "conversation.item.input_audio_transcription.completed" in c.types()
    assert "conversation.item.input_audio_transcription.failed" not in c.types()
