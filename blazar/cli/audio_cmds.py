"""`blazar transcribe FILE` and `blazar speak "text" --out FILE`: speech to text and text to speech through the
daemon's OpenAI audio routes (starting the daemon when none runs, like `blazar run`), so the request is admitted,
traced and counted like any other (`blazar why TRACE` explains it; the trace id is printed with --verbose)."""

from __future__ import annotations

import mimetypes
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import httpx2
import orjson
import typer

from blazar.cli.common import err
from blazar.cli.daemon_client import DaemonUnavailable, auth_headers, verify_of
from blazar.cli.run_cmds import TIMEOUT, _daemon, _remote_error

TRANSCRIPTION_FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
SPEECH_FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
DEFAULT_STT_MODEL = "whisper-base"  # `blazar pull whisper-base`
DEFAULT_TTS_MODEL = "joe"  # `blazar pull joe`
TRACE_HEADER = "x-blazar-trace-id"
_VERBATIM: dict[str, Any] = {"markup": False, "emoji": False}


def _client() -> httpx2.Client:
    info = _daemon()
    # trust_env=False: no proxy between the CLI and a loopback daemon; the CLI's admin credential, as `blazar run`.
    return httpx2.Client(base_url=info.url, trust_env=False, timeout=TIMEOUT, headers=auth_headers(),
                         verify=verify_of(info))


def transcribe(
    file: Annotated[Path, typer.Argument(help="An audio file (any format FFmpeg reads: wav, mp3, ogg, flac, m4a...).",
                                         exists=True, dir_okay=False, readable=True)],
    model: Annotated[str, typer.Option("--model", "-m", help="A whisper model from `blazar list` "
                                       "(`blazar pull whisper-base` fetches one).")] = DEFAULT_STT_MODEL,
    language: Annotated[str | None, typer.Option("--language", "-l", help="The spoken language as ISO-639-1 "
                                                 "(en, de, ...); default: detected.")] = None,
    fmt: Annotated[str, typer.Option("--format", "-f", help="text (default), json, verbose_json, srt or vtt: what "
                                     "is printed.")] = "text",
    translate: Annotated[bool, typer.Option("--translate", help="Translate the speech to English "
                                            "(/v1/audio/translations) instead of transcribing it.")] = False,
    prompt: Annotated[str | None, typer.Option("--prompt", help="Text to guide the style or spelling.")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="The trace id and the time taken on stderr "
                                          "(`blazar why TRACE` explains the request).")] = False,
) -> None:
    """Transcribe an audio file with a whisper model through the daemon (starting it when none runs); the model
    loads on first use. Prints the text (or the --format asked) to stdout."""
    if fmt not in TRANSCRIPTION_FORMATS:
        raise typer.BadParameter(f"one of {', '.join(TRANSCRIPTION_FORMATS)}", param_hint="--format")
    fields: dict[str, str] = {"model": model, "response_format": fmt}
    if language:
        fields["language"] = language
    if prompt:
        fields["prompt"] = prompt
    route = "/v1/audio/translations" if translate else "/v1/audio/transcriptions"
    started = time.perf_counter()
    with _client() as http, file.open("rb") as audio:
        mime = mimetypes.guess_type(file.name)[0] or "application/octet-stream"
        try:
            r = http.post(route, data=fields, files={"file": (file.name, audio, mime)})
        except httpx2.TransportError as e:
            raise DaemonUnavailable(f"the daemon did not answer: {e}") from None
    if not r.is_success:
        raise _remote_error(r.status_code, r.content)
    text = r.content.decode("utf-8", errors="replace")
    if fmt in ("json", "verbose_json"):
        text = orjson.dumps(orjson.loads(r.content), option=orjson.OPT_INDENT_2).decode()
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    sys.stdout.flush()
    if verbose:
        err.print(f"trace {r.headers.get(TRACE_HEADER, '?')}, {r.headers.get('x-audio-seconds', '?')} s of audio, "
                  f"{time.perf_counter() - started:.2f} s", style="dim", **_VERBATIM)


def speak(
    text: Annotated[str, typer.Argument(help="What to say; '-' reads it from stdin.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Where to write the audio ('-': stdout).",
                                      dir_okay=False)],
    voice: Annotated[str | None, typer.Option("--voice", help="A speaker of a multi-speaker voice "
                                              "(`GET /v1/audio/voices` lists them); default: the voice's own.")] = None,
    model: Annotated[str, typer.Option("--model", "-m", help="A piper voice from `blazar list` "
                                       "(`blazar pull joe` fetches one).")] = DEFAULT_TTS_MODEL,
    fmt: Annotated[str | None, typer.Option("--format", "-f", help="mp3, opus, aac, flac, wav or pcm (raw 16-bit "
                                            "24 kHz mono); default: from --out's extension, else mp3.")] = None,
    speed: Annotated[float, typer.Option("--speed", min=0.25, max=4.0, help="0.25 to 4.0; 1 is the voice's "
                                         "own pace.")] = 1.0,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="The trace id, bytes written and the time taken "
                                          "on stderr.")] = False,
) -> None:
    """Speak text with a piper voice through the daemon (starting it when none runs) and write the audio to --out
    as it arrives, sentence by sentence."""
    if text == "-":
        text = sys.stdin.read()
    if not text.strip():
        raise typer.BadParameter("nothing to say", param_hint="TEXT")
    chosen = fmt or (out.suffix.lstrip(".").lower() if out.suffix.lstrip(".").lower() in SPEECH_FORMATS else "mp3")
    if chosen not in SPEECH_FORMATS:
        raise typer.BadParameter(f"one of {', '.join(SPEECH_FORMATS)}", param_hint="--format")
    body: dict[str, Any] = {"model": model, "input": text, "response_format": chosen, "speed": speed}
    if voice:
        body["voice"] = voice
    started = time.perf_counter()
    written = 0
    to_stdout = str(out) == "-"
    partial = out.with_name(out.name + ".part") if not to_stdout else None
    with _client() as http:
        try:
            with http.stream("POST", "/v1/audio/speech", content=orjson.dumps(body),
                             headers={"content-type": "application/json"}) as r:
                if not r.is_success:
                    raise _remote_error(r.status_code, r.read())
                sink = sys.stdout.buffer if partial is None else partial.open("wb")
                try:
                    for chunk in r.iter_bytes():
                        sink.write(chunk)
                        written += len(chunk)
                finally:
                    if sink is not sys.stdout.buffer:
                        sink.close()
                trace = r.headers.get(TRACE_HEADER, "?")
        except httpx2.TransportError as e:
            if partial is not None:
                partial.unlink(missing_ok=True)
            raise DaemonUnavailable(f"the daemon stopped answering: {e}") from None
    if partial is not None:
        os.replace(partial, out)  # the file appears whole or not at all
    if verbose:
        err.print(f"trace {trace}, {written} bytes of {chosen}, {time.perf_counter() - started:.2f} s", style="dim",
                  **_VERBATIM)
