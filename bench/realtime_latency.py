"""Benchmark: how soon a voice answer starts after the user stops speaking, through one Realtime session
(/v1/realtime, server VAD, spoken output) and through Blazar's separate routes chained by a client.

Both lanes hear the same questions (spoken once by the piper voice through /v1/audio/speech as PCM16 24 kHz, before
anything is measured) and answer with the same models, instructions and `max_output_tokens`. The end of speech is
where the question's last 10 ms frame louder than -40 dBFS ends. Each time is in ms from the end of speech to:

    decided      the turn's end is known: `input_audio_buffer.speech_stopped` (realtime); chained, the client's own
                 VAD waits `--silence-ms` (500, the server VAD's default `silence_duration_ms`), added as a constant
    transcribed  `conversation.item.input_audio_transcription.completed` (the session asks for input transcription
                 with `--stt` as its model); chained, the /v1/audio/transcriptions answer (the utterance as WAV, with
                 the silence the client's VAD heard). `--language` tells whisper the language in both lanes.
    first_token  the first `response.output_audio_transcript.delta` (or `response.output_text.delta`); chained, the
                 first delta of the streamed /v1/chat/completions
    first_audio  the first `response.output_audio.delta`; chained, the first byte of /v1/audio/speech (pcm) asked
                 with the answer's first sentence as soon as it ends (the chat stream closed there)

Realtime: the question is streamed into one session in 20 ms `input_audio_buffer.append`s paced by the clock (a
microphone), silence after it (the microphone stays open), server VAD with its defaults; each turn's response runs
to `response.done`, then its two items are deleted, so every turn's prompt is the instructions and one question, as
the chained lane's is. A warm-up turn per lane (`--warmup`) loads the three models and is not counted.

    .venv/bin/python bench/realtime_latency.py [--turns 20] [--json] [--out FILE]     # its own `blazar serve`
    .venv/bin/python bench/realtime_latency.py --through URL --key KEY --profile P --stt M --llm M --tts M

On its own it starts `blazar serve` in a temporary home (no keys) with llama-server from --server (or
BLAZAR_TEST_ENGINE), the demo model (gemma3-270m), faster-whisper-base (whisper-base) and the joe voice (joe) from
their packages, and the realtime profile `desk` over the three. Exit 0 when every lane was measured, 2 when one was
refused (the server's `error` is in the report, e.g. `audio_not_supported`)."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

# Sibling scripts, not packages (bench/ is on the path above).
from realtime_latency_home import own_daemon
from realtime_latency_lanes import METRICS, ChainedLane, LaneRefused, Question, RealtimeLane, prepare_questions

QUESTIONS = (
    "What is the capital of France?",
    "How many legs does a spider have?",
    "Why is the sky blue?",
    "What is the boiling point of water?",
    "Who wrote Romeo and Juliet?",
    "How far away is the moon?",
    "What do bees make?",
    "Which planet is the largest?",
    "How many days are in a leap year?",
    "What colour are bananas?",
)
INSTRUCTIONS = "Answer in one short sentence."
# Per lane, beside the four: the server VAD's hangover in audio time (realtime), the first sentence's end (chained).
EXTRAS = ("vad_hangover_audio_ms", "sentence_ms")
TARGET_MS = 1500.0
TARGET_RATIO = 1.5


def p95(xs: list[float]) -> float:
    """Nearest rank: the smallest value at or above 95% of the turns (the worst of fewer than 20)."""
    s = sorted(xs)
    return s[max(0, math.ceil(0.95 * len(s)) - 1)]


def steps(row: dict[str, Any]) -> dict[str, float | None]:
    """A turn's time split into its steps: each metric less the one before it (None where one is missing)."""
    out: dict[str, float | None] = {}
    before: float | None = 0.0
    for m in METRICS:
        now = row.get(m)
        out[f"step_{m}"] = round(now - before, 1) if now is not None and before is not None else None
        before = now if now is not None else before
    return out


def summary(turns: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    out = {}
    turns = [{**t, **steps(t)} for t in turns]
    for m in (*METRICS, *EXTRAS, *(f"step_{m}" for m in METRICS)):
        xs = [t[m] for t in turns if t.get(m) is not None]
        if xs:
            out[m] = {"median": round(statistics.median(xs), 1), "p95": round(p95(xs), 1)}
    return out


def progress(what: str) -> None:
    """A line on stderr as the run goes (a run of 20 turns per lane takes minutes)."""
    print(f"{time.strftime('%H:%M:%S')} {what}", file=sys.stderr, flush=True)


async def run_lane(name: str, lane: Any, questions: list[Question], turns: int, warmup: int) -> dict[str, Any]:
    done: list[dict[str, Any]] = []
    try:
        async with lane:
            for i in range(warmup + turns):
                row = await lane.turn(questions[i % len(questions)])
                which = f"warm-up {i + 1}" if i < warmup else f"turn {i + 1 - warmup}/{turns}"
                progress(f"{name} {which}: first audio {row['first_audio']} ms after the end of speech")
                if i >= warmup:
                    done.append(row)
    except LaneRefused as e:
        return {"error": {"code": e.code, "message": e.message}}
    return {"turns": done, "summary": summary(done)}


async def measure(args: argparse.Namespace, url: str, key: str) -> dict[str, Any]:
    questions = await prepare_questions(url, key, args.tts, QUESTIONS[:max(1, min(args.turns, len(QUESTIONS)))])
    progress(f"{len(questions)} questions spoken by {args.tts}")
    report: dict[str, Any] = {
        "machine": {"cores": os.cpu_count(), "processor": platform.processor() or platform.machine()},
        "turns": args.turns, "warmup": args.warmup, "max_output_tokens": args.max_tokens,
        "silence_ms": args.silence_ms, "language": args.language, "instructions": INSTRUCTIONS,
        "models": {"profile": args.profile, "stt": args.stt, "llm": args.llm, "tts": args.tts}}
    if "realtime" in args.lanes:
        lane = RealtimeLane(url, key, args.profile, INSTRUCTIONS, args.max_tokens, args.stt, args.language)
        report["realtime"] = await run_lane("realtime", lane, questions, args.turns, args.warmup)
    if "chained" in args.lanes:
        chained = ChainedLane(url, key, args.stt, args.llm, args.tts, INSTRUCTIONS, args.max_tokens, args.silence_ms,
                              args.language)
        report["chained"] = await run_lane("chained", chained, questions, args.turns, args.warmup)
    rt = report.get("realtime", {}).get("summary", {}).get("first_audio")
    ch = report.get("chained", {}).get("summary", {}).get("first_audio")
    if rt:
        report["targets"] = {"first_audio_ms": TARGET_MS, "ratio": TARGET_RATIO,
                             "median_met": rt["median"] <= TARGET_MS, "p95_met": rt["p95"] <= TARGET_MS}
        if ch:
            report["ratio"] = round(ch["median"] / rt["median"], 2)
            report["targets"]["ratio_met"] = report["ratio"] >= TARGET_RATIO
    return report


def table(report: dict[str, Any]) -> str:
    lines = [f"machine: {report['machine']['cores']} cores, {report['machine']['processor']}; "
             f"{report['turns']} turns, max_output_tokens {report['max_output_tokens']}",
             "ms after the end of speech, median / p95 (steps: each column less the one before it):",
             f"{'lane':15} " + " ".join(f"{m:>15}" for m in METRICS)]
    for lane in ("realtime", "chained"):
        if lane not in report:
            continue
        if "error" in report[lane]:
            lines.append(f"{lane:15} refused: {report[lane]['error']['code']}: {report[lane]['error']['message']}")
            continue
        s = report[lane]["summary"]
        for label, keys in (("", METRICS), (" steps", [f"step_{m}" for m in METRICS])):
            lines.append(f"{lane + label:15} " + " ".join(
                f"{s[m]['median']:>7.0f} / {s[m]['p95']:<5.0f}" if m in s else f"{'-':>15}" for m in keys))
    if "targets" in report:
        t = report["targets"]
        lines.append(f"target first audio <= {TARGET_MS:.0f} ms: median {'met' if t['median_met'] else 'NOT met'}, "
                     f"p95 {'met' if t['p95_met'] else 'NOT met'}")
    if "ratio" in report:
        met = "met" if report["targets"]["ratio_met"] else "NOT met"
        lines.append(f"chained / realtime first audio (medians): {report['ratio']}x (target >= {TARGET_RATIO}x: {met})")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--turns", type=int, default=20)
    p.add_argument("--warmup", type=int, default=1, help="unmeasured turns per lane first (models loaded)")
    p.add_argument("--max-tokens", type=int, default=40, help="max_output_tokens / max_tokens of each answer")
    p.add_argument("--silence-ms", type=int, default=500, help="the chained client's VAD wait after speech")
    p.add_argument("--language", help="the questions' language, told to whisper in both lanes (default: detected)")
    p.add_argument("--lanes", default="realtime,chained", help="which lanes, comma-separated")
    p.add_argument("--through", help="a running gateway's base URL (else a `blazar serve` of its own)")
    p.add_argument("--key", default="", help="an API key of the gateway (with --through)")
    p.add_argument("--profile", default="desk", help="the realtime session's model (a realtime profile)")
    p.add_argument("--stt", default="whisper-base")
    p.add_argument("--llm", default="gemma3-270m")
    p.add_argument("--tts", default="joe")
    p.add_argument("--server", type=Path, help="llama-server for its own gateway (default: BLAZAR_TEST_ENGINE)")
    p.add_argument("--json", action="store_true", help="the report as JSON on stdout instead of the table")
    p.add_argument("--out", type=Path, help="write the report as JSON here too")
    args = p.parse_args()
    args.lanes = [x.strip() for x in args.lanes.split(",") if x.strip()]
    if args.turns < 1 or not set(args.lanes) <= {"realtime", "chained"} or not args.lanes:
        p.error("--turns is 1 or more; --lanes names realtime and/or chained")
    if args.through:
        report = asyncio.run(measure(args, args.through.rstrip("/"), args.key))
    else:
        server = args.server or Path(os.environ.get("BLAZAR_TEST_ENGINE", ""))
        if not server.is_file():
            p.error("no llama-server: pass --server PATH or set BLAZAR_TEST_ENGINE")
        with own_daemon(server, args.profile, args.stt, args.llm, args.tts) as url:
            report = asyncio.run(measure(args, url, ""))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2) if args.json else table(report))
    refused = [lane for lane in args.lanes if "error" in report[lane]]
    for lane in refused:
        print(f"{lane}: refused: {report[lane]['error']['code']}: {report[lane]['error']['message']}",
              file=sys.stderr)
    return 2 if refused else 0


if __name__ == "__main__":
    sys.exit(main())
