"""Benchmark of the speech lanes: real-time factors (seconds of work per second of audio; under 1 is faster than
real time) of piper's own server synthesizing (the joe voice) and Blazar's whisper child transcribing (Systran's
faster-whisper-base) the clip piper made, each straight to the child, and with `--through URL` the same requests
through a Blazar gateway (/v1/audio/speech and /v1/audio/transcriptions), so the gateway's added time per request is
the difference of the medians.

    .venv/bin/python bench/speech.py [--runs 5] [--threads 2] [--json]
    .venv/bin/python bench/speech.py --through http://127.0.0.1:11434 --key KEY --stt-model whisper-base \\
        --tts-model joe
    .venv/bin/python bench/speech.py --gateway     # through a `blazar serve` of its own, in a temporary home

The children are started here, on loopback, on the models from the `speech-models` extra (assembled in a temporary
directory), and stopped at the end. Through Blazar, the gateway's own children serve (its models must exist).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from blazar.adapters.audio import PiperClient, SpeechEncoder, probe
from tests.support.serving import blazar_cli, free_port, healthy, stop_daemon
from tests.support.speech_children import piper_child, whisper_child
from tests.support.speech_models import joe_voice, whisper_base_dir

TEXT = ("Blazar is a control plane for local inference. It starts engines when a request needs one, keeps them "
        "while they are used, and tells you why each decision was made.")
TIMEOUT_S = 300.0


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def bench_piper(base_url: str, runs: int) -> tuple[dict[str, Any], bytes]:
    """Synthesize TEXT `runs` times straight to piper; the RTF and the last clip as WAV."""
    async def go() -> tuple[list[float], float, bytes]:
        client = PiperClient(base_url)
        times, wav, audio_s = [], b"", 0.0
        try:
            await client.synthesize("Warm up.")
            for _ in range(runs):
                t0 = time.perf_counter()
                said = await client.synthesize(TEXT)
                times.append(time.perf_counter() - t0)
                audio_s = said.duration_s
            enc = SpeechEncoder("wav", said.sample_rate)
            wav = enc.feed(said.pcm) + enc.finish()
        finally:
            await client.aclose()
        return times, audio_s, wav

    times, audio_s, wav = asyncio.run(go())
    return {"audio_s": round(audio_s, 3), "median_s": round(_median(times), 3),
            "rtf": round(_median(times) / audio_s, 4)}, wav


def _auth(key: str) -> dict[str, str]:
    """The key's header; none without a key (a gateway with no keys: auth off)."""
    return {"authorization": f"Bearer {key}"} if key else {}


def _transcribe(client: httpx.Client, url: str, key: str, model: str, wav: bytes) -> float:
    t0 = time.perf_counter()
    r = client.post(url + "/v1/audio/transcriptions", headers=_auth(key),
                    files={"file": ("clip.wav", wav, "audio/wav")}, data={"model": model})
    r.raise_for_status()
    return time.perf_counter() - t0


def bench_whisper(url: str, key: str, model: str, wav: bytes, runs: int) -> dict[str, Any]:
    audio_s = probe(wav).duration_s
    with httpx.Client(timeout=TIMEOUT_S, trust_env=False) as client:
        _transcribe(client, url, key, model, wav)  # warm up (and, through Blazar, load the model)
        times = [_transcribe(client, url, key, model, wav) for _ in range(runs)]
    return {"audio_s": round(audio_s, 3), "median_s": round(_median(times), 3),
            "rtf": round(_median(times) / audio_s, 4)}


def bench_speech_through(url: str, key: str, model: str, voice: str, runs: int) -> dict[str, Any]:
    """/v1/audio/speech through Blazar as WAV: time to the first byte and to the last, and the RTF."""
    first, total, audio_s = [], [], 0.0
    with httpx.Client(timeout=TIMEOUT_S, trust_env=False) as client:
        for i in range(runs + 1):
            t0 = time.perf_counter()
            body = b""
            t_first = None
            with client.stream("POST", url + "/v1/audio/speech", headers=_auth(key),
                               json={"model": model, "input": TEXT, "voice": voice, "response_format": "wav"}) as r:
                r.raise_for_status()
                for chunk in r.iter_bytes():
                    t_first = t_first or time.perf_counter() - t0
                    body += chunk
            if i == 0:
                continue  # warm up (the load)
            first.append(t_first or 0.0)
            total.append(time.perf_counter() - t0)
            audio_s = probe(body).duration_s
    return {"audio_s": round(audio_s, 3), "first_byte_s": round(_median(first), 3),
            "median_s": round(_median(total), 3), "rtf": round(_median(total) / audio_s, 4)}


@contextmanager
def own_gateway(work: Path, whisper_dir: Path, voice: Path) -> Iterator[str]:
    """`blazar serve` in a home of its own under `work` with the two models imported (no keys: auth off); its URL."""
    home = work / "gateway-home"
    blazar_cli(home, "import", str(whisper_dir), "--name", "whisper-base")
    blazar_cli(home, "import", str(voice), "--name", "joe")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "blazar.cli.main", "serve", "--port", str(port)],
                            env={**os.environ, "BLAZAR_HOME": str(home)}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not healthy(port):
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("the gateway did not start")
            time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_daemon(proc)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--threads", type=int, default=2, help="the whisper child's CPU threads")
    p.add_argument("--beam-size", type=int, default=5, help="the whisper child's beams per decode")
    p.add_argument("--through", help="a Blazar gateway's base URL: measure through it as well")
    p.add_argument("--gateway", action="store_true", help="measure through a `blazar serve` started here as well")
    p.add_argument("--key", default="", help="an API key of the gateway (with --through)")
    p.add_argument("--stt-model", default="whisper-base", help="the gateway's whisper model (with --through)")
    p.add_argument("--tts-model", default="joe", help="the gateway's piper voice model (with --through)")
    p.add_argument("--voice", default="joe", help="the `voice` field sent through the gateway")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()

    out: dict[str, Any] = {"runs": args.runs, "text_chars": len(TEXT), "whisper_threads": args.threads,
                           "beam_size": args.beam_size}
    with tempfile.TemporaryDirectory(prefix="blazar-bench-speech-") as tmp:
        work = Path(tmp)
        onnx, _ = joe_voice()
        with piper_child(onnx, work / "piper") as piper:
            out["piper_direct"], wav = bench_piper(piper.base_url, args.runs)
        with whisper_child(whisper_base_dir(work), work / "whisper", threads=args.threads,
                           beam_size=args.beam_size) as whisper:
            assert whisper.key is not None
            out["whisper_direct"] = bench_whisper(whisper.base_url, whisper.key, "whisper-1", wav, args.runs)
        if args.gateway:
            with own_gateway(work, whisper_base_dir(work), onnx) as url:
                _through(out, args, url, wav)
    if args.through:
        _through(out, args, args.through.rstrip("/"), wav)
    _print(out, as_json=args.json)
    return 0


def _through(out: dict[str, Any], args: argparse.Namespace, url: str, wav: bytes) -> None:
    out["whisper_through"] = bench_whisper(url, args.key, args.stt_model, wav, args.runs)
    out["whisper_added_s"] = round(out["whisper_through"]["median_s"] - out["whisper_direct"]["median_s"], 3)
    out["piper_through"] = bench_speech_through(url, args.key, args.tts_model, args.voice, args.runs)
    out["piper_added_s"] = round(out["piper_through"]["median_s"] - out["piper_direct"]["median_s"], 3)


def _print(out: dict[str, Any], *, as_json: bool) -> None:
    if as_json:
        print(json.dumps(out, indent=2))
    else:
        for name in ("piper_direct", "whisper_direct", "piper_through", "whisper_through"):
            if name in out:
                row = out[name]
                extra = f"  first byte {row['first_byte_s']} s" if "first_byte_s" in row else ""
                print(f"{name:16} audio {row['audio_s']:6.2f} s  median {row['median_s']:6.3f} s  "
                      f"RTF {row['rtf']:.3f}{extra}")
        for name in ("piper_added_s", "whisper_added_s"):
            if name in out:
                print(f"{name:16} {out[name]:+.3f} s per request")


if __name__ == "__main__":
    sys.exit(main())
