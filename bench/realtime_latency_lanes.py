"""bench/realtime_latency.py's two lanes, each measuring one turn at a time from the end of the question's speech:
`RealtimeLane` (one /v1/realtime session over a raw WebSocket, a clock-paced microphone) and `ChainedLane` (the
client chains /v1/audio/transcriptions, /v1/chat/completions and /v1/audio/speech). A script beside the bench, not a
package."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import time
import wave
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import websockets
from websockets.asyncio.client import ClientConnection

from blazar.adapters.audio import split_sentences

RATE = 24_000  # the session's default input format and /v1/audio/speech's pcm: PCM16 mono 24 kHz
BYTES_PER_MS = RATE * 2 // 1000
CHUNK_MS = 20
LOUD_DBFS = -40.0  # a 10 ms frame louder than this is speech
TURN_S = 300.0  # one turn's bound: a cold load of a child on two shared cores, then the answer
METRICS = ("decided", "transcribed", "first_token", "first_audio")
STOPPED = "input_audio_buffer.speech_stopped"
TRANSCRIBED = "conversation.item.input_audio_transcription.completed"
TEXT_DELTAS = ("response.output_audio_transcript.delta", "response.output_text.delta")
AUDIO_DELTA = "response.output_audio.delta"


class LaneRefused(Exception):
    """The server refused or failed what a lane asked: its error code and message, for the report."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message


@dataclass(frozen=True)
class Question:
    text: str
    pcm: bytes  # PCM16 mono 24 kHz, as piper said it
    end: int  # the byte offset where its speech ends (the end of its last loud 10 ms frame)


def speech_end(pcm: bytes) -> int:
    frame = RATE // 100
    x = np.frombuffer(pcm[:len(pcm) // (2 * frame) * 2 * frame], dtype="<i2").astype(np.float64).reshape(-1, frame)
    loud = np.flatnonzero(np.sqrt((x ** 2).mean(axis=1)) > 32768 * 10 ** (LOUD_DBFS / 20))
    if not len(loud):
        raise RuntimeError("the spoken question has no frame louder than -40 dBFS")
    return int(loud[-1] + 1) * frame * 2


def _auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"} if key else {}


def _refusal(r: httpx.Response) -> LaneRefused:
    try:
        err = r.json().get("error") or {}
    except ValueError:
        err = {}
    return LaneRefused(str(err.get("code") or r.status_code), str(err.get("message") or r.text[:300]))


async def prepare_questions(url: str, key: str, tts: str, texts: tuple[str, ...]) -> list[Question]:
    """Each question spoken once by the voice through /v1/audio/speech (pcm), before anything is measured."""
    out = []
    async with httpx.AsyncClient(base_url=url, headers=_auth(key), timeout=TURN_S, trust_env=False) as http:
        for text in texts:
            r = await http.post("/v1/audio/speech", json={"model": tts, "input": text, "response_format": "pcm"})
            if r.status_code != 200:
                raise RuntimeError(f"/v1/audio/speech answered {r.status_code}: {r.text[:300]}")
            out.append(Question(text, r.content, speech_end(r.content)))
    return out


class Mic:
    """A microphone on the session: 20 ms appends paced by the clock, a question's audio when one is said, else
    silence. `say` resolves to the wall time at which the question's last loud sample was appended, and its audio
    position (ms of the session's input)."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.queue: list[tuple[Question, asyncio.Future[tuple[float, float]]]] = []
        self.sent = 0  # bytes of input audio so far

    def say(self, q: Question) -> asyncio.Future[tuple[float, float]]:
        done: asyncio.Future[tuple[float, float]] = asyncio.get_running_loop().create_future()
        self.queue.append((q, done))
        return done

    async def run(self) -> None:
        chunk, silence = BYTES_PER_MS * CHUNK_MS, bytes(BYTES_PER_MS * CHUNK_MS)
        t0, n = time.perf_counter(), 0
        current: tuple[Question, asyncio.Future[tuple[float, float]]] | None = None
        pos = 0
        while True:
            if current is None and self.queue:
                current, pos = self.queue.pop(0), 0
            piece = current[0].pcm[pos:pos + chunk] if current else silence
            await self.ws.send(json.dumps({"type": "input_audio_buffer.append",
                                           "audio": base64.b64encode(piece).decode()}))
            if current is not None:
                q, done = current
                if pos < q.end <= pos + len(piece):
                    done.set_result((time.perf_counter(), (self.sent + q.end - pos) / BYTES_PER_MS))
                pos += len(piece)
                if pos >= len(q.pcm):
                    current = None
            self.sent += len(piece)
            n += 1
            await asyncio.sleep(max(0.0, t0 + n * CHUNK_MS / 1000 - time.perf_counter()))


class RealtimeLane:
    def __init__(self, url: str, key: str, model: str, instructions: str, max_tokens: int, stt: str,
                 language: str | None) -> None:
        self.url = url.replace("http://", "ws://").replace("https://", "wss://") + f"/v1/realtime?model={model}"
        self.key, self.instructions, self.max_tokens = key, instructions, max_tokens
        # Input transcription asked as the API asks it (without it a server may send no transcription events).
        self.transcription = {"model": stt, **({"language": language} if language else {})}
        self.inbox: asyncio.Queue[tuple[float, dict[str, Any]]] = asyncio.Queue()
        self.tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> RealtimeLane:
        try:
            self.ws = await websockets.connect(self.url, additional_headers=_auth(self.key), max_size=None)
        except (OSError, websockets.InvalidHandshake) as e:  # no WebSocket there (an HTTP answer, nothing listening)
            raise LaneRefused("connect_failed", f"{self.url}: {e}") from None
        self.tasks.append(asyncio.create_task(self._read()))
        try:
            await self._expect("session.created")
            await self.ws.send(json.dumps({"type": "session.update", "session": {
                "type": "realtime", "instructions": self.instructions, "max_output_tokens": self.max_tokens,
                "output_modalities": ["audio"], "audio": {"input": {"transcription": self.transcription}}}}))
            await self._expect("session.updated")
        except BaseException:
            await self.__aexit__()  # a refused session: the socket and its reader closed all the same
            raise
        self.mic = Mic(self.ws)
        self.tasks.append(asyncio.create_task(self.mic.run()))
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.ws.close()

    async def _read(self) -> None:
        try:
            async for message in self.ws:
                await self.inbox.put((time.perf_counter(), json.loads(message)))
        except websockets.ConnectionClosed:
            pass
        await self.inbox.put((time.perf_counter(), {"type": "closed"}))

    async def _next(self) -> tuple[float, dict[str, Any]]:
        t, e = await asyncio.wait_for(self.inbox.get(), TURN_S)
        if e["type"] == "error":
            err = e.get("error") or {}
            raise LaneRefused(str(err.get("code")), str(err.get("message")))
        if e["type"] == "closed":
            raise LaneRefused("closed", "the server closed the session")
        return t, e

    async def _expect(self, kind: str) -> tuple[float, dict[str, Any]]:
        for _ in range(100_000):  # bounded: the microphone's own events (speech_started...) pass by
            t, e = await self._next()
            if e["type"] == kind:
                return t, e
        raise LaneRefused("no_event", f"no {kind}")

    async def turn(self, q: Question) -> dict[str, Any]:
        said = self.mic.say(q)
        at: dict[str, float] = {}
        row: dict[str, Any] = {"question": q.text}
        items: list[str] = []  # the turn's conversation items, as `conversation.item.added` names them
        named: list[str] = []  # else as speech_stopped and response.output_item.added name them
        for _ in range(100_000):
            t, e = await self._next()
            kind = e["type"]
            if kind == STOPPED and "decided" not in at:
                at["decided"], row["vad_audio_end_ms"] = t, e["audio_end_ms"]
                named.append(e["item_id"])
            elif kind == TRANSCRIBED:
                at["transcribed"], row["transcript"] = t, e["transcript"]
            elif kind in TEXT_DELTAS:
                at.setdefault("first_token", t)
            elif kind == AUDIO_DELTA:
                at.setdefault("first_audio", t)
            elif kind == "response.output_item.added":
                named.append(e["item"]["id"])
            elif kind == "conversation.item.added" and e["item"]["id"] not in items:
                items.append(e["item"]["id"])
            elif kind == "response.done":
                status = e["response"]["status"]
                if status != "completed":
                    raise LaneRefused(f"response_{status}", json.dumps(e["response"].get("status_details")))
                break
        missing = [m for m in METRICS if m not in at and m != "transcribed"]  # the one event a server may not send
        if missing:
            raise LaneRefused("incomplete_turn", f"the turn ended without {', '.join(missing)}")
        end_t, end_ms = await said
        row.update({m: round((at[m] - end_t) * 1000, 1) if m in at else None for m in METRICS})
        row["vad_hangover_audio_ms"] = round(row["vad_audio_end_ms"] - end_ms, 1)
        for item in items or named:  # the next turn's prompt: the instructions and its own question, as chained
            await self.ws.send(json.dumps({"type": "conversation.item.delete", "item_id": item}))
            await self._expect("conversation.item.deleted")
        return row


def _wav(pcm: bytes) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(pcm)
    return out.getvalue()


class ChainedLane:
    def __init__(self, url: str, key: str, stt: str, llm: str, tts: str, instructions: str, max_tokens: int,
                 silence_ms: int, language: str | None) -> None:
        self.url, self.key, self.stt, self.llm, self.tts, self.language = url, key, stt, llm, tts, language
        self.instructions, self.max_tokens, self.silence_ms = instructions, max_tokens, silence_ms

    async def __aenter__(self) -> ChainedLane:
        self.http = httpx.AsyncClient(base_url=self.url, headers=_auth(self.key), timeout=TURN_S, trust_env=False)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.http.aclose()

    async def turn(self, q: Question) -> dict[str, Any]:
        """The client's VAD has heard `silence_ms` of quiet after the speech: the utterance (with that silence) is
        transcribed, the transcript asked as a streamed chat, the first sentence spoken as soon as it ends."""
        wav = _wav(q.pcm[:q.end] + bytes(BYTES_PER_MS * self.silence_ms))
        t0 = time.perf_counter()
        form = {"model": self.stt, **({"language": self.language} if self.language else {})}
        r = await self.http.post("/v1/audio/transcriptions", data=form,
                                 files={"file": ("turn.wav", wav, "audio/wav")})
        if r.status_code != 200:
            raise _refusal(r)
        transcript = r.json()["text"]
        t_heard = time.perf_counter()
        first_token, sentence, t_sentence = await self._first_sentence(transcript)
        async with self.http.stream("POST", "/v1/audio/speech", json={
                "model": self.tts, "input": sentence, "response_format": "pcm"}) as r:
            if r.status_code != 200:
                await r.aread()
                raise _refusal(r)
            async for chunk in r.aiter_bytes():
                if chunk:
                    break
            t_audio = time.perf_counter()
        ms = {"transcribed": t_heard, "first_token": first_token, "first_audio": t_audio}
        return {"question": q.text, "transcript": transcript, "first_sentence": sentence,
                "decided": float(self.silence_ms), "sentence_ms": round((t_sentence - t0) * 1000 + self.silence_ms, 1),
                **{m: round((t - t0) * 1000 + self.silence_ms, 1) for m, t in ms.items()}}

    async def _first_sentence(self, transcript: str) -> tuple[float, str, float]:
        """The streamed chat read until its first sentence ends (then closed: the engine request ends with it):
        the first delta's time, the sentence and the time it ended."""
        body = {"model": self.llm, "max_tokens": self.max_tokens, "stream": True,
                "messages": [{"role": "system", "content": self.instructions},
                             {"role": "user", "content": transcript}]}
        text, first = "", None
        async with self.http.stream("POST", "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                await r.aread()
                raise _refusal(r)
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                for choice in json.loads(line[6:]).get("choices") or ():
                    delta = (choice.get("delta") or {}).get("content")
                    if delta:
                        first = first or time.perf_counter()
                        text += delta
                ended = split_sentences(text + "x")  # a stop and the whitespace after it: the first sentence ended
                if first is not None and len(ended) > 1:
                    return first, ended[0], time.perf_counter()
        sentences = split_sentences(text)
        if not sentences or first is None:
            raise LaneRefused("nothing_to_say", f"the answer has nothing to speak: {text!r}")
        return first, sentences[0], time.perf_counter()
