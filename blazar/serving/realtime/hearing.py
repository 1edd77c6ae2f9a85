"""A realtime session's ears: the input audio buffer (`input_audio_buffer.append/commit/clear`), server voice
activity detection over it, and the user's audio items transcribed through the session's `HearPort`.

The buffer holds the audio since the last commit as 16 kHz PCM16 (what the VAD and whisper hear), its positions in
milliseconds of the session's input (`_fed_ms` so far, `_buf_ms` where the buffer starts). With server VAD, a speech
start is told (and interrupts a running response when the settings say so), a speech stop commits the audio from the
start (prefix padding included) to the stop as a user item, and its transcript, once known, starts a response when
`create_response` says so. While nobody speaks, the buffer keeps only the prefix padding's worth: silence is not
held. Transcriptions run one after another in the background (the socket keeps taking appends); a response waits
for them (`settled`) so that it always reads the transcript.

A turn is heard early: when the speech has paused for `GUESS_PAUSE_MS`, well before the `silence_duration_ms` that
ends the turn, its speech so far is sent to whisper at once; when the turn then ends without another word, that
transcript is the turn's (the silence after it has no words), and the wait for the end of the turn overlaps the
transcription. Speech that resumes drops the guess (its request cancelled)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from blazar.adapters.resample import Pcm16Resampler
from blazar.adapters.vad import StreamingVad
from blazar.adapters.vad_rule import ServerVad, SpeechPaused, SpeechStarted, SpeechStopped, VadEvent
from blazar.dialects.realtime_audio import decode_append
from blazar.errors import AudioFormatError, EngineExtraMissing, RealtimeHearRefused
from blazar.serving.realtime import items
from blazar.serving.realtime.early import Guesses, heard_early
from blazar.serving.realtime.events import error, event, new_id
from blazar.serving.realtime.input_audio import InputSettings
from blazar.serving.realtime.port import Heard, HearPort

if TYPE_CHECKING:
    from blazar.serving.realtime.facts import TurnFacts
    from blazar.serving.realtime.session import RealtimeSession

RATE = 16_000  # what the VAD and whisper hear
MIN_COMMIT_MS = 100  # the API's least audio a commit takes
_PAD_SLACK_MS = 100  # kept before the prefix padding while nobody speaks: a window and the resampler's look-ahead


class Vad(Protocol):
    def feed(self, pcm16: bytes) -> list[VadEvent]: ...


VadFactory = Callable[[ServerVad, int], Vad]
GUESS_PAUSE_MS = 160  # a pause this long within speech sends it to whisper before the turn is known to end


def _detector(params: ServerVad, rate: int) -> Vad:
    return StreamingVad(params, rate, pause_ms=GUESS_PAUSE_MS)


class Hearing:
    def __init__(self, session: RealtimeSession, port: HearPort, stt: str, max_buffer_s: float,
                 vad_factory: VadFactory = _detector) -> None:
        self.session = session
        self.port = port
        self.stt = stt  # the whisper model's name, as the session shows it
        self.settings = InputSettings()
        self.max_buffer_ms = max_buffer_s * 1000
        self._vad_factory = vad_factory
        self._vad: Vad | None = None  # made at the first append (the model loads then), again when settings change
        self._vad_from_ms = 0.0  # where the detector's own positions start in the session's input
        self._speech: tuple[str, int] | None = None  # the item a speech start announced, and its audio_start_ms
        self._resampler = Pcm16Resampler(self.settings.format.rate, RATE)
        self._buffer = bytearray()
        self._buf_ms = 0.0
        self._fed_ms = 0.0
        self._last: asyncio.Task[None] | None = None  # the latest transcription (each waits for the one before)
        self._running: set[asyncio.Task[None]] = set()
        # The language the session's first turn was heard in: later turns are told it (whisper then skips detecting
        # it, a second pass of its encoder: about 0.6 s a turn on 2 cores), unless the session names one.
        self.language: str | None = None
        self.guesses = Guesses()  # the speech heard early, at a pause
        self.heard: Heard | None = None  # the last transcription (its trace id and ms: the turn's facts, part W)
        self.speech_started_ms: int | None = None
        self.speech_stopped_ms: int | None = None
        self.committed_at: float | None = None  # time.perf_counter() of the last commit
        self.stopped_at: float | None = None  # time.perf_counter() when VAD heard the last turn end
        self.heard_at: float | None = None  # time.perf_counter() when the last transcription came back

    def view(self) -> dict[str, Any]:
        return self.settings.view(self.stt)

    def configure(self, settings: InputSettings) -> None:
        """New `audio.input` settings. A new format or turn detection starts a new detector (positions go on)."""
        if settings.format != self.settings.format:
            self._buffer += self._resampler.flush()
            self._resampler = Pcm16Resampler(settings.format.rate, RATE)
        if settings.format != self.settings.format or settings.vad != self.settings.vad:
            self._restart_vad()
        self.settings = settings

    def _restart_vad(self) -> None:
        self._vad, self._speech, self._vad_from_ms = None, None, self._fed_ms
        self.guesses.drop()

    # -- the buffer ------------------------------------------------------------------------------------------------

    async def append(self, audio: Any, eid: str | None) -> None:
        send = self.session.send
        if not isinstance(audio, str):
            await send(error("input_audio_buffer.append: `audio` is base64 audio in the session's input format",
                             code="invalid_value", param="audio", event_id=eid))
            return
        fmt = self.settings.format
        try:
            pcm = decode_append(fmt, audio)
        except AudioFormatError as e:
            await send(error(f"input_audio_buffer.append: {e}", code=e.code, param="audio", event_id=eid))
            return
        ms = len(pcm) / 2 * 1000 / fmt.rate
        if self._fed_ms + ms - self._buf_ms > self.max_buffer_ms:
            await send(error(f"the input audio buffer holds {self.max_buffer_ms / 1000:g} s at most "
                             "(inputs.realtime_max_buffer_s): this append is not kept; commit or clear the buffer",
                             code="input_audio_buffer_full", event_id=eid))
            return
        events = await self._detect(pcm, eid)
        if events is None:
            return
        self._buffer += self._resampler.feed(pcm)
        self._fed_ms += ms
        for found in events:
            if isinstance(found, SpeechStarted):
                await self._started(found.audio_start_ms)
            elif isinstance(found, SpeechStopped):
                await self._stopped(found.audio_end_ms)
            elif isinstance(found, SpeechPaused):
                self._guess_at(found.audio_ms)
            else:
                self.guesses.drop()
        if self.settings.vad is not None and self._speech is None:  # nobody speaking: keep only the padding's worth
            self._drop_before(self._fed_ms - self.settings.vad.prefix_padding_ms - _PAD_SLACK_MS)

    async def _detect(self, pcm: bytes, eid: str | None) -> list[VadEvent] | None:
        """The detector's events for `pcm` (none without turn detection), at the session's positions; None when the
        detector cannot run (told)."""
        vad = self.settings.vad
        if vad is None:
            return []
        try:
            if self._vad is None:
                self._vad = self._vad_factory(vad, self.settings.format.rate)
            found = self._vad.feed(pcm)
        except EngineExtraMissing as e:
            await self.session.send(error(str(e), code=e.code, event_id=eid))
            return None
        shift = int(self._vad_from_ms)
        return [_shifted(e, shift) for e in found]

    async def _started(self, start_ms: int) -> None:
        item_id = new_id("item")
        self._speech = (item_id, start_ms)
        self.speech_started_ms = start_ms
        await self.session.send(event("input_audio_buffer.speech_started", audio_start_ms=start_ms, item_id=item_id))
        vad = self.settings.vad
        running = self.session.running
        if vad is not None and vad.interrupt_response and running is not None and not running.done():
            await self.session.interrupt(start_ms)

    async def _stopped(self, end_ms: int) -> None:
        if self._speech is None:
            return
        item_id, start_ms = self._speech
        self._speech = None
        self.speech_stopped_ms = end_ms
        self.stopped_at = time.perf_counter()
        await self.session.send(event("input_audio_buffer.speech_stopped", audio_end_ms=end_ms, item_id=item_id))
        audio = self._take(start_ms, end_ms)
        vad = self.settings.vad
        guess = self.guesses.take(item_id)
        await self._commit(item_id, audio, respond=vad is not None and vad.create_response, guess=guess)

    def _guess_at(self, pause_ms: int) -> None:
        """The speech paused: what was said so far, to whisper now (the turn may be ending)."""
        if self._speech is not None:
            item_id, start_ms = self._speech
            s = self.settings
            self.guesses.start(item_id, self.port.transcribe(bytes(self._buffer[self._at(start_ms):self._at(pause_ms)]),
                                                             language=s.language or self.language, prompt=s.prompt))

    async def commit(self, eid: str | None) -> None:
        held = self._fed_ms - self._buf_ms
        if held < MIN_COMMIT_MS:
            await self.session.send(error(
                "Error committing input audio buffer: buffer too small. Expected at least 100ms of audio, but buffer "
                f"only has {held:.2f}ms of audio.", code="input_audio_buffer_commit_empty", event_id=eid))
            return
        item_id = self._speech[0] if self._speech is not None else new_id("item")
        self._buffer += self._resampler.flush()  # the filter's look-ahead: the buffer's last samples, all of them
        self._resampler = Pcm16Resampler(self.settings.format.rate, RATE)
        audio = self._take(self._buf_ms, self._fed_ms)
        if self.settings.vad is not None:
            self._restart_vad()  # the speech it was hearing is committed: a stop would commit it again
        await self._commit(item_id, audio, respond=False)

    async def clear(self) -> None:
        self._buffer.clear()
        self._buf_ms = self._fed_ms
        self._restart_vad()
        await self.session.send(event("input_audio_buffer.cleared"))

    def _take(self, start_ms: float, end_ms: float) -> bytes:
        """The buffer's audio from `start_ms` to `end_ms` (what is there of it); the buffer then starts at `end_ms`."""
        audio = bytes(self._buffer[self._at(start_ms):self._at(end_ms)])
        self._drop_before(end_ms)
        return audio

    def _drop_before(self, ms: float) -> None:
        if ms > self._buf_ms:
            del self._buffer[:self._at(ms)]
            self._buf_ms = ms

    def _at(self, ms: float) -> int:
        return max(0, min(len(self._buffer) // 2, round((ms - self._buf_ms) * RATE / 1000))) * 2

    # -- the user's audio items --------------------------------------------------------------------------------------

    async def _commit(self, item_id: str, audio: bytes, *, respond: bool,
                      guess: asyncio.Task[Heard] | None = None) -> None:
        session = self.session
        self.committed_at = time.perf_counter()
        previous = session.items[-1]["id"] if session.items else None
        await session.send(event("input_audio_buffer.committed", previous_item_id=previous, item_id=item_id))
        await self.add_item(item_id, audio, None, respond=respond, guess=guess)

    async def add_item(self, item_id: str, audio: bytes, transcript: str | None, *, respond: bool,
                       eid: str | None = None, guess: asyncio.Task[Heard] | None = None) -> None:
        """A user audio item joins the conversation; its transcript is `transcript`, or whisper's on `audio` (the
        `guess` made at the turn's last pause, when there is one)."""
        if await items.refused_full(self.session, eid):
            return
        item = {"id": item_id, "object": "realtime.item", "type": "message", "status": "completed", "role": "user",
                "content": [{"type": "input_audio", "transcript": transcript}]}
        await items.join(self.session, item)
        if transcript is None:
            self._last = asyncio.create_task(self._transcribe(item, audio, respond, self._last, guess))
            self._running.add(self._last)
            self._last.add_done_callback(self._running.discard)

    async def create_item(self, item_id: str, audio: Any, transcript: str | None, eid: str | None) -> None:
        """`conversation.item.create` of a user message with one `input_audio` part: its audio (base64 in the
        session's input format) transcribed now, unless the part brings its transcript."""
        fmt = self.settings.format
        try:
            if not isinstance(audio, str):
                raise AudioFormatError("`audio` is base64 audio in the session's input format")
            pcm = decode_append(fmt, audio)
        except AudioFormatError as e:
            await self.session.send(error(f"item.content: {e}", code=e.code, param="item.content",
                                          event_id=eid))
            return
        if len(pcm) / 2 * 1000 / fmt.rate > self.max_buffer_ms:
            await self.session.send(error(f"an audio item holds {self.max_buffer_ms / 1000:g} s at most "
                                          "(inputs.realtime_max_buffer_s)", code="input_audio_too_long",
                                          param="item.content", event_id=eid))
            return
        resampler = Pcm16Resampler(fmt.rate, RATE)
        await self.add_item(item_id, resampler.feed(pcm) + resampler.flush(), transcript, respond=False, eid=eid)

    async def _transcribe(self, item: dict[str, Any], audio: bytes, respond: bool,
                          before: asyncio.Task[None] | None, guess: asyncio.Task[Heard] | None = None) -> None:
        if before is not None:
            await asyncio.wait({before})
        send = self.session.send
        s = self.settings
        try:
            heard = await heard_early(guess)
            if heard is None:
                heard = await self.port.transcribe(audio, language=s.language or self.language, prompt=s.prompt)
        except RealtimeHearRefused as e:
            await send(error(str(e), code=e.code, kind="server_error" if e.code == "engine_error" else
                             "invalid_request_error"))
            await send(event("conversation.item.input_audio_transcription.failed", item_id=item["id"],
                             content_index=0, error={"type": "transcription_error", "code": e.code,
                                                     "message": str(e)}))
            return
        self.heard, self.heard_at = heard, time.perf_counter()
        if self.language is None and heard.language and heard.text.strip():
            self.language = heard.language
        item["content"][0]["transcript"] = heard.text
        await send(event("conversation.item.input_audio_transcription.completed", item_id=item["id"],
                         content_index=0, transcript=heard.text,
                         usage={"type": "duration", "seconds": round(heard.audio_s, 3)}))
        if respond and heard.text.strip():
            await self.session.respond_to_turn()

    def told_to(self, facts: TurnFacts) -> None:
        """What hearing the last turn took, into the facts of the response that answers it (once: a later response
        without a new turn heard gets none)."""
        heard = self.heard
        if heard is None:
            return
        vad = self.settings.vad
        facts.speech_started_ms, facts.speech_stopped_ms = self.speech_started_ms, self.speech_stopped_ms
        facts.silence_ms = vad.silence_duration_ms if vad is not None and self.speech_stopped_ms is not None else None
        facts.committed_at, facts.transcribed_at = self.committed_at, self.heard_at
        facts.transcription_trace_id, facts.audio_in_seconds = heard.trace_id, round(heard.audio_s, 3)
        self.heard = None

    async def settled(self) -> None:
        """Once every transcription asked so far has ended (a response reads their transcripts)."""
        if self._last is not None:
            await asyncio.wait({self._last})

    async def close(self) -> None:
        """The connection is gone: a transcription still running is cancelled (its request with it)."""
        self.guesses.drop()
        for task in list(self._running):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _shifted(e: VadEvent, shift: int) -> VadEvent:
    """A detector's event at the session's positions (the detector counts from where it started)."""
    if isinstance(e, SpeechStarted):
        return SpeechStarted(e.audio_start_ms + shift)
    if isinstance(e, SpeechStopped):
        return SpeechStopped(e.audio_end_ms + shift)
    return type(e)(e.audio_ms + shift)
