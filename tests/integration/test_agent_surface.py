"""The surface agents use, end to end against `blazar serve` with the real llama-server and Gemma 3 270M: the real
Claude Code CLI to an answer; output over the context bounded (not refused) through the openai, anthropic and
ollama SDKs, a prompt over it still a 400 in each dialect's shape; a client's hang-up one info line in the daemon's
output, never a traceback."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx2
import ollama
import openai
import pytest

from tests.support.agent_clients import agent_env, claude_code
from tests.support.blazar_home import read_events
from tests.support.daemon import wait_for
from tests.support.serving import blazar_cli, serving_gemma

MODEL = "gemma"
CTX = 512
# Claude Code 2.1's prompt (system text, tools, its system message at messages[1]) is about 2,950 tokens with this
# model, and it asks for max_tokens 32,000: more than the context holds, so it is bounded. The demo model is a base
# model that never ends its turn, and Claude Code continues a turn cut at max_tokens until the context is full (then
# the prompt no longer fits: a 400); so its variant stops at the end of a line, as a Modelfile's PARAMETER stop would.
CLAUDE_MODEL, CLAUDE_CTX = "gemma-claude", 4096
CLAUDE_PARAMETERS = {"num_ctx": CLAUDE_CTX, "stop": ["\n"], "temperature": 0}
BOUNDED = "x-blazar-max-tokens-bounded"
LONG = "word " * 440  # fits CTX, leaving a few dozen tokens for the answer
TOO_LONG = "word " * 700  # does not fit CTX at all


class Daemon:
    def __init__(self, home: Path, port: int, output: Path) -> None:
        self.home, self.port, self.output = home, port, output
        self.base = f"http://127.0.0.1:{port}"

    def events(self, *types: str) -> list[dict]:
        return read_events(self.home, *types)

    def event(self, kind: str, trace: str) -> dict:
        return wait_for(lambda: next((e["data"] for e in self.events(kind) if e["trace_id"] == trace), None),
                        f"{kind} of {trace}", timeout=30)

    def prompt_tokens(self, text: str) -> int:
        """The engine's own count of a one-message chat (the template applied): the same for every dialect."""
        r = httpx2.post(f"{self.base}/v1/messages/count_tokens", trust_env=False, timeout=120,
                        json={"model": MODEL, "messages": [{"role": "user", "content": text}]})
        assert r.status_code == 200, r.text
        return int(r.json()["input_tokens"])


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, engine_binary: Path, gemma_path: Path) -> Iterator[Daemon]:
    home = tmp_path_factory.mktemp("agents-home")
    output = home / "daemon-output.txt"
    settings = {"ctx": CTX, "slots": 1, "log_level": "info", "queue_timeout_s": 300}
    with serving_gemma(home, engine_binary, gemma_path, MODEL, settings, output=output) as (port, _):
        d = Daemon(home, port, output)
        r = httpx2.post(f"{d.base}/api/create", trust_env=False, timeout=60, json={
            "model": CLAUDE_MODEL, "from": MODEL, "parameters": CLAUDE_PARAMETERS, "stream": False})
        assert r.status_code == 200, r.text
        yield d


# -- Claude Code ----------------------------------------------------------------------------------------------------


def test_claude_code_answers_through_blazar(daemon: Daemon, tmp_path: Path) -> None:
    claude = claude_code()
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    env = {**agent_env(home), "ANTHROPIC_BASE_URL": daemon.base, "ANTHROPIC_API_KEY": "sk-local",
           "ANTHROPIC_AUTH_TOKEN": "sk-local", "ANTHROPIC_MODEL": CLAUDE_MODEL,
           "ANTHROPIC_SMALL_FAST_MODEL": CLAUDE_MODEL}
    done = subprocess.run([str(claude), "-p", "The capital of France is", "--model", CLAUDE_MODEL], cwd=work,
                          env=env, capture_output=True, text=True, timeout=480, check=False)
    assert done.returncode == 0, f"claude exited {done.returncode}: {done.stdout[-2000:]} {done.stderr[-2000:]}"
    assert done.stdout.strip()
    # What it sent went the whole way: the system message inside `messages`, its betas, its max_tokens of 32,000
    # bounded to what the model's context leaves.
    ours = [e for e in daemon.events("request.received")
            if e["data"]["route"] == "/v1/messages" and e["data"]["model"] == CLAUDE_MODEL]
    assert ours, "Claude Code's request is not in the log"
    trace = ours[-1]["trace_id"]
    assert ours[-1]["data"]["max_tokens"] == 32000
    bounded = daemon.event("request.bounded", trace)
    assert bounded["bounded_max_tokens"] == CLAUDE_CTX - bounded["prompt_tokens"] < 32000
    assert daemon.event("request.completed", trace)["status"] == 200


def test_the_anthropic_sdk_sends_what_claude_code_does(daemon: Daemon) -> None:
    """The beta client's anthropic-beta header, `?beta=true` (the TypeScript SDK's, which Claude Code uses),
    cache_control, a system message inside messages."""
    client = anthropic.Anthropic(base_url=daemon.base, api_key="unused", max_retries=0, timeout=120)
    raw = client.beta.messages.with_raw_response.create(
        model=MODEL, max_tokens=3, betas=["claude-code-20250219", "mid-conversation-system-2026-04-07"],
        system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        messages=[{"role": "user", "content": [{"type": "text", "text": "Hi", "cache_control": {"type": "ephemeral"}}]},
                  {"role": "system", "content": "Answer in French."},  # type: ignore[list-item]
                  {"role": "assistant", "content": "Bonjour"}, {"role": "user", "content": "Encore"}],
        extra_body={"context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}},
        thinking={"type": "disabled"}, metadata={"user_id": "someone"}, extra_query={"beta": "true"})
    assert raw.http_request.url.params.get("beta") == "true"
    msg = raw.parse()
    assert msg.content and msg.usage.input_tokens > 0
    with pytest.raises(anthropic.BadRequestError) as e:
        client.beta.messages.create(model=MODEL, max_tokens=3, betas=["files-api-2025-04-14"],
                                    messages=[{"role": "user", "content": "Hi"}])
    assert e.value.status_code == 400 and e.value.body["type"] == "error"
    assert e.value.body["error"]["type"] == "invalid_request_error"
    assert "files-api-2025-04-14" in e.value.body["error"]["message"]


# -- bounded output -------------------------------------------------------------------------------------------------


def test_openai_output_over_the_context_is_bounded(daemon: Daemon) -> None:
    n = daemon.prompt_tokens(LONG)
    assert n < CTX
    client = openai.OpenAI(base_url=f"{daemon.base}/v1", api_key="unused", max_retries=0, timeout=300)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": LONG}], max_tokens=4000, temperature=0)
    chat = raw.parse()
    assert raw.headers[BOUNDED] == str(CTX - n)
    assert chat.choices[0].finish_reason == "length"
    assert chat.usage is not None and chat.usage.prompt_tokens == n and 0 < chat.usage.completion_tokens <= CTX - n
    bounded = daemon.event("request.bounded", raw.headers["x-blazar-trace-id"])
    assert (bounded["prompt_tokens"], bounded["max_tokens"], bounded["bounded_max_tokens"], bounded["ctx_tokens"]) \
        == (n, 4000, CTX - n, CTX)
    # Streamed too: the header before the first chunk, `length` at the end.
    with client.chat.completions.with_streaming_response.create(
            model=MODEL, messages=[{"role": "user", "content": LONG}], max_completion_tokens=4000, temperature=0,
            stream=True) as streamed:
        assert streamed.headers[BOUNDED] == str(CTX - n)
        finishes = [c.choices[0].finish_reason for c in streamed.parse() if c.choices]
    assert finishes[-1] == "length"


def test_anthropic_output_over_the_context_is_bounded(daemon: Daemon) -> None:
    n = daemon.prompt_tokens(LONG)
    client = anthropic.Anthropic(base_url=daemon.base, api_key="unused", max_retries=0, timeout=300)
    raw = client.messages.with_raw_response.create(
        model=MODEL, max_tokens=32000, extra_body={"temperature": 0}, messages=[{"role": "user", "content": LONG}])
    msg = raw.parse()
    assert raw.headers[BOUNDED] == str(CTX - n)
    assert msg.stop_reason == "max_tokens" and 0 < msg.usage.output_tokens <= CTX - n
    with client.messages.stream(model=MODEL, max_tokens=32000, extra_body={"temperature": 0},
                                messages=[{"role": "user", "content": LONG}]) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "max_tokens"


def test_ollama_output_over_the_context_is_bounded(daemon: Daemon) -> None:
    n = daemon.prompt_tokens(LONG)
    client = ollama.Client(host=daemon.base, timeout=300, trust_env=False)
    answer = client.chat(model=MODEL, messages=[{"role": "user", "content": LONG}],
                         options={"num_predict": 4000, "temperature": 0})
    assert answer.done_reason == "length" and answer.eval_count is not None and 0 < answer.eval_count <= CTX - n
    parts = list(client.chat(model=MODEL, messages=[{"role": "user", "content": LONG}], stream=True,
                             options={"num_predict": 4000, "temperature": 0}))
    assert parts[-1].done and parts[-1].done_reason == "length"


def test_a_prompt_over_the_context_is_still_a_400_in_each_dialect(daemon: Daemon) -> None:
    with pytest.raises(openai.BadRequestError) as oe:
        openai.OpenAI(base_url=f"{daemon.base}/v1", api_key="unused", max_retries=0, timeout=120
                      ).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": TOO_LONG}],
                                                max_tokens=5)
    assert oe.value.body["code"] == "context_length_exceeded" and "never truncated" in oe.value.body["message"]
    with pytest.raises(anthropic.BadRequestError) as ae:
        anthropic.Anthropic(base_url=daemon.base, api_key="unused", max_retries=0, timeout=120).messages.create(
            model=MODEL, max_tokens=5, messages=[{"role": "user", "content": TOO_LONG}])
    assert ae.value.body["error"]["type"] == "invalid_request_error"
    assert f"context is {CTX} tokens" in ae.value.body["error"]["message"]
    with pytest.raises(ollama.ResponseError) as le:
        ollama.Client(host=daemon.base, timeout=120, trust_env=False).chat(
            model=MODEL, messages=[{"role": "user", "content": TOO_LONG}], options={"num_predict": 5})
    assert le.value.status_code == 400 and "never truncated" in le.value.error


def test_refuse_keeps_the_400_for_an_output_over_the_context(daemon: Daemon) -> None:
    blazar_cli(daemon.home, "config", "set", "inputs.max_tokens_over_context", "refuse")
    try:
        client = openai.OpenAI(base_url=f"{daemon.base}/v1", api_key="unused", max_retries=0, timeout=120)

        def refused() -> openai.BadRequestError | None:
            try:
                client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": LONG}],
                                               max_tokens=4000)
            except openai.BadRequestError as e:
                return e
            return None

        e = wait_for(refused, "the daemon to read max_tokens_over_context = refuse", timeout=60)
        assert e.body["code"] == "context_length_exceeded" and "4000 max_tokens" in e.body["message"]
    finally:
        blazar_cli(daemon.home, "config", "set", "inputs.max_tokens_over_context", "bound")


# -- quiet logs -----------------------------------------------------------------------------------------------------


def test_a_client_hang_up_is_one_info_line_mid_stream_or_before_the_answer(daemon: Daemon) -> None:
    def hang_ups() -> list[dict]:
        return [e["data"] for e in daemon.events("request.failed") if e["data"]["reason"] == "client_disconnected"]

    before, recorded = daemon.output.read_text().count("the client hung up"), len(hang_ups())
    ask = {"model": MODEL, "messages": [{"role": "user", "content": "Count"}], "max_tokens": 4000}  # ~500 bounded
    with httpx2.stream("POST", f"{daemon.base}/v1/chat/completions", trust_env=False, timeout=120,
                       json={**ask, "stream": True}) as r:
        streamed = r.headers["x-blazar-trace-id"]
        for line in r.iter_lines():
            if line.startswith("data: "):
                break  # the first chunk came: hang up mid-stream
    failed = daemon.event("request.failed", streamed)
    assert (failed["status"], failed["reason"]) == (499, "client_disconnected")
    # A whole answer's client gives up while it is generated.
    with pytest.raises(httpx2.TimeoutException):
        httpx2.post(f"{daemon.base}/v1/chat/completions", trust_env=False, timeout=1, json=ask)
    assert wait_for(lambda: len(hang_ups()) == recorded + 2, "the second hang-up recorded", timeout=30)

    def hang_up_lines() -> list[str]:
        return [ln for ln in daemon.output.read_text().splitlines() if "the client hung up" in ln][before:]

    lines = wait_for(lambda: len(hang_up_lines()) >= 2 and hang_up_lines(), "the hang-ups' log lines", timeout=10)
    time.sleep(0.5)  # anything the hang-ups would still log
    output = daemon.output.read_text()
    assert "Traceback" not in output and "CancelledError" not in output, output[-3000:]
    assert len(lines) == 2 and all(" INFO " in ln and "POST /v1/chat/completions" in ln for ln in lines)
