"""Benchmark of the speech lanes through Blazar against the same children called straight: speech to text (the
whisper child, faster-whisper-base) and text to speech (piper's server, the joe voice), interleaved request by
request so both lanes see the same machine. Reported: each lane's real-time factor (processing seconds per second of
audio), the time to the first audio byte of speech, and the gateway's added milliseconds per request (the median
through Blazar minus the median straight to the child).

The straight lanes are children this script starts itself with the same argv as the supervisor's
(blazar/adapters/engines/kinds.py); the Blazar lanes are `blazar serve` in a temporary home with both models imported
from their PyPI packages (the speech-models extra), reached through the openai routes with httpx.

Run: `.venv/bin/python bench/speech_gateway.py [--rounds 5] [--threads N] [--out FILE]`.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import wave
from pathlib import Path
from typing import Any

import httpx2

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.support.speech_models import joe_voice, whisper_base_dir  # noqa: E402

TEXT = ("Hello from Blazar, this is a test. The quick brown fox jumps over the lazy dog. Speech is made sentence by "
        "sentence, and each sentence is sent as soon as it is encoded.")
KEY = "bench-whisper-key-0123456789abcdef"
TIMEOUT = httpx2.Timeout(300.0, connect=10.0)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(url: str, proc: subprocess.Popen[bytes], what: str, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited ({proc.returncode}) before it was ready")
        try:
            if httpx2.get(url, timeout=2, trust_env=False).status_code == 200:
                return
        except httpx2.TransportError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{what} was not ready after {timeout_s:.0f} s")


def blazar(home: Path, *args: str) -> str:
    env = {**os.environ, "BLAZAR_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "blazar.cli.main", *args], env=env, check=True,
                          capture_output=True, text=True).stdout


def wav_seconds(data: bytes) -> float:
    with wave.open(io.BytesIO(data)) as w:
        return w.getnframes() / w.getframerate()


def timed_post(http: httpx2.Client, url: str, **kw: Any) -> tuple[float, float, bytes]:
    """(seconds to the first body byte, seconds to the last, the body) of one streamed POST."""
    start = time.perf_counter()
    first = None
    chunks = []
    with http.stream("POST", url, **kw) as r:
        if r.status_code != 200:
            raise SystemExit(f"{url} answered {r.status_code}: {r.read()[:300]!r}")
        for chunk in r.iter_bytes():
            if first is None:
                first = time.perf_counter() - start
            chunks.append(chunk)
    return first or 0.0, time.perf_counter() - start, b"".join(chunks)


def median_ms(xs: list[float]) -> float:
    return round(statistics.median(xs) * 1000, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="the whisper children's threads (default: theirs)")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="blazar-speech-bench-"))
    whisper_dir = whisper_base_dir(tmp / "models")
    onnx, _ = joe_voice()
    home = tmp / "home"
    blazar(home, "import", str(whisper_dir), "--name", "whisper-base")
    blazar(home, "import", str(onnx), "--name", "joe")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        port = free_port()
        env = {**os.environ, "BLAZAR_HOME": str(home)}
        procs.append(subprocess.Popen([sys.executable, "-m", "blazar.cli.main", "serve", "--port", str(port)],
                                      env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        gateway = f"http://127.0.0.1:{port}"
        wait_ready(gateway + "/health", procs[-1], "blazar serve")

        key_file = tmp / "whisper.key"
        key_file.write_text(KEY)
        key_file.chmod(0o600)
        w_port, p_port = free_port(), free_port()
        argv = [sys.executable, "-m", "blazar.children.whisper", "--model", str(whisper_dir), "--host", "127.0.0.1",
                "--port", str(w_port), "--api-key-file", str(key_file)]
        if args.threads:
            argv += ["--threads", str(args.threads)]
        procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_ready(f"http://127.0.0.1:{w_port}/health", procs[-1], "the whisper child")
        procs.append(subprocess.Popen([sys.executable, "-m", "piper.http_server", "-m", str(onnx), "--host",
                                       "127.0.0.1", "--port", str(p_port)], cwd=onnx.parent,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_ready(f"http://127.0.0.1:{p_port}/info", procs[-1], "the piper server")

        http = httpx2.Client(trust_env=False, timeout=TIMEOUT)
        speech_body = json.dumps({"model": "joe", "voice": "joe", "input": TEXT, "response_format": "wav"})
        # Warm both lanes (the gateway loads its children on first use) and make the clip to transcribe.
        timed_post(http, gateway + "/v1/audio/speech", content=speech_body,
                                headers={"content-type": "application/json"})
        _, _, straight_clip = timed_post(http, f"http://127.0.0.1:{p_port}/synthesize",
                                         content=json.dumps({"text": TEXT}),
                                         headers={"content-type": "application/json"})
        clip_s = wav_seconds(straight_clip)
        form = {"model": "whisper-base", "response_format": "json"}
        files = {"file": ("clip.wav", straight_clip, "audio/wav")}
        timed_post(http, gateway + "/v1/audio/transcriptions", data=form, files=files)

        lanes: dict[str, list[float]] = {k: [] for k in ("stt_blazar", "stt_child", "tts_blazar", "tts_child",
                                                         "tts_first_blazar", "tts_first_child")}
        for _ in range(args.rounds):
            lanes["stt_child"].append(timed_post(http, f"http://127.0.0.1:{w_port}/v1/audio/transcriptions",
                                                 data=form, files=files,
                                                 headers={"authorization": f"Bearer {KEY}"})[1])
            lanes["stt_blazar"].append(timed_post(http, gateway + "/v1/audio/transcriptions", data=form,
                                                  files=files)[1])
            first, total, _ = timed_post(http, f"http://127.0.0.1:{p_port}/synthesize",
                                         content=json.dumps({"text": TEXT}),
                                         headers={"content-type": "application/json"})
            lanes["tts_first_child"].append(first)
            lanes["tts_child"].append(total)
            first, total, made = timed_post(http, gateway + "/v1/audio/speech", content=speech_body,
                                            headers={"content-type": "application/json"})
            lanes["tts_first_blazar"].append(first)
            lanes["tts_blazar"].append(total)
        made_s = len(made) / 2 / 24_000  # a streamed 24 kHz s16 WAV: its header is 44 bytes, negligible here
        res = {
            "rounds": args.rounds, "clip_seconds": round(clip_s, 3), "speech_seconds": round(made_s, 3),
            "cpus": os.cpu_count(),
            "stt": {"child_ms": median_ms(lanes["stt_child"]), "blazar_ms": median_ms(lanes["stt_blazar"]),
                    "added_ms": round(median_ms(lanes["stt_blazar"]) - median_ms(lanes["stt_child"]), 1),
                    "rtf_child": round(statistics.median(lanes["stt_child"]) / clip_s, 3),
                    "rtf_blazar": round(statistics.median(lanes["stt_blazar"]) / clip_s, 3)},
            "tts": {"child_ms": median_ms(lanes["tts_child"]), "blazar_ms": median_ms(lanes["tts_blazar"]),
                    "added_ms": round(median_ms(lanes["tts_blazar"]) - median_ms(lanes["tts_child"]), 1),
                    "first_byte_child_ms": median_ms(lanes["tts_first_child"]),
                    "first_byte_blazar_ms": median_ms(lanes["tts_first_blazar"]),
                    "rtf_child": round(statistics.median(lanes["tts_child"]) / clip_s, 3),
                    "rtf_blazar": round(statistics.median(lanes["tts_blazar"]) / made_s, 3)},
        }
        print(json.dumps(res, indent=2))
        if args.out is not None:
            args.out.write_text(json.dumps(res, indent=2) + "\n")
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    main()
