"""The speech children run by hand: Blazar's whisper child (`python -m blazar.children.whisper`) and piper's own HTTP
server, each on a free loopback port, waited for with a deadline and killed on the way out (terminate, then kill).
Used by tests/integration/test_speech_children.py and bench/speech.py, which test the adapters and the children
themselves. NOTE: the supervisor runs piper on a Unix socket in the home's run/ and on no port (it checks no key:
blazar/adapters/engines/kinds.py); tests/integration/test_engine_kinds.py and test_errors_to_keys.py test that."""

from __future__ import annotations

import contextlib
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from blazar.adapters.engines.process import free_port

LOAD_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Child:
    base_url: str
    key: str | None
    proc: subprocess.Popen[bytes]
    log: Path

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""


def _wait(child: Child, path: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if child.proc.poll() is not None:
            raise AssertionError(f"the child exited ({child.proc.returncode}) before it was ready:\n"
                                 f"{child.log_tail()}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(child.base_url + path, timeout=2, trust_env=False).status_code == 200:
                return
        time.sleep(0.1)
    raise AssertionError(f"the child was not ready in {timeout_s} s:\n{child.log_tail()}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@contextlib.contextmanager
def whisper_child(model_dir: Path, workdir: Path, *, threads: int = 2, max_bytes: int | None = None,
                  wait: bool = True, beam_size: int | None = None) -> Iterator[Child]:
    """The whisper child on `model_dir`, with a fresh key in `workdir`; ready (GET /health 200) unless `wait` is
    False."""
    workdir.mkdir(parents=True, exist_ok=True)
    key = secrets.token_urlsafe(24)
    key_file = workdir / "whisper.key"
    key_file.write_text(key + "\n")
    port = free_port()
    argv = [sys.executable, "-m", "blazar.children.whisper", "--model", str(model_dir), "--host", "127.0.0.1",
            "--port", str(port), "--api-key-file", str(key_file), "--threads", str(threads)]
    if max_bytes is not None:
        argv += ["--max-bytes", str(max_bytes)]
    if beam_size is not None:
        argv += ["--beam-size", str(beam_size)]
    log = workdir / f"whisper-{port}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=workdir)
    child = Child(f"http://127.0.0.1:{port}", key, proc, log)
    try:
        if wait:
            _wait(child, "/health", LOAD_TIMEOUT_S)
        yield child
    finally:
        _stop(proc)


@contextlib.contextmanager
def piper_child(onnx: Path, workdir: Path) -> Iterator[Child]:
    """piper's own server on the voice, bound to loopback (its default is every address), in `workdir` (it lists
    the voices in its working directory). It loads the voice before it listens: ready when /info answers."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = workdir / f"piper-{port}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "piper.http_server", "-m", str(onnx), "--host", "127.0.0.1",
                                 "--port", str(port)], stdout=out, stderr=subprocess.STDOUT, cwd=workdir)
    child = Child(f"http://127.0.0.1:{port}", None, proc, log)
    try:
        _wait(child, "/info", LOAD_TIMEOUT_S)
        yield child
    finally:
        _stop(proc)


def word_errors(expected: str, heard: str) -> tuple[int, int]:
    """(word-level edit distance, words expected), case and punctuation aside: what "at most one word in ten
    wrong" measures."""
    def words(s: str) -> list[str]:
        return "".join(c.lower() if c.isalnum() or c.isspace() else " " for c in s).split()

    ref, hyp = words(expected), words(heard)
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[len(hyp)], len(ref)
