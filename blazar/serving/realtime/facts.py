"""What one turn of a realtime session was, gathered as it goes (`TurnFacts`, held on the Turn as `turn.facts`) and
recorded once when it ends as a `realtime.turn` event (`turn_event`; the daemon's `TurnRecorder` appends it). Plain
fields, set by whoever knows them: times are `time.perf_counter()` instants (each `*_at`), made ms from the turn's
start only in the event; audio positions are ms of the session's input audio. Never content: ids, counts, times."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from blazar.events.realtime import RealtimeTurn, TurnStatus, TurnStep, TurnVad
from blazar.ids import new_trace_id


@dataclass(frozen=True, slots=True)
class TurnModels:
    """The models that serve the session (blazar/queries/realtime.py `SessionModels`, by name), and the `model` the
    session asked (a realtime profile or a chat model)."""

    asked: str
    llm: str
    stt: str | None = None
    tts: str | None = None
    speaker: str | None = None


@dataclass
class TurnFacts:
    session_id: str
    response_id: str
    index: int  # the turn's place in its session (0 = the first)
    trace_id: str = field(default_factory=new_trace_id)  # the turn's own trace: `blazar why` it
    # The turn's start: the end of the user's speech as VAD heard it, mapped to the instant the audio holding
    # `speech_stopped_ms` arrived (a voice turn: hear sets it), else response.create's arrival (the default).
    started_at: float = field(default_factory=time.perf_counter)
    # -- hearing (set by the input audio buffer: server VAD, commit, transcription)
    speech_started_ms: int | None = None  # input_audio_buffer.speech_started's audio_start_ms
    speech_stopped_ms: int | None = None  # ... speech_stopped's audio_end_ms
    silence_ms: int | None = None  # the silence VAD waited for (turn_detection.silence_duration_ms)
    committed_at: float | None = None  # the buffer committed (by VAD or the client)
    transcription_trace_id: str | None = None  # the internal /v1/audio/transcriptions request's trace
    transcribed_at: float | None = None  # its text came back
    audio_in_seconds: float | None = None  # the user's audio the turn heard
    # -- the answer's chat (set by the Turn, from the ChatPort's watch)
    chat_trace_id: str | None = None  # the internal /v1/chat/completions request's trace
    queue_position: int | None = None  # it waited for a slot: its place when it queued (1 = next)
    first_token_at: float | None = None  # its first text reached the session
    tokens_in: int | None = None  # from its usage (None: it ended before the usage came)
    tokens_out: int | None = None
    # -- the spoken answer (set by the speaking side)
    speech_trace_id: str | None = None  # the internal /v1/audio/speech request's trace
    first_audio_at: float | None = None  # the first output_audio.delta sent
    audio_out_seconds: float | None = None  # the audio made
    audio_sent_ms: int | None = None  # a cancelled answer: the audio the client had been sent
    # -- its end (set by the Turn)
    status: TurnStatus = "incomplete"
    error: str | None = None  # a failed turn's error code
    cancelled_at: float | None = None
    ended_at: float | None = None

    def ms(self, at: float | None) -> float | None:
        """`at` in ms from the turn's start (None stays None)."""
        return None if at is None else round((at - self.started_at) * 1000.0, 3)


def turn_event(facts: TurnFacts, models: TurnModels, tenant: str | None) -> RealtimeTurn:
    """The `realtime.turn` event of a turn that ended."""
    f = facts
    vad = None
    if f.speech_started_ms is not None or f.speech_stopped_ms is not None:
        vad = TurnVad(speech_started_ms=f.speech_started_ms, speech_stopped_ms=f.speech_stopped_ms,
                      silence_ms=f.silence_ms)
    heard = None
    if f.transcription_trace_id is not None:
        heard = TurnStep(trace_id=f.transcription_trace_id, done_ms=f.ms(f.transcribed_at))
    chat = None
    if f.chat_trace_id is not None:
        chat = TurnStep(trace_id=f.chat_trace_id, first_ms=f.ms(f.first_token_at), queue_position=f.queue_position,
                        tokens_in=f.tokens_in, tokens_out=f.tokens_out)
    spoken = None
    if f.speech_trace_id is not None:
        spoken = TurnStep(trace_id=f.speech_trace_id, first_ms=f.ms(f.first_audio_at),
                          audio_seconds=f.audio_out_seconds)
    ended = f.ended_at if f.ended_at is not None else time.perf_counter()
    return RealtimeTurn(trace_id=f.trace_id, session_id=f.session_id, response_id=f.response_id, index=f.index,
                        model=models.asked, llm=models.llm, stt=models.stt, tts=models.tts, speaker=models.speaker,
                        tenant=tenant, status=f.status, error=f.error, duration_ms=f.ms(ended) or 0.0, vad=vad,
                        transcription=heard, chat=chat, speech=spoken, audio_in_seconds=f.audio_in_seconds,
                        cancelled_ms=f.ms(f.cancelled_at), audio_sent_ms=f.audio_sent_ms)
