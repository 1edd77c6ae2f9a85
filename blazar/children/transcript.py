"""How the whisper child renders a transcription in OpenAI's response formats (json, text, srt, vtt,
verbose_json) and its stream events: pure functions over plain segments, so the formats are tested without a
model."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

FORMATS = ("json", "text", "srt", "vtt", "verbose_json")

# Whisper's languages by ISO code, named as OpenAI's verbose_json names them ("english").
_NAMES = (
    "en english,zh chinese,de german,es spanish,ru russian,ko korean,fr french,ja japanese,pt portuguese,"
    "tr turkish,pl polish,ca catalan,nl dutch,ar arabic,sv swedish,it italian,id indonesian,hi hindi,fi finnish,"
    "vi vietnamese,he hebrew,uk ukrainian,el greek,ms malay,cs czech,ro romanian,da danish,hu hungarian,ta tamil,"
    "no norwegian,th thai,ur urdu,hr croatian,bg bulgarian,lt lithuanian,la latin,mi maori,ml malayalam,cy welsh,"
    "sk slovak,te telugu,fa persian,lv latvian,bn bengali,sr serbian,az azerbaijani,sl slovenian,kn kannada,"
    "et estonian,mk macedonian,br breton,eu basque,is icelandic,hy armenian,ne nepali,mn mongolian,bs bosnian,"
    "kk kazakh,sq albanian,sw swahili,gl galician,mr marathi,pa punjabi,si sinhala,km khmer,sn shona,yo yoruba,"
    "so somali,af afrikaans,oc occitan,ka georgian,be belarusian,tg tajik,sd sindhi,gu gujarati,am amharic,"
    "yi yiddish,lo lao,uz uzbek,fo faroese,ht haitian creole,ps pashto,tk turkmen,nn nynorsk,mt maltese,"
    "sa sanskrit,lb luxembourgish,my myanmar,bo tibetan,tl tagalog,mg malagasy,as assamese,tt tatar,"
    "haw hawaiian,ln lingala,ha hausa,ba bashkir,jw javanese,su sundanese,yue cantonese"
)
LANGUAGE_NAMES = dict(pair.split(" ", 1) for pair in _NAMES.split(","))


@dataclass(frozen=True)
class Word:
    start: float
    end: float
    word: str


@dataclass(frozen=True)
class Segment:
    id: int
    seek: int
    start: float
    end: float
    text: str
    tokens: list[int]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    words: list[Word] = field(default_factory=list)


@dataclass(frozen=True)
class Transcript:
    task: str  # "transcribe" or "translate"
    language: str  # the ISO code whisper detected or was given
    duration_s: float
    segments: list[Segment]

    @property
    def text(self) -> str:
        return "".join(s.text for s in self.segments).strip()


def usage(duration_s: float) -> dict[str, Any]:
    return {"type": "duration", "seconds": round(duration_s, 3)}


def render(t: Transcript, fmt: str, granularities: frozenset[str]) -> tuple[bytes, str]:
    """The body and its content type for `fmt`. A translation's json and verbose_json carry no usage (OpenAI's
    don't); the audio's length is in the x-audio-seconds header either way."""
    if fmt == "text":
        return (t.text + "\n").encode(), "text/plain; charset=utf-8"
    if fmt == "srt":
        return srt(t.segments).encode(), "text/plain; charset=utf-8"
    if fmt == "vtt":
        return vtt(t.segments).encode(), "text/vtt; charset=utf-8"
    body: dict[str, Any]
    if fmt == "json":
        body = {"text": t.text}
    else:
        body = {"task": t.task, "language": "english" if t.task == "translate" else
                LANGUAGE_NAMES.get(t.language, t.language), "duration": round(t.duration_s, 3), "text": t.text}
        if "segment" in granularities or not granularities:
            body["segments"] = [_segment(s) for s in t.segments]
        if "word" in granularities:
            body["words"] = [{"word": w.word.strip(), "start": round(w.start, 3), "end": round(w.end, 3)}
                             for s in t.segments for w in s.words]
    if t.task == "transcribe":
        body["usage"] = usage(t.duration_s)
    return json.dumps(body, ensure_ascii=False).encode(), "application/json"


def _segment(s: Segment) -> dict[str, Any]:
    return {"id": s.id, "seek": s.seek, "start": round(s.start, 3), "end": round(s.end, 3), "text": s.text,
            "tokens": s.tokens, "temperature": s.temperature, "avg_logprob": s.avg_logprob,
            "compression_ratio": s.compression_ratio, "no_speech_prob": s.no_speech_prob}


def _stamp(seconds: float, sep: str) -> str:
    ms = round(seconds * 1000)
    h, rest = divmod(ms, 3_600_000)
    m, rest = divmod(rest, 60_000)
    s, ms = divmod(rest, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def srt(segments: list[Segment]) -> str:
    return "".join(f"{i}\n{_stamp(s.start, ',')} --> {_stamp(s.end, ',')}\n{s.text.strip()}\n\n"
                   for i, s in enumerate(segments, 1))


def vtt(segments: list[Segment]) -> str:
    return "WEBVTT\n\n" + "".join(f"{_stamp(s.start, '.')} --> {_stamp(s.end, '.')}\n{s.text.strip()}\n\n"
                                  for s in segments)


def sse(event: dict[str, Any]) -> bytes:
    """One server-sent event as OpenAI streams transcriptions: `data: {json}` and a blank line."""
    return b"data: " + json.dumps(event, ensure_ascii=False).encode() + b"\n\n"


def delta_event(delta: str) -> dict[str, Any]:
    return {"type": "transcript.text.delta", "delta": delta}


def done_event(text: str, duration_s: float) -> dict[str, Any]:
    return {"type": "transcript.text.done", "text": text, "usage": usage(duration_s)}
