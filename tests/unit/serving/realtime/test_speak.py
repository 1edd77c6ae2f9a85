"""A realtime session's spoken answers, driven event by event against a fake chat and a fake voice: the events in
order, the audio in the session's format, the output settings, and what cancelling, interrupting and truncating keep
of an answer."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from blazar.errors import RealtimeChatRefused, RealtimeSpeechRefused
from blazar.serving.realtime.port import ChatWatch, SpokenChunk, Usage
from blazar.serving.realtime.session import Bounds, RealtimeSession
from tests.support.bounds import HANG_S

RATE = 16_000  # the fake voice's rate: each word is 100 ms of audio
WORD = RATE // 10


class FakeChat:
    def __init__(self, pieces: list[str | Usage], refuse: RealtimeChatRefused | None = None) -> None:
        self.pieces = pieces
        self.refuse = refuse
        self.bodies: list[dict[str, Any]] = []
        self.closed = 0

    async def chat(self, body: dict[str, Any], watch: ChatWatch | None = None) -> AsyncIterator[str | Usage]:
        self.bodies.append(body)
        try:
            for piece in self.pieces:
                yield piece
            if self.refuse is not None:
                raise self.refuse
        finally:
            self.closed += 1


class FakeVoice:
    """Speaks each sentence as 100 ms of a constant level a word; with `hold`, waits on it after the first sentence
    (a response to cancel while it speaks)."""

    voice = "joe"

    def __init__(self, speakers: tuple[str, ...] = (), speaker: str | None = None, hold: bool = False,
                 refuse_at: int | None = None) -> None:
        self.speakers = speakers
        self.speaker = speaker
        self.hold = asyncio.Event() if hold else None
        self.refuse_at = refuse_at
        self.asked: list[tuple[str | None, float]] = []
        self.sentences: list[str] = []
        self.closed = 0

    async def speak(self, sentences: AsyncIterator[str], *, speaker: str | None,
                    speed: float) -> AsyncIterator[SpokenChunk]:
        self.asked.append((speaker, speed))
        try:
            async for sentence in sentences:
                if self.refuse_at == len(self.sentences):
                    raise RealtimeSpeechRefused("the key's daily audio is spent", "limit_exceeded")
                self.sentences.append(sentence)
                pcm = (1000).to_bytes(2, "little", signed=True) * (WORD * len(sentence.split()))
                yield SpokenChunk(pcm, RATE, sentence, "trace-speech")
                if self.hold is not None:
                    await self.hold.wait()
        finally:
            self.closed += 1


class Client:
    def __init__(self, chat: FakeChat, voice: FakeVoice | None) -> None:
        self.seen: list[dict[str, Any]] = []

        async def send(e: dict[str, Any]) -> None:
            self.seen.append(e)

        self.session = RealtimeSession("gemma", chat, send, Bounds(8, 64), speak=voice,
                                       no_voice="this session has no voice: blazar pull joe")

    async def say(self, wait: bool = True, **e: Any) -> list[dict[str, Any]]:
        before = len(self.seen)
        await self.session.receive(orjson.dumps(e))
        if wait and self.session.running is not None:
            await asyncio.wait({self.session.running}, timeout=HANG_S)
        return self.seen[before:]

    async def until(self, type_: str) -> None:
        """Let the response run until the client was sent `type_` (bounded)."""
        for _ in range(10_000):
            if any(e["type"] == type_ for e in self.seen):
                return
            await asyncio.sleep(0)
        raise AssertionError(f"no {type_} in {[e['type'] for e in self.seen]}")


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def of(events: list[dict[str, Any]], type_: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == type_]


ANSWER = ["The sky", " is blue. It", " scatters light", " well. Bye", Usage(9, 8)]


async def test_a_spoken_response_sends_its_audio_and_transcript_in_order_and_the_done_item_holds_the_transcript(
        ) -> None:
    voice = FakeVoice()
    c = Client(FakeChat(list(ANSWER)), voice)
    await c.session.start()
    created = c.seen[0]["session"]
    assert created["output_modalities"] == ["audio"]  # a session with a voice speaks by default, as OpenAI's
    assert created["audio"]["output"] == {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "joe",
                                          "speed": 1.0}
    await c.say(type="conversation.item.create", item=user("Why?"))
    out = await c.say(type="response.create")
    kinds = [e["type"] for e in out]
    first_delta = kinds.index("response.output_audio.delta")
    assert kinds[:first_delta] == ["response.created", "response.output_item.added", "conversation.item.added",
                                   "response.content_part.added", "response.output_audio_transcript.delta"]
    assert kinds[-6:] == ["response.output_audio.done", "response.output_audio_transcript.done",
                          "response.content_part.done", "response.output_item.done", "conversation.item.done",
                          "response.done"]
    assert "response.output_text.delta" not in kinds  # audio is audio and its transcript, no text deltas
    assert voice.sentences == ["The sky is blue. ", "It scatters light well. ", "Bye"]
    transcript = "".join(e["delta"] for e in of(out, "response.output_audio_transcript.delta"))
    assert transcript == "The sky is blue. It scatters light well. Bye"
    # 9 words of 100 ms at 16 kHz, resampled to the session's 24 kHz PCM16: 0.9 s, in deltas of 500 ms at most.
    audio = b"".join(base64.b64decode(e["delta"]) for e in of(out, "response.output_audio.delta"))
    assert abs(len(audio) - 2 * 24_000 * 9 // 10) <= 8
    assert all(len(base64.b64decode(e["delta"])) <= 24_000 for e in of(out, "response.output_audio.delta"))
    # Each sentence's transcript goes out just before its audio.
    assert kinds.index("response.output_audio_transcript.delta") < first_delta
    done = out[-1]["response"]
    assert done["status"] == "completed" and done["output_modalities"] == ["audio"]
    assert done["usage"] == {"input_tokens": 9, "output_tokens": 8, "total_tokens": 17}
    assert done["output"][0]["content"] == [{"type": "output_audio", "transcript": transcript}]
    assert of(out, "response.content_part.added")[0]["part"] == {"type": "audio", "transcript": ""}
    assert of(out, "response.output_audio_transcript.done")[0]["transcript"] == transcript
    assert c.session.items[-1]["content"][0]["transcript"] == transcript
    assert c.session.turn is not None and c.session.turn.voicing is not None
    v = c.session.turn.voicing
    assert v.speech_trace_id == "trace-speech" and v.first_audio_ms is not None and abs(v.audio_out_s - 0.9) < 0.01


async def test_the_next_chat_reads_a_spoken_answer_by_its_transcript() -> None:
    chat = FakeChat(["Hi there.", Usage(1, 1)])
    c = Client(chat, FakeVoice())
    await c.say(type="response.create")
    await c.say(type="conversation.item.create", item=user("And?"))
    await c.say(type="response.create")
    assert chat.bodies[-1]["messages"] == [{"role": "assistant", "content": "Hi there."},
                                           {"role": "user", "content": "And?"}]


@pytest.mark.parametrize(("fmt", "rate"), [({"type": "audio/pcmu"}, 8000), ("g711_alaw", 8000)])
async def test_g711_output_is_one_byte_a_sample_at_8_khz(fmt: Any, rate: int) -> None:
    c = Client(FakeChat(["One two three four.", Usage(1, 4)]), FakeVoice())
    updated = await c.say(type="session.update", session={"type": "realtime", "audio": {"output": {"format": fmt}}})
    assert updated[-1]["type"] == "session.updated", updated
    out = await c.say(type="response.create")
    audio = b"".join(base64.b64decode(e["delta"]) for e in of(out, "response.output_audio.delta"))
    assert abs(len(audio) - rate * 4 // 10) <= 4  # 4 words, 400 ms


async def test_a_multi_speaker_voice_takes_only_its_speakers_and_a_single_speaker_voice_any_name() -> None:
    multi = FakeVoice(speakers=("p239", "p240"), speaker="p240")
    c = Client(FakeChat(["Hello.", Usage(1, 1)]), multi)
    bad = await c.say(type="session.update", session={"audio": {"output": {"voice": "alloy"}}}, event_id="e1")
    assert bad[0]["error"]["code"] == "invalid_value" and bad[0]["error"]["event_id"] == "e1"
    assert "p239, p240" in bad[0]["error"]["message"] and bad[0]["error"]["param"] == "session.audio.output.voice"
    await c.say(type="response.create")
    assert multi.asked[-1] == ("p240", 1.0)  # the profile's speaker by default
    ok = await c.say(type="session.update", session={"audio": {"output": {"voice": {"id": "p239"}, "speed": 1.25}}})
    assert ok[-1]["session"]["audio"]["output"]["voice"] == "p239"
    await c.say(type="response.create")
    assert multi.asked[-1] == ("p239", 1.25)
    single = FakeVoice()
    c = Client(FakeChat(["Hello.", Usage(1, 1)]), single)
    ok = await c.say(type="session.update", session={"audio": {"output": {"voice": "alloy"}}})
    assert ok[-1]["session"]["audio"]["output"]["voice"] == "alloy"
    await c.say(type="response.create")
    assert single.asked[-1] == (None, 1.0)  # joe speaks as itself


@pytest.mark.parametrize(("session", "param"), [
    ({"audio": {"output": {"speed": 2.0}}}, "session.audio.output.speed"),
    ({"audio": {"output": {"format": {"type": "audio/pcm", "rate": 16000}}}}, "session.audio.output.format"),
    ({"audio": {"output": {"voice": ""}}}, "session.audio.output.voice"),
])
async def test_bad_output_settings_are_refused_by_name_and_change_nothing(session: dict[str, Any],
                                                                          param: str) -> None:
    c = Client(FakeChat([]), FakeVoice())
    bad = await c.say(type="session.update", session={"instructions": "x", **session})
    assert bad[0]["error"]["code"] == "invalid_value" and bad[0]["error"]["param"] == param, bad
    assert c.session.instructions == "" and c.session.output.speed == 1.0


async def test_a_session_without_a_voice_is_text_by_default_and_refuses_audio_saying_why() -> None:
    c = Client(FakeChat(["Hi.", Usage(1, 1)]), None)
    await c.session.start()
    assert c.seen[0]["session"]["output_modalities"] == ["text"]
    for e in ({"type": "session.update", "session": {"output_modalities": ["audio"]}},
              {"type": "response.create", "response": {"output_modalities": ["audio"]}}):
        bad = await c.say(**e)
        assert bad[0]["error"]["code"] == "audio_not_supported"
        assert bad[0]["error"]["message"].endswith("this session has no voice: blazar pull joe")
    c.session.no_voice_code = "model_not_allowed"  # the key's scope leaves the voice out: told with that code
    bad = await c.say(type="response.create", response={"output_modalities": ["audio"]})
    assert bad[0]["error"]["code"] == "model_not_allowed"


async def test_a_response_may_answer_in_text_in_a_spoken_session_and_in_its_own_format() -> None:
    c = Client(FakeChat(["Hi.", Usage(1, 1)]), FakeVoice())
    out = await c.say(type="response.create", response={"output_modalities": ["text"]})
    assert of(out, "response.output_text.delta") and not of(out, "response.output_audio.delta")
    assert out[-1]["response"]["output"][0]["content"] == [{"type": "output_text", "text": "Hi."}]
    out = await c.say(type="response.create", response={"audio": {"output": {"format": "g711_ulaw"}}})
    audio = b"".join(base64.b64decode(e["delta"]) for e in of(out, "response.output_audio.delta"))
    assert len(audio) == 800  # one word, 100 ms at 8 kHz: the response's format, not the session's
    assert c.session.output.format.type == "audio/pcm"


async def test_cancelling_mid_speech_ends_both_requests_and_keeps_the_sentences_sent() -> None:
    chat, voice = FakeChat(["First one here. ", "Second one. ", "Third.", Usage(3, 6)]), FakeVoice(hold=True)
    c = Client(chat, voice)
    await c.say(type="response.create", wait=False)
    await c.until("response.output_audio.delta")
    out = await c.say(type="response.cancel")
    done = out[-1]["response"]
    assert done["status"] == "cancelled" and done["status_details"]["reason"] == "client_cancelled"
    assert [e["type"] for e in out][-6:] == [
        "response.output_audio.done", "response.output_audio_transcript.done", "response.content_part.done",
        "response.output_item.done", "conversation.item.done", "response.done"]
    item = c.session.items[-1]
    assert item["status"] == "incomplete" and item["content"][0]["transcript"] == "First one here. "
    assert voice.closed == 1 and chat.closed == 1  # the speech request and the chat both ended
    assert c.session.spoken[item["id"]].audio_ms == pytest.approx(300, abs=1)


async def test_an_interruption_cancels_as_turn_detected_and_tells_the_item_truncated_at_the_audio_sent() -> None:
    c = Client(FakeChat(["One two three four. ", "Five six.", Usage(3, 6)]), FakeVoice(hold=True))
    await c.say(type="response.create", wait=False)
    await c.until("response.output_audio.delta")
    before = len(c.seen)
    await c.session.interrupt(1234)
    out = c.seen[before:]
    assert out[-2]["response"]["status_details"]["reason"] == "turn_detected"
    assert out[-1]["type"] == "conversation.item.truncated"
    assert abs(out[-1]["audio_end_ms"] - 400) <= 2 and out[-1]["item_id"] == c.session.items[-1]["id"]
    assert c.session.turn is not None and c.session.turn.interrupted_at_ms == 1234
    await c.session.interrupt(2000)  # nothing running: nothing happens
    assert len(c.seen) == len(out) + before


async def test_truncate_cuts_the_transcript_to_the_words_heard_and_the_next_chat_reads_that() -> None:
    chat = FakeChat(["One two three four. ", "Five six seven eight.", Usage(3, 8)])
    c = Client(chat, FakeVoice())
    await c.say(type="response.create")
    item = c.session.items[-1]["id"]
    past = await c.say(type="conversation.item.truncate", item_id=item, content_index=0, audio_end_ms=900)
    assert past[0]["error"]["code"] == "invalid_value" and past[0]["error"]["param"] == "audio_end_ms"
    # 400 ms of the first sentence, then 150 of the second's 400: 37.5 % of its 4 words, 1 (rounded down).
    cut = await c.say(type="conversation.item.truncate", item_id=item, content_index=0, audio_end_ms=550)
    assert cut == [{"type": "conversation.item.truncated", "event_id": cut[0]["event_id"], "item_id": item,
                    "content_index": 0, "audio_end_ms": 550}]
    assert c.session.items[-1]["content"] == [{"type": "output_audio", "transcript": "One two three four. Five "}]
    again = await c.say(type="conversation.item.truncate", item_id=item, content_index=0, audio_end_ms=600)
    assert again[0]["error"]["param"] == "audio_end_ms"  # the item is 550 ms long now
    await c.say(type="conversation.item.create", item=user("Go on"))
    await c.say(type="response.create", response={"output_modalities": ["text"]})
    assert chat.bodies[-1]["messages"][0] == {"role": "assistant", "content": "One two three four. Five "}


async def test_truncate_refuses_an_unknown_item_and_a_text_item() -> None:
    c = Client(FakeChat(["Hi.", Usage(1, 1)]), FakeVoice())
    await c.say(type="conversation.item.create", item=user("Hi"))
    unknown = await c.say(type="conversation.item.truncate", item_id="nope", content_index=0, audio_end_ms=0)
    assert unknown[0]["error"]["code"] == "item_not_found"
    text = await c.say(type="conversation.item.truncate", item_id=c.session.items[0]["id"], content_index=0,
                       audio_end_ms=0)
    assert text[0]["error"]["code"] == "invalid_value"
    cleared = await c.say(type="output_audio_buffer.clear", event_id="e9")
    assert cleared[0]["error"]["code"] == "unsupported_event" and cleared[0]["error"]["event_id"] == "e9"
    assert "WebRTC" in cleared[0]["error"]["message"]


async def test_a_refused_speech_fails_the_response_and_ends_the_chat() -> None:
    chat = FakeChat(["One. ", "Two. ", "Three.", Usage(1, 3)])
    c = Client(chat, FakeVoice(refuse_at=1))
    out = await c.say(type="response.create")
    assert of(out, "error")[0]["error"]["code"] == "limit_exceeded"
    assert out[-1]["response"]["status"] == "failed"
    assert out[-1]["response"]["output"][0]["content"][0]["transcript"] == "One. "
    assert chat.closed == 1


async def test_a_refused_chat_fails_a_spoken_response_after_what_it_said() -> None:
    chat = FakeChat(["One. ", "Two"], refuse=RealtimeChatRefused("the engine broke", "engine_error"))
    voice = FakeVoice()
    c = Client(chat, voice)
    out = await c.say(type="response.create")
    assert of(out, "error")[0]["error"]["type"] == "server_error"
    assert out[-1]["response"]["status"] == "failed" and voice.sentences == ["One. "]
    assert voice.closed == 1
