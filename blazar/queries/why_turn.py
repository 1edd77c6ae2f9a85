"""`blazar why TURN`: the story of one realtime turn (its `realtime.turn` event, blazar/events/realtime.py): its
timeline from the turn's start (the end of the user's speech, or response.create) through VAD, transcription, the
first token and the first audio, each internal request named by its own trace with its own one-line verdict (`explain`
on its records), and a verdict for the turn. `explain_turn` is pure; `load_story` reads the log and tells a turn's
trace or a request's (a request of a realtime turn says which). The JSON has `blazar why --json`'s keys, and `turn`."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from blazar.events.base import Recorded
from blazar.events.log import EventLog
from blazar.events.realtime import RealtimeTurn, TurnStep
from blazar.queries.why import Explanation, Step, explain, fmt_ms, load_trace

# A request of a realtime session: its turn is recorded when the turn ends, among this many turns of any session.
_TURNS_AFTER = 256
_PARTS = ("transcription", "chat", "speech")
_ROUTE = "/v1/realtime"


@dataclass(frozen=True, slots=True)
class TurnExplanation:
    turn: RealtimeTurn
    trace_id: str
    actor: str | None
    received_ts: float  # the turn's start, wall clock
    verdict: str
    steps: list[Step]
    parts: dict[str, Explanation | None]  # each internal request's own story (None: not in the log)

    @property
    def outcome(self) -> str:
        return self.turn.status

    # What `blazar why` prints of any story (blazar/cli/why_cmds.py), as for a request.
    dialect = "realtime"
    route = _ROUTE
    posture = None

    @property
    def model(self) -> str:
        return self.turn.model

    def figures(self) -> dict[str, float | None]:
        t = self.turn
        return {"duration_ms": t.duration_ms, "transcription_ms": t.transcription.done_ms if t.transcription else None,
                "first_token_ms": t.chat.first_ms if t.chat else None,
                "queue_wait_ms": self._chat_figure("queue_wait_ms"),
                "first_audio_ms": t.speech.first_ms if t.speech else None,
                "tokens_in": t.chat.tokens_in if t.chat else None, "tokens_out": t.chat.tokens_out if t.chat else None,
                "audio_in_seconds": t.audio_in_seconds,
                "audio_out_seconds": t.speech.audio_seconds if t.speech else None}

    def _chat_figure(self, name: str) -> float | None:
        chat = self.parts.get("chat")
        return chat.figures.get(name) if chat is not None else None

    def to_json(self) -> dict[str, Any]:
        t = self.turn
        return {"trace_id": self.trace_id, "outcome": self.outcome, "status": None, "model": t.model,
                "dialect": self.dialect, "route": self.route, "actor": self.actor, "received_ts": self.received_ts,
                "verdict": self.verdict, "figures": self.figures(), "steps": [s.to_json() for s in self.steps],
                "posture": None,
                "turn": t.model_dump(mode="json") | {
                    "parts": {name: None if x is None else {"trace_id": x.trace_id, "outcome": x.outcome,
                                                            "verdict": x.verdict, "figures": x.figures}
                              for name, x in self.parts.items()}}}


def explain_turn(rec: Recorded, parts: dict[str, Explanation | None]) -> TurnExplanation:
    """The story of the turn `rec` records, with its internal requests' stories (by part: transcription, chat,
    speech)."""
    t = rec.event
    assert isinstance(t, RealtimeTurn)
    start = rec.ts - t.duration_ms / 1000.0
    steps: list[Step] = []

    def step(offset: float | None, kind: str, text: str, data: dict[str, Any] | None = None) -> None:
        if offset is not None:
            steps.append(Step(round(offset, 3), rec.seq, kind, text, data or {}))

    if t.vad is not None:
        v, stop = t.vad, t.vad.speech_stopped_ms
        if v.speech_started_ms is not None and stop is not None:
            step(v.speech_started_ms - stop, "vad.speech_started", f"speech started at {v.speech_started_ms} ms of "
                 "the input audio", v.model_dump())
        if stop is not None:
            silence = f" after {v.silence_ms} ms of silence" if v.silence_ms is not None else ""
            step(0.0, "vad.speech_stopped", f"speech ended at {stop} ms of the input audio{silence}: the turn "
                 "starts", v.model_dump())
    else:
        step(0.0, "response.create", "response.create arrived: the turn starts")
    for name in _PARTS:
        part: TurnStep | None = getattr(t, name)
        if part is None:
            continue
        x = parts.get(name)
        story = x.verdict if x is not None else "not in the log"
        at = part.done_ms if name == "transcription" else part.first_ms
        if at is None:
            at = x.steps[0].offset_ms + (x.received_ts - start) * 1000.0 if x is not None and x.steps else 0.0
        what = {"transcription": "transcribed", "chat": "first token", "speech": "first audio"}[name]
        words = _step_words(part)
        step(at, f"realtime.{name}", f"{what}{f' ({words})' if words else ''}; {name} {part.trace_id}: {story}",
             part.model_dump())
    if t.cancelled_ms is not None:
        sent = f", {t.audio_sent_ms} ms of audio sent" if t.audio_sent_ms is not None else ""
        step(t.cancelled_ms, "realtime.cancelled", f"cancelled{sent}")
    step(t.duration_ms, "realtime.turn", f"ended {t.status}" + (f" ({t.error})" if t.error else ""))
    steps.sort(key=lambda s: s.offset_ms)
    return TurnExplanation(turn=t, trace_id=t.trace_id, actor=rec.actor, received_ts=start,
                           verdict=turn_verdict(t, parts), steps=steps, parts=parts)


def _step_words(part: TurnStep) -> str:
    words = []
    if part.queue_position is not None:
        words.append(f"queued at position {part.queue_position}")
    if part.tokens_out is not None:
        words.append(f"{part.tokens_in} tokens in, {part.tokens_out} out")
    if part.audio_seconds is not None:
        words.append(f"{part.audio_seconds:.1f} s of audio made")
    return ", ".join(words)


def turn_verdict(t: RealtimeTurn, parts: dict[str, Explanation | None]) -> str:
    """"first audio 1.2 s after the end of speech: transcription 0.4 s, first token 0.2 s, first sentence spoken
    0.3 s", led by how the turn ended."""
    heard = t.transcription.done_ms if t.transcription is not None else None
    first = t.chat.first_ms if t.chat is not None else None
    audio = t.speech.first_ms if t.speech is not None else None
    chat = parts.get("chat")
    wait = chat.figures.get("queue_wait_ms") if chat is not None else None
    since = "the end of speech" if t.vad is not None else "response.create"
    split = []
    if heard is not None:
        split.append(f"transcription {fmt_ms(heard)}")
    if first is not None and (heard is not None or audio is not None):
        split.append(f"first token {fmt_ms(first - (heard or 0.0))}")
    if audio is not None and first is not None:
        split.append(f"first sentence spoken {fmt_ms(audio - first)}")
    if wait:
        split.append(f"{fmt_ms(wait)} of it in the queue")
    lead = (f"first audio {fmt_ms(audio)} after {since}" if audio is not None
            else f"first token {fmt_ms(first)} after {since}" if first is not None
            else f"transcribed {fmt_ms(heard)} after {since}, no answer" if heard is not None
            else f"no answer after {since}")
    text = lead + (": " + ", ".join(split) if split else "")
    if t.status == "failed":
        why = f": {chat.verdict}" if chat is not None and chat.outcome != "completed" else ""
        return f"failed ({t.error or 'error'}) after {fmt_ms(t.duration_ms)}{why}; {text}"
    if t.status == "cancelled":
        return f"cancelled after {fmt_ms(t.cancelled_ms if t.cancelled_ms is not None else t.duration_ms)}; {text}"
    return f"{t.status} in {fmt_ms(t.duration_ms)}; {text}"


# -- reading the log -----------------------------------------------------------------------------------------------

async def load_story(log: EventLog, trace_id: str) -> Explanation | TurnExplanation:
    """The story of `trace_id` (a full trace id): a realtime turn's, with its requests', or a request's (one of a
    realtime turn names that turn: `part_of`)."""
    records = await load_trace(log, trace_id)
    turn = next((r for r in records if isinstance(r.event, RealtimeTurn)), None)
    if turn is None:
        story = explain(records)
        if story.route == _ROUTE:
            return _with_turn(story, await _turn_of(log, trace_id, records[0].seq))
        return story
    assert isinstance(turn.event, RealtimeTurn)
    parts: dict[str, Explanation | None] = {}
    for name in _PARTS:
        part: TurnStep | None = getattr(turn.event, name)
        if part is not None and part.trace_id is not None:
            sub = await load_trace(log, part.trace_id)
            parts[name] = explain(sub) if sub else None
    return explain_turn(turn, parts)


async def _turn_of(log: EventLog, trace_id: str, after: int) -> str | None:
    """The turn that names the request `trace_id` as one of its parts, among the turns recorded after it began."""
    async for rec in log.read(after=after, types=[RealtimeTurn.TYPE], limit=_TURNS_AFTER):
        t = rec.event
        if isinstance(t, RealtimeTurn) and trace_id in (getattr(getattr(t, p), "trace_id", None) for p in _PARTS):
            return t.trace_id
    return None


def _with_turn(story: Explanation, turn: str | None) -> Explanation:
    if turn is None:
        return story
    return replace(story, verdict=f"{story.verdict} (part of realtime turn {turn}: blazar why {turn})")
