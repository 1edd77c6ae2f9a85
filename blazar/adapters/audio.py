"""Audio at the edge of the speech lanes: what an upload is and how long (`probe`, by FFmpeg through `av`: a file
that is not audio, or whose decoding passes the limit, is refused before a whisper child sees it), how text is cut
for streamed speech (`split_sentences`), the client of piper's own HTTP server (`PiperClient`: Blazar never imports
piper, GPL-3.0, it runs it as a child) and the encoder from piper's 16-bit PCM to OpenAI's speech formats
(`SpeechEncoder`, streamed: each chunk in gives the bytes that are ready out). `speak` strings them together for
/v1/audio/speech.

OpenAI's speech output is 24 kHz mono; piper's voices speak at their own rate (22.05 kHz for joe), so every format
is resampled to 24 kHz, as `pcm` (raw s16le) is documented to be."""

from __future__ import annotations

import io
import re
import struct
import wave
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import av
import orjson

from blazar.errors import AudioTooLong, EngineUnreachable, NotAudio, SynthesisFailed

OUT_RATE = 24_000
# OpenAI's response_format values for /v1/audio/speech and the media types it answers with.
CONTENT_TYPES = {"mp3": "audio/mpeg", "opus": "audio/opus", "aac": "audio/aac", "flac": "audio/flac",
                 "wav": "audio/wav", "pcm": "audio/pcm"}
SPEECH_FORMATS = tuple(CONTENT_TYPES)
# format -> (FFmpeg muxer, encoder); wav and pcm are written here (a header and raw samples).
_MUXED = {"mp3": ("mp3", "libmp3lame"), "opus": ("ogg", "libopus"), "aac": ("adts", "aac"), "flac": ("flac", "flac")}


@dataclass(frozen=True)
class AudioInfo:
    duration_s: float
    sample_rate: int
    channels: int
    codec: str
    container: str


def probe(source: Path | bytes, *, max_duration_s: float | None = None) -> AudioInfo:
    """What `source` holds: its first audio stream's duration, rate, channels, codec and the container. NotAudio
    when FFmpeg cannot read it as audio (or it holds no sound); AudioTooLong the moment decoding passes
    `max_duration_s`.

    The duration is what decoding finds, never what the file says: every packet of the stream is decoded (the
    samples counted, not kept) and decoding stops at the packet that takes the count past the limit, so an MP3 whose
    Xing header claims 10 frames but holds two minutes is two minutes long here, and a 25 MiB upload costs at most
    the limit's worth of decoding. A packet the decoder rejects is skipped, as the whisper child skips it (it hears
    nothing of it)."""
    try:
        with av.open(io.BytesIO(source) if isinstance(source, bytes) else str(source), mode="r",
                     metadata_errors="ignore") as container:
            if not container.streams.audio:
                raise NotAudio("the file holds no audio stream")
            stream = container.streams.audio[0]
            ctx = stream.codec_context
            seconds, rate = decoded_seconds(container, stream, max_duration_s)
            if seconds == 0 or not rate:
                raise NotAudio("the file has no audio that can be decoded")
            return AudioInfo(duration_s=seconds, sample_rate=rate, channels=ctx.channels or 1, codec=ctx.name,
                             container=container.format.name)
    except av.FFmpegError as e:
        raise NotAudio(f"the file is not audio FFmpeg can read ({e.strerror or type(e).__name__})") from e


def decoded_seconds(container: Any, stream: Any, max_s: float | None) -> tuple[float, int]:
    """(seconds of audio, the last frame's sample rate) in `stream`, by decoding it packet by packet; AudioTooLong
    as soon as the seconds pass `max_s` (nothing after that packet is read). Each frame counts at its own rate (an
    MP3's frames may change rate)."""
    samples: dict[int, int] = {}  # rate -> samples decoded at it (counted exactly; the sum of floats drifts)
    seconds, rate = 0.0, 0
    for packet in container.demux(stream):
        try:
            frames = packet.decode()
        except av.InvalidDataError:
            continue  # a damaged packet: no sound, and none for whisper either
        for frame in frames:
            if frame.sample_rate:
                rate = frame.sample_rate
                samples[rate] = samples.get(rate, 0) + frame.samples
        seconds = sum(n / r for r, n in samples.items())
        if max_s is not None and seconds > max_s:
            raise AudioTooLong(f"the audio is longer than the limit of {max_s:g} s (inputs.max_audio_s): decoding "
                               f"stopped at {seconds:.1f} s")
    return seconds, rate


# A sentence ends at . ! ? … (and any closing quotes or brackets) before whitespace, or at a blank line; not after
# a title or a single initial ("Dr. Smith", "J. Smith").
_CLOSERS = "\"')]\u201d\u2019"  # quotes (straight and curly) and brackets that may follow the stop
_END = re.compile(rf"(?<=[.!?…])[{re.escape(_CLOSERS)}]*\s+|\n\s*\n")
_NO_END = re.compile(r"(?:\b(?:Mr|Mrs|Ms|Dr|Prof|St|Sr|Jr|vs|etc|e\.g|i\.e)|\b[A-Z])\.$")


def split_sentences(text: str, *, max_chars: int = 400) -> list[str]:
    """`text` as the sentences piper speaks one at a time (so the first is heard before the last is made); a
    sentence over `max_chars` is cut at its last comma, semicolon or space before the limit. Pieces with no letter
    or digit are dropped (piper answers "..." with an error): no sentences left means nothing to say."""
    out: list[str] = []
    start = 0
    for end in sentence_ends(text):
        out.extend(cut_sentence(text[start:end].strip(), max_chars))
        start = end
    out.extend(cut_sentence(text[start:].strip(), max_chars))
    return [s for s in out if speakable(s)]


def sentence_ends(text: str) -> list[int]:
    """Where each sentence of `text` ends: the index past the stop, its closers and the whitespace after them (the
    rest of `text` after the last is a sentence not yet ended, or the last one)."""
    ends: list[int] = []
    start = 0
    for m in _END.finditer(text):
        if _NO_END.search(text[start:m.start()]):
            continue
        ends.append(m.end())
        start = m.end()
    return ends


def speakable(text: str) -> bool:
    """Whether piper has something to say in `text` (a letter or a digit)."""
    return any(c.isalnum() for c in text)


def cut_sentence(sentence: str, max_chars: int) -> list[str]:
    """`sentence` in pieces of `max_chars` at most, each cut at its last comma, semicolon or space before the limit."""
    pieces = []
    while len(sentence) > max_chars:
        head = sentence[:max_chars]
        at = max(head.rfind(", "), head.rfind("; "))
        at = at + 1 if at > 0 else head.rfind(" ")
        at = at if at > 0 else max_chars
        pieces.append(sentence[:at].strip())
        sentence = sentence[at:].strip()
    return [*pieces, sentence]


class _Sink:
    """A write-only file for the muxer: no seek, so FFmpeg writes a streamable file and never goes back."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []

    def write(self, b: bytes) -> int:
        self.chunks.append(bytes(b))
        return len(b)

    def take(self) -> bytes:
        out, self.chunks = b"".join(self.chunks), []
        return out


class SpeechEncoder:
    """16-bit mono PCM at `in_rate` in, one of SPEECH_FORMATS out, as a stream: `feed` returns the bytes the
    encoder has ready (possibly none), `finish` the rest. wav is a header with unknown lengths (0xFFFFFFFF, as a
    streamed WAV is) then the samples; pcm is the samples alone."""

    def __init__(self, fmt: str, in_rate: int) -> None:
        if fmt not in CONTENT_TYPES:
            raise ValueError(f"unknown speech format {fmt!r}")
        self.fmt, self.in_rate = fmt, in_rate
        self._pts = 0
        self._sink = _Sink()
        self._header = fmt == "wav"
        self._resampler: av.AudioResampler | None = None
        self._out: Any = None
        if fmt in _MUXED:
            muxer, codec = _MUXED[fmt]
            # flush_packets: each packet goes out as soon as it is muxed, not when a 32 KiB buffer fills; an Ogg
            # page holds 100 ms (its default, 1 s, would hold the first second back).
            options = {"flush_packets": "1"} | ({"page_duration": "100000"} if muxer == "ogg" else {})
            self._out = av.open(self._sink, mode="w", format=muxer, container_options=options, buffer_size=4096)
            self._stream = self._out.add_stream(codec, rate=OUT_RATE, layout="mono")
            if fmt != "flac":
                self._stream.bit_rate = 64_000
        else:
            self._resampler = av.AudioResampler(format="s16", layout="mono", rate=OUT_RATE)

    def _frame(self, pcm: bytes) -> av.AudioFrame:
        frame = av.AudioFrame(format="s16", layout="mono", samples=len(pcm) // 2)
        frame.planes[0].update(pcm[: (len(pcm) // 2) * 2])
        frame.sample_rate = self.in_rate
        frame.pts = self._pts
        self._pts += frame.samples
        return frame

    def feed(self, pcm: bytes) -> bytes:
        if len(pcm) < 2:
            return b""
        return self._push(self._frame(pcm))

    def finish(self) -> bytes:
        out = self._push(None)
        if self._out is not None:
            self._out.close()
        return out + self._sink.take()

    def _push(self, frame: av.AudioFrame | None) -> bytes:
        if self._out is not None:
            for packet in self._stream.encode(frame):
                self._out.mux(packet)
            return self._sink.take()
        assert self._resampler is not None
        raw = b"".join(bytes(f.planes[0])[: f.samples * 2] for f in self._resampler.resample(frame))
        if self._header:
            self._header = False
            return _streamed_wav_header(OUT_RATE) + raw
        return raw


def _streamed_wav_header(rate: int) -> bytes:
    """RIFF/WAVE, PCM s16 mono at `rate`, the RIFF and data sizes 0xFFFFFFFF: the length is not known yet."""
    fmt = struct.pack("<HHIIHH", 1, 1, rate, rate * 2, 2, 16)
    return (b"RIFF" + struct.pack("<I", 0xFFFFFFFF) + b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt
            + b"data" + struct.pack("<I", 0xFFFFFFFF))


@dataclass(frozen=True)
class Synthesized:
    """One answer of piper's /synthesize: 16-bit PCM at the voice's rate."""

    pcm: bytes
    sample_rate: int
    channels: int

    @property
    def duration_s(self) -> float:
        return len(self.pcm) / (2 * self.channels * self.sample_rate)


def length_scale_for(speed: float) -> float:
    """OpenAI's `speed` (0.25 to 4.0, 1 is normal) as piper's length_scale (how long each phoneme lasts)."""
    return 1.0 / min(4.0, max(0.25, speed))


class PiperClient:
    """Piper's own HTTP server (`python -m piper.http_server -m VOICE.onnx --host 127.0.0.1 --port P`), which loads
    its voice before it listens: `ready` is any answer from /info. It has no key of its own: it is bound to
    loopback and only Blazar knows its port."""

    def __init__(self, base_url: str, *, timeout_s: float = 300.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._timeout = aiohttp.ClientTimeout(total=timeout_s, connect=5.0)
        self._http: aiohttp.ClientSession | None = None

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(timeout=self._timeout, trust_env=False)
        return self._http

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.close()

    async def info(self) -> dict[str, Any]:
        """The voice's name, language and speakers (piper's /info)."""
        status, body = await self._exchange("GET", "/info", None)
        if status != 200:
            raise SynthesisFailed(f"piper at {self.base_url} answered /info with {status}")
        out: dict[str, Any] = orjson.loads(body)
        return out

    async def ready(self) -> bool:
        try:
            return (await self._exchange("GET", "/info", None))[0] == 200
        except EngineUnreachable:
            return False

    async def synthesize(self, text: str, *, length_scale: float | None = None, speaker_id: int | None = None,
                         noise_scale: float | None = None, noise_w_scale: float | None = None) -> Synthesized:
        """`text` spoken by the child's voice. SynthesisFailed when piper answers with an error (it does for text
        with nothing to say), EngineUnreachable when it does not answer."""
        body: dict[str, Any] = {"text": text}
        for key, value in (("length_scale", length_scale), ("speaker_id", speaker_id),
                           ("noise_scale", noise_scale), ("noise_w_scale", noise_w_scale)):
            if value is not None:
                body[key] = value
        status, wav_bytes = await self._exchange("POST", "/synthesize", orjson.dumps(body))
        if status != 200:
            raise SynthesisFailed(f"piper at {self.base_url} answered {status}: {wav_bytes[:200]!r}")
        try:
            with wave.open(io.BytesIO(wav_bytes), "rb") as w:
                if w.getsampwidth() != 2:
                    raise SynthesisFailed(f"piper answered {8 * w.getsampwidth()}-bit audio, not 16-bit")
                return Synthesized(pcm=w.readframes(w.getnframes()), sample_rate=w.getframerate(),
                                   channels=w.getnchannels())
        except (wave.Error, EOFError) as e:
            raise SynthesisFailed(f"piper at {self.base_url} answered audio that is not WAV: {e}") from e

    async def _exchange(self, method: str, path: str, body: bytes | None) -> tuple[int, bytes]:
        try:
            async with self._session().request(method, self.base_url + path, data=body,
                                               headers={"content-type": "application/json"}) as r:
                return r.status, await r.read()
        except (aiohttp.ClientError, TimeoutError) as e:
            raise EngineUnreachable(f"piper at {self.base_url} did not answer {path}: {e}") from e


async def speak(client: PiperClient, text: str, fmt: str, *, speed: float = 1.0) -> AsyncIterator[bytes]:
    """`text` as `fmt` bytes, streamed: each sentence is synthesized, encoded and yielded before the next is
    asked for. The encoder is made at the first sentence's rate (a voice speaks at one rate)."""
    encoder: SpeechEncoder | None = None
    for sentence in split_sentences(text):
        said = await client.synthesize(sentence, length_scale=length_scale_for(speed))
        if encoder is None:
            encoder = SpeechEncoder(fmt, said.sample_rate)
        chunk = encoder.feed(said.pcm)
        if chunk:
            yield chunk
    if encoder is not None:
        tail = encoder.finish()
        if tail:
            yield tail
