"""`blazar why TURN`: a realtime turn's timeline and verdict from its `realtime.turn` and its requests' own records
(`explain_turn`), and `load_story` telling a turn's trace, or a request's with the turn it is part of."""

from __future__ import annotations

from blazar.context import Blazar
from blazar.events.base import Event
from blazar.events.realtime import RealtimeTurn, TurnStep, TurnVad
from blazar.events.requests import RequestAdmitted, RequestCompleted, RequestFirstToken, RequestReceived
from blazar.queries.why import explain
from blazar.queries.why_turn import explain_turn, load_story
from tests.support.events import rec

TURN = "7" * 32
HEARD, CHAT, SPOKEN = "1" * 32, "2" * 32, "3" * 32
T0 = 1_700_000_000.0


def voice_turn(**more: object) -> RealtimeTurn:
    fields: dict[str, object] = dict(
        trace_id=TURN, session_id="sess_1", response_id="resp_1", index=2, model="desk", llm="gemma3-270m",
        stt="whisper-base", tts="joe", tenant="key:alice", status="completed", duration_ms=2400.0,
        vad=TurnVad(speech_started_ms=1000, speech_stopped_ms=2600, silence_ms=500),
        transcription=TurnStep(trace_id=HEARD, done_ms=400.0),
        chat=TurnStep(trace_id=CHAT, first_ms=600.0, tokens_in=40, tokens_out=12),
        speech=TurnStep(trace_id=SPOKEN, first_ms=1200.0, audio_seconds=2.5), audio_in_seconds=2.6)
    return RealtimeTurn(**(fields | more))  # type: ignore[arg-type]


def chat_records(trace: str = CHAT, at: float = T0 + 0.41) -> list:
    return [rec(10, RequestReceived(trace_id=trace, dialect="openai", route="/v1/realtime", model="gemma3-270m",
                                    stream=True), ts=at),
            rec(11, RequestAdmitted(trace_id=trace, model="gemma3-270m", slots=2, busy=2, waited_ms=120.0),
                ts=at + 0.12),
            rec(12, RequestFirstToken(trace_id=trace, model="gemma3-270m", ttft_ms=180.0), ts=at + 0.18),
            rec(13, RequestCompleted(trace_id=trace, model="gemma3-270m", duration_ms=900.0, prompt_tokens=40,
                                     completion_tokens=12, finish_reason="stop"), ts=at + 0.9)]


def test_a_voice_turn_tells_its_timeline_from_the_end_of_speech_and_splits_the_first_audio() -> None:
    turn = rec(20, voice_turn(), ts=T0 + 2.4, actor="key:alice")
    x = explain_turn(turn, {"transcription": None, "chat": explain(chat_records()), "speech": None})
    assert x.received_ts == T0 and x.actor == "key:alice" and x.outcome == "completed"
    assert [(s.offset_ms, s.type) for s in x.steps] == [
        (-1600.0, "vad.speech_started"), (0.0, "vad.speech_stopped"), (400.0, "realtime.transcription"),
        (600.0, "realtime.chat"), (1200.0, "realtime.speech"), (2400.0, "realtime.turn")]
    chat_step = x.steps[3].text
    assert CHAT in chat_step and "40 tokens in, 12 out" in chat_step and "completed 200" in chat_step
    assert HEARD in x.steps[2].text and "not in the log" in x.steps[2].text
    assert x.verdict == ("completed in 2.4 s; first audio 1.2 s after the end of speech: transcription 400 ms, "
                         "first token 200 ms, first sentence spoken 600 ms, 120 ms of it in the queue")
    j = x.to_json()
    assert j["trace_id"] == TURN and j["route"] == "/v1/realtime" and j["figures"]["first_audio_ms"] == 1200.0
    assert j["figures"]["queue_wait_ms"] == 120.0
    assert j["turn"]["parts"]["chat"]["trace_id"] == CHAT and j["turn"]["parts"]["speech"] is None
    assert j["turn"]["vad"]["silence_ms"] == 500 and len(j["steps"]) == 6


def test_a_text_turn_starts_at_response_create_and_a_cancelled_or_failed_one_says_so() -> None:
    text = voice_turn(vad=None, transcription=None, speech=None, stt=None, tts=None, audio_in_seconds=None)
    x = explain_turn(rec(5, text, ts=T0 + 2.4), {"chat": None})
    assert x.steps[0].type == "response.create" and x.steps[0].offset_ms == 0.0
    assert x.verdict == "completed in 2.4 s; first token 600 ms after response.create"
    cancelled = voice_turn(status="cancelled", cancelled_ms=1500.0, audio_sent_ms=300)
    y = explain_turn(rec(5, cancelled, ts=T0 + 2.4), {})
    assert y.verdict.startswith("cancelled after 1.5 s; first audio 1.2 s")
    assert any(s.type == "realtime.cancelled" and "300 ms of audio sent" in s.text for s in y.steps)
    failed = voice_turn(status="failed", error="queue_full", speech=None, chat=TurnStep(trace_id=CHAT))
    z = explain_turn(rec(5, failed, ts=T0 + 2.4), {})
    assert z.verdict.startswith("failed (queue_full) after 2.4 s; transcribed 400 ms after the end of speech")


async def test_load_story_tells_a_turn_with_its_requests_and_a_request_with_its_turn(app: Blazar) -> None:
    writer = app.request_writer()

    def put(event: Event, trace: str) -> None:
        writer.submit(event, actor="key:alice", trace_id=trace)

    for r in chat_records():
        put(r.event, CHAT)
    put(voice_turn(transcription=None, speech=None), TURN)
    await writer.flush()
    turn = await load_story(app.log, TURN)
    assert turn.trace_id == TURN and "first token 600 ms after the end of speech" in turn.verdict
    assert turn.to_json()["turn"]["parts"]["chat"]["outcome"] == "completed"
    request = await load_story(app.log, CHAT)
    assert request.trace_id == CHAT and request.verdict.endswith(f"(part of realtime turn {TURN}: blazar why {TURN})")
