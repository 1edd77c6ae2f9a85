"""A running `blazar serve` with the three models a realtime voice session runs on: the real Gemma 3 270M (chat),
Blazar's whisper child on faster-whisper-base (hearing) and piper's joe voice (speaking), keys on. One per test
module (`voice = voice_daemon.voice_daemon` in a module gives it its own); the realtime voice suites share one
module, tests/integration/test_realtime_voice.py, so the daemon and its three children start once."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.support.blazar_home import read_events
from tests.support.daemon import start_serve, wait_for
from tests.support.homes import model_home
from tests.support.serving import blazar_cli, free_port, healthy, stop_daemon

STT = "whisper-base"
TTS = "joe"
CHAT = "gemma3-270m"
PROFILE = "desk"  # a realtime profile over the three
WAIT_S = 180.0  # a cold start of a child plus a transcription on two shared cores
# The keys the suites use: every model; the chat model only (no scope for the voice's speech models).
KEYS: dict[str, tuple[str, ...]] = {"all": (), "chat-only": ("--models", CHAT)}


class VoiceDaemon:
    def __init__(self, home: Path, port: int, proc: subprocess.Popen[bytes]) -> None:
        self.home, self.port, self.proc = home, port, proc
        self.base = f"http://127.0.0.1:{port}"
        self.secrets: dict[str, str] = {}

    def client(self, key: str = "all") -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base}/v1", api_key=self.secrets[key], max_retries=0, timeout=WAIT_S)

    def aclient(self, key: str = "all") -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.base}/v1", api_key=self.secrets[key], max_retries=0,
                                  timeout=WAIT_S)

    def events(self, *types: str) -> list[dict[str, Any]]:
        return read_events(self.home, *types)

    def cli(self, *args: str, check: bool = True, timeout: float = WAIT_S) -> subprocess.CompletedProcess[str]:
        return blazar_cli(self.home, *args, check=check, timeout=timeout)

    def key(self, name: str, *args: str) -> str:
        """A new key (its secret), made through the CLI."""
        self.secrets[name] = json.loads(self.cli("keys", "create", name, *args, "--json").stdout)["secret"]
        return self.secrets[name]


@pytest.fixture(scope="module")
def voice_daemon(tmp_path_factory: pytest.TempPathFactory, whisper_base: Path, joe: tuple[Path, Path],
                 gemma_path: Path, engine_binary: Path) -> Iterator[VoiceDaemon]:
    home = tmp_path_factory.mktemp("voice-home")
    # The engine installed and Gemma imported with its template probe recorded (a first load that probes would
    # take minutes on two loaded cores), cloned from the session's home of that kind.
    model_home(home, engine_binary, gemma_path, CHAT)
    blazar_cli(home, "import", str(whisper_base), "--name", STT)
    blazar_cli(home, "import", str(joe[0]), "--name", TTS)
    blazar_cli(home, "realtime", "set", PROFILE, "--stt", STT, "--llm", CHAT, "--tts", TTS)
    port = free_port()
    log = home.parent / f"{home.name}-daemon.log"
    proc = start_serve(home, "--port", str(port), log=log)
    try:
        try:
            wait_for(lambda: healthy(port), "/health", proc=proc)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{log.read_text(errors='replace')[-8000:]}") from None
        d = VoiceDaemon(home, port, proc)
        for name, args in KEYS.items():
            d.key(name, *args)
        yield d
    finally:
        stop_daemon(proc)
