"""The whisper child: OpenAI's transcription API on loopback over faster-whisper (CTranslate2 on the CPU), started
by the supervisor for a model of the `whisper` kind:

    python -m blazar.children.whisper --model DIR --host 127.0.0.1 --port P --api-key-file F [--threads N]

GET /health is 503 while the model loads and 200 once it has. POST /v1/audio/transcriptions and
/v1/audio/translations take OpenAI's multipart form (file, model, language, prompt, response_format, temperature,
timestamp_granularities[], stream) with `Authorization: Bearer <the key in F>`. Every answer carries
`x-audio-seconds` (the decoded audio's length: what the gateway counts as usage). One transcription runs at a time
(the model uses every thread it was given); the rest wait their turn on a lock.

The audio is as long as decoding finds, never what the file says of itself, and decoding stops the moment it passes
the bound: the form's `blazar_max_audio_s` (the gateway sends its `max_audio_s` with every request) or else
`--max-audio-s`. Past it the answer is 400 `audio_too_long` and nothing is transcribed."""

from __future__ import annotations

import argparse
import hmac
import io
import json
import sys
import threading
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from blazar.children.transcript import (
    FORMATS,
    Segment,
    Transcript,
    Word,
    delta_event,
    done_event,
    render,
    sse,
)
from blazar.errors import ChildRefused

ROUTES = {"/v1/audio/transcriptions": "transcribe", "/v1/audio/translations": "translate"}
SAMPLE_RATE = 16_000  # what whisper hears: every upload is decoded and resampled to 16 kHz mono
DEFAULT_MAX_BYTES = 32 << 20  # OpenAI takes files up to 25 MB; the form around one adds little
DEFAULT_MAX_AUDIO_S = 3600.0  # the gateway's own default max_audio_s
# The form field in which the gateway names the longest audio this request may hold (blazar/api/audio.py writes it
# last, after dropping any a client sent; the key keeps everyone but the gateway out). Never one of OpenAI's.
MAX_AUDIO_FIELD = "blazar_max_audio_s"
BEAM_FIELD = "blazar_beam_size"  # fewer beams than the child's own for one request (blazar/adapters/engines/kinds.py)
READ_TIMEOUT_S = 120.0  # a client that stops sending its body is dropped


class Child:
    """The loaded model (None while loading), the key, and the lock one transcription holds at a time."""

    def __init__(self, model_dir: Path, key: str, threads: int, max_bytes: int, beam_size: int = 5,
                 max_audio_s: float = DEFAULT_MAX_AUDIO_S) -> None:
        self.model_dir, self.key, self.threads, self.max_bytes = model_dir, key, threads, max_bytes
        self.beam_size, self.max_audio_s = beam_size, max_audio_s
        self.model: Any = None
        self.load_failed = False
        self.lock = threading.Lock()

    def load(self) -> None:
        from faster_whisper import WhisperModel  # the `stt` extra; imported here so the module imports without it

        self.model = WhisperModel(str(self.model_dir), device="cpu", compute_type="int8", cpu_threads=self.threads)


def parse_form(body: bytes, content_type: str) -> dict[str, tuple[str | None, bytes]]:
    """A multipart/form-data body as {name: (filename or None, bytes)} (the last of a repeated name wins, except
    `timestamp_granularities[]`, whose values are joined with commas)."""
    header = Message()
    header["content-type"] = content_type
    boundary = header.get_param("boundary")
    if header.get_content_type() != "multipart/form-data" or not isinstance(boundary, str) or not boundary:
        raise ChildRefused(400, "the body must be multipart/form-data with a boundary")
    fields: dict[str, tuple[str | None, bytes]] = {}
    for part in (b"\r\n" + body).split(b"\r\n--" + boundary.encode())[1:]:
        if part.startswith(b"--"):
            break
        head, sep, content = part.partition(b"\r\n\r\n")
        if not sep:
            raise ChildRefused(400, "a part of the multipart body has no headers")
        disposition = Message()
        for line in head.decode("utf-8", "replace").split("\r\n"):
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-disposition":
                disposition["content-disposition"] = value.strip()
        field = disposition.get_param("name", header="content-disposition")
        filename = disposition.get_param("filename", header="content-disposition")
        if not isinstance(field, str):
            continue
        if field in fields and field == "timestamp_granularities[]":
            content = fields[field][1] + b"," + content
        fields[field] = (filename if isinstance(filename, str) else None, content)
    return fields


def _text(form: dict[str, tuple[str | None, bytes]], name: str) -> str | None:
    return form[name][1].decode("utf-8", "replace").strip() if name in form else None


def decode(data: bytes, max_s: float) -> Any:
    """The upload as 16 kHz mono float32 samples, as faster-whisper's own decode_audio makes them (s16, then scaled),
    but counted as it is decoded: 400 `audio_too_long` as soon as the audio passes `max_s` seconds (nothing after
    that packet is read), 400 `invalid_audio` when FFmpeg cannot read it as audio or it holds none. A packet the
    decoder rejects is skipped, as the gateway's probe skips it."""
    import av
    import numpy as np

    chunks: list[Any] = []
    counted: dict[int, int] = {}  # rate -> samples decoded at it
    try:
        with av.open(io.BytesIO(data), mode="r", metadata_errors="ignore") as container:
            if not container.streams.audio:
                raise ChildRefused(400, "the file holds no audio", param="file", code="invalid_audio")
            stream = container.streams.audio[0]
            resampler = av.AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE)
            for packet in container.demux(stream):
                try:
                    frames = packet.decode()
                except av.InvalidDataError:
                    continue
                for frame in frames:
                    if frame.sample_rate:
                        counted[frame.sample_rate] = counted.get(frame.sample_rate, 0) + frame.samples
                    frame.pts = None  # as faster-whisper: the resampler takes the frames as they come
                    chunks += [f.to_ndarray().reshape(-1) for f in resampler.resample(frame)]
                seconds = sum(n / r for r, n in counted.items())
                if seconds > max_s:
                    raise ChildRefused(400, f"the audio is longer than the limit of {max_s:g} s (inputs.max_audio_s): "
                                       f"decoding stopped at {seconds:.1f} s", param="file", code="audio_too_long")
            chunks += [f.to_ndarray().reshape(-1) for f in resampler.resample(None)]
    except (av.FFmpegError, ValueError) as e:  # ValueError: frames the resampler cannot take (a format change)
        raise ChildRefused(400, f"the file is not audio that can be decoded ({e})", param="file",
                           code="invalid_audio") from e
    if not chunks:
        raise ChildRefused(400, "the file holds no audio", param="file", code="invalid_audio")
    return np.concatenate(chunks).astype(np.float32) / 32768.0


class Options:
    """The form's fields, checked as OpenAI checks them."""

    def __init__(self, form: dict[str, tuple[str | None, bytes]], child: Child) -> None:
        if "file" not in form:
            raise ChildRefused(400, "a `file` field with the audio is required", param="file")
        self.audio = form["file"][1]
        self.fmt = _text(form, "response_format") or "json"
        if self.fmt not in FORMATS:
            raise ChildRefused(400, f"response_format must be one of {', '.join(FORMATS)}", param="response_format")
        self.prompt = _text(form, "prompt") or None
        self.language = _text(form, "language") or None
        if self.language is not None and self.language not in child.model.supported_languages:
            raise ChildRefused(400, f"unknown language {self.language!r}: give an ISO-639-1 code such as 'en'",
                         param="language")
        raw_t = _text(form, "temperature") or "0"
        try:
            self.temperature = float(raw_t)
        except ValueError:
            raise ChildRefused(400, "temperature must be a number from 0 to 1", param="temperature") from None
        if not 0.0 <= self.temperature <= 1.0:
            raise ChildRefused(400, "temperature must be a number from 0 to 1", param="temperature")
        granular = _text(form, "timestamp_granularities[]") or ""
        self.granularities = frozenset(g.strip() for g in granular.split(",") if g.strip())
        if not self.granularities <= {"word", "segment"}:
            raise ChildRefused(400, "timestamp_granularities[] takes word and segment", param="timestamp_granularities")
        if self.granularities and self.fmt != "verbose_json":
            raise ChildRefused(400, "response_format must be verbose_json to use timestamp_granularities",
                         param="timestamp_granularities")
        stream = (_text(form, "stream") or "false").lower()
        if stream not in ("true", "false"):
            raise ChildRefused(400, "stream must be true or false", param="stream")
        self.stream = stream == "true"
        bound = _text(form, MAX_AUDIO_FIELD)
        try:
            self.max_audio_s = child.max_audio_s if bound is None else float(bound)
        except ValueError:
            raise ChildRefused(400, f"{MAX_AUDIO_FIELD} must be a number of seconds", param=MAX_AUDIO_FIELD) from None
        if not 0 < self.max_audio_s < float("inf"):
            raise ChildRefused(400, f"{MAX_AUDIO_FIELD} must be a number of seconds", param=MAX_AUDIO_FIELD)
        beams = _text(form, BEAM_FIELD)
        if beams is not None and not (beams.isdigit() and 1 <= int(beams) <= 16):
            raise ChildRefused(400, f"{BEAM_FIELD} must be a number of beams from 1 to 16", param=BEAM_FIELD)
        # The child's own beam size is the most a request gets (its owner's setting).
        self.beam_size = child.beam_size if beams is None else min(int(beams), child.beam_size)


def transcribe(child: Child, samples: Any, task: str, opts: Options) -> tuple[Any, str]:
    """faster-whisper's lazy segments and the language (given or detected). Temperature 0 is OpenAI's default:
    start greedy and raise it when a segment fails the log-probability or compression checks."""
    temperature: Any = [0.0, 0.2, 0.4, 0.6, 0.8, 1.0] if opts.temperature == 0 else opts.temperature
    segments, info = child.model.transcribe(samples, language=opts.language, task=task,
                                            initial_prompt=opts.prompt, temperature=temperature,
                                            beam_size=opts.beam_size,
                                            word_timestamps="word" in opts.granularities)
    return segments, info.language


def _segment(i: int, s: Any) -> Segment:
    """faster-whisper's segment as OpenAI numbers them (from 0; faster-whisper counts from 1)."""
    return Segment(id=i, seek=s.seek, start=s.start, end=s.end, text=s.text, tokens=list(s.tokens),
                   temperature=s.temperature or 0.0, avg_logprob=s.avg_logprob,
                   compression_ratio=s.compression_ratio, no_speech_prob=s.no_speech_prob,
                   words=[Word(w.start, w.end, w.word) for w in (s.words or [])])


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = READ_TIMEOUT_S
    server: Server

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the supervisor keeps stderr's tail for crashes; one line per request would bury it

    def _send(self, status: int, body: bytes, content_type: str, audio_s: float, language: str | None = None) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.send_header("x-audio-seconds", f"{audio_s:.3f}")
        if language is not None:  # the language heard (given or detected), as its ISO code
            self.send_header("x-audio-language", language)
        self.end_headers()
        self.wfile.write(body)

    def _error(self, e: ChildRefused, audio_s: float = 0.0) -> None:
        body = {"error": {"message": e.message, "type": e.error_type, "param": e.param, "code": e.code}}
        self._send(e.http_status, json.dumps(body).encode(), "application/json", audio_s)

    def do_GET(self) -> None:
        if self.path != "/health":
            self._error(ChildRefused(404, f"no route GET {self.path}", code="not_found"))
        elif self.server.child.model is None:
            self._send(503, b'{"status":"loading"}', "application/json", 0.0)
        else:
            self._send(200, b'{"status":"ok"}', "application/json", 0.0)

    def do_POST(self) -> None:
        child = self.server.child
        try:
            task = ROUTES.get(self.path.split("?", 1)[0])
            if task is None:
                raise ChildRefused(404, f"no route POST {self.path}", code="not_found")
            self._authorize(child)
            if child.model is None:
                raise ChildRefused(503, "the model is still loading", code="model_loading", error_type="server_error")
            opts = Options(parse_form(self._body(child), self.headers.get("content-type", "")), child)
            samples = decode(opts.audio, opts.max_audio_s)
        except ChildRefused as e:
            self._error(e)
            return
        audio_s = len(samples) / SAMPLE_RATE
        with child.lock:
            try:
                segments, language = transcribe(child, samples, task, opts)
                if opts.stream:
                    self._stream(segments, audio_s)
                    return
                t = Transcript(task, language, audio_s, [_segment(i, s) for i, s in enumerate(segments)])
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True
                return
        body, content_type = render(t, opts.fmt, opts.granularities)
        self._send(200, body, content_type, audio_s, t.language)

    def _authorize(self, child: Child) -> None:
        given = self.headers.get("authorization", "")
        token = given[7:].strip() if given[:7].lower() == "bearer " else ""
        if not hmac.compare_digest(token.encode(), child.key.encode()):
            raise ChildRefused(401, "Incorrect API key provided.", code="invalid_api_key")

    def _body(self, child: Child) -> bytes:
        length = self.headers.get("content-length")
        if length is None or not length.isdigit():
            self.close_connection = True
            raise ChildRefused(411, "a content-length is required")
        if int(length) > child.max_bytes:
            self.close_connection = True  # the body stays unread: the connection cannot be used again
            raise ChildRefused(413, f"the body is {int(length)} bytes; the limit is {child.max_bytes}",
                         code="request_too_large")
        return self.rfile.read(int(length))

    def _stream(self, segments: Any, audio_s: float) -> None:
        """Server-sent events as OpenAI streams a transcription: a delta per segment, then the whole text."""
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        self.send_header("x-audio-seconds", f"{audio_s:.3f}")
        self.end_headers()
        text = ""
        for s in segments:
            delta = s.text if text else s.text.lstrip()
            if delta:
                text += delta
                self._chunk(sse(delta_event(delta)))
        self._chunk(sse(done_event(text.strip(), audio_s)))
        self._chunk(b"")

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], child: Child) -> None:
        super().__init__(address, Handler)
        self.child = child


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m blazar.children.whisper", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, type=Path, help="a CTranslate2 whisper model directory")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", required=True, type=int)
    p.add_argument("--api-key-file", required=True, type=Path, help="a file holding the key clients must send")
    p.add_argument("--threads", type=int, default=0, help="CPU threads for the model (0: CTranslate2's default)")
    p.add_argument("--max-bytes", type=int, default=DEFAULT_MAX_BYTES, help="the largest request body taken")
    p.add_argument("--beam-size", type=int, default=5, help="beams per decode (1: greedy, about twice as fast)")
    p.add_argument("--max-audio-s", type=float, default=DEFAULT_MAX_AUDIO_S,
                   help=f"the longest audio decoded when a request's form has no {MAX_AUDIO_FIELD}")
    args = p.parse_args(argv)
    key = args.api_key_file.read_text().strip()
    if not key:
        print(f"whisper child: {args.api_key_file} holds no key", file=sys.stderr)
        return 2
    child = Child(args.model, key, args.threads, args.max_bytes, args.beam_size, args.max_audio_s)
    server = Server((args.host, args.port), child)  # listening at once: /health says 503 until the model loads

    def load() -> None:
        try:
            child.load()
            print(f"whisper child: {args.model} loaded, serving on {args.host}:{args.port}", file=sys.stderr)
        except Exception as e:  # a model that cannot load ends the child: the supervisor records why
            print(f"whisper child: cannot load {args.model}: {e}", file=sys.stderr, flush=True)
            child.load_failed = True
            server.shutdown()

    threading.Thread(target=load, name="load", daemon=True).start()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 1 if child.load_failed else 0


if __name__ == "__main__":
    sys.exit(main())
