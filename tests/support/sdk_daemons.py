"""A running `blazar serve` as the SDK suites hold it: clients of the official SDKs, its home's events, the CLI on
its home; and the module-scoped fixtures that start one for a suite (`daemon = sdk_daemons.openai_daemon` in a test
module gives it its own daemon, started afresh for that module)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import ollama
import openai
import pytest

from tests.support.blazar_home import read_events
from tests.support.daemon import wait_for
from tests.support.serving import blazar_cli, serving_gemma

# The name the dialect suites import the real Gemma under (serving_gemma's `model`).
MODEL = "gemma"
# The OpenAI suites' daemon: its context, slots and queue (the tests of bounds and queueing read them).
SLOTS = 2
QUEUE_DEPTH = 2
CTX = 1024
# A question any model answers with a sentence (the variant suites' chats).
QUESTION = [{"role": "user", "content": "Write one sentence about the sea."}]


class OpenAIDaemon:
    """`blazar serve` on the real Gemma as the OpenAI suites hold it: SDK clients, and the log's events."""

    def __init__(self, home: Path, port: int, proc: subprocess.Popen) -> None:
        self.home, self.port, self.proc = home, port, proc
        self.base = f"http://127.0.0.1:{port}"

    def client(self, **kw) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base}/v1", api_key="unused", max_retries=0, timeout=120, **kw)

    def aclient(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.base}/v1", api_key="unused", max_retries=0, timeout=120)

    def events(self, *types: str) -> list[dict]:
        return read_events(self.home, *types)

    def trace(self, trace_id: str) -> list[str]:
        return [e["type"] for e in self.events() if e["trace_id"] == trace_id]

    def wait_trace(self, trace_id: str, last: str, timeout: float = 20) -> list[str]:
        """Request events are group-committed: wait until the trace's last event is in the log."""
        return wait_for(lambda: (t := self.trace(trace_id)) and t[-1] == last and t, f"{last} of {trace_id}",
                        timeout=timeout)


class OllamaDaemon:
    """`blazar serve` on the real Gemma as the Ollama suites hold it: the `ollama` SDK's client."""

    def __init__(self, home: Path, port: int, proc: subprocess.Popen) -> None:
        self.home, self.port, self.proc = home, port, proc
        self.base = f"http://127.0.0.1:{port}"

    def client(self) -> ollama.Client:
        return ollama.Client(host=self.base, timeout=120, trust_env=False)


class VariantsDaemon:
    """`blazar serve` on the pulled demo model as the variant and LoRA suites hold it: the `ollama` and `openai`
    clients, the CLI on its home, the events' data, and the prompt tokens the engine counted for a chat."""

    def __init__(self, home: Path, port: int) -> None:
        self.home, self.port = home, port
        self.base = f"http://127.0.0.1:{port}"

    def ollama(self) -> ollama.Client:
        return ollama.Client(host=self.base, timeout=180, trust_env=False)

    def openai(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base}/v1", api_key="unused", timeout=180, max_retries=0)

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        return blazar_cli(self.home, *args)

    def events(self, type_: str) -> list[dict]:
        lines = self.cli("events", "--type", type_, "--json").stdout.splitlines()
        return [json.loads(line)["data"] for line in lines if line.strip()]

    def prompt_tokens(self, model: str, messages: list[dict] | None = None, **options: object) -> int:
        r = self.ollama().chat(model=model, messages=messages or QUESTION, options={"num_predict": 1, **options})
        assert r.prompt_eval_count
        return r.prompt_eval_count


@pytest.fixture(scope="module")
def openai_daemon(tmp_path_factory: pytest.TempPathFactory, engine_binary: Path, gemma_path: Path
                  ) -> Iterator[OpenAIDaemon]:
    """The OpenAI suites' daemon: the real Gemma as MODEL, CTX, SLOTS and QUEUE_DEPTH."""
    home = tmp_path_factory.mktemp("openai-home")
    settings = {"ctx": CTX, "slots": SLOTS, "queue_depth": QUEUE_DEPTH, "queue_timeout_s": 60}
    with serving_gemma(home, engine_binary, gemma_path, MODEL, settings) as (port, proc):
        yield OpenAIDaemon(home, port, proc)


@pytest.fixture(scope="module")
def ollama_daemon(tmp_path_factory: pytest.TempPathFactory, engine_binary: Path, gemma_path: Path
                  ) -> Iterator[OllamaDaemon]:
    """The Ollama suites' daemon: the real Gemma as MODEL, a 1024-token context."""
    home = tmp_path_factory.mktemp("ollama-home")
    with serving_gemma(home, engine_binary, gemma_path, MODEL, {"ctx": 1024}) as (port, proc):
        yield OllamaDaemon(home, port, proc)
