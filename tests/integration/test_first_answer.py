"""The first answer a newcomer sees, on the real engine and the real Gemma 3 270M base model: `blazar run` continues
the prompt as text (and says so in one line), and a GGUF with no chat template chats with the template its probe chose
(the plain transcript, not Gemma's turns it never ends, nor llama-server's ChatML fallback), as `blazar show` and
/api/show say. (The probe itself, on a first load: tests/integration/test_template_probe.py.)"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest

from blazar.serving.loop_guard import SPAN_CHARS
from blazar.store.turn_formats import TRANSCRIPT
from tests.support.blazar_home import read_events
from tests.support.daemon import free_port, stop_home_daemon
from tests.support.serving import blazar_cli, serving_gemma

MODEL = "gemma"
CHATML = ("<|im_start|>", "<|im_end|>")
BASE_LINE = "is a base model"


@pytest.fixture(scope="module")
def run_home(tmp_path_factory: pytest.TempPathFactory, engine_binary: Path, gemma_path: Path) -> Iterator[Path]:
    """A home with the real engine and the demo GGUF imported; `blazar run` starts its daemon, stopped at the end."""
    home = tmp_path_factory.mktemp("first-answer")
    blazar_cli(home, "engine", "install", "--path", str(engine_binary))
    blazar_cli(home, "import", str(gemma_path), "--name", MODEL)
    for key, value in (("ctx", 1024), ("port", free_port())):
        blazar_cli(home, "config", "set", key, str(value))
    try:
        yield home
    finally:
        stop_home_daemon(home)


def test_run_on_the_base_model_continues_the_text_and_says_so_in_one_line(run_home: Path) -> None:
    prompt = "Once upon a time, in a small village by the sea,"
    r = blazar_cli(run_home, "run", MODEL, prompt, "--max-tokens", "20", "--temperature", "0")
    said = [line for line in r.stderr.splitlines() if BASE_LINE in line]
    assert len(said) == 1 and "continues your text" in said[0], r.stderr
    assert r.stdout.startswith(prompt)  # the continuation reads on from the prompt
    continued = r.stdout[len(prompt):].strip()
    assert len(continued.split()) >= 5 and not continued.startswith(prompt), r.stdout
    # Through the completion route: the whole answer is a text completion.
    j = json.loads(blazar_cli(run_home, "run", MODEL, prompt, "--max-tokens", "5", "--json").stdout)
    assert j["object"] == "text_completion" and j["choices"][0]["text"]


def test_run_with_chat_sends_a_chat_turn_to_the_base_model_anyway(run_home: Path) -> None:
    r = blazar_cli(run_home, "run", MODEL, "Hello", "--max-tokens", "5", "--chat", "--json")
    assert BASE_LINE not in r.stderr
    assert json.loads(r.stdout)["object"] == "chat.completion"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, engine_binary: Path, gemma_path: Path
           ) -> Iterator[tuple[Path, str]]:
    home = tmp_path_factory.mktemp("arch-template")
    with serving_gemma(home, engine_binary, gemma_path, MODEL, {"ctx": 1024}, template=None) as (port, _):
        yield home, f"http://127.0.0.1:{port}"


def test_a_gguf_without_a_template_chats_with_the_template_its_probe_chose(served: tuple[Path, str]) -> None:
    home, base = served
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", http_client=openai.DefaultHttpxClient(
        trust_env=False))
    answer = client.chat.completions.create(model=MODEL, max_tokens=40, temperature=0, messages=[
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the capital of France?"}])
    text = answer.choices[0].message.content or ""
    assert not any(marker in text for marker in CHATML), text  # ChatML's markers were the fallback's tell
    # The answer ended where the next turn would begin (the template's stop strings), not at max_tokens.
    assert answer.choices[0].finish_reason == "stop" and "User:" not in text
    # The engine was given the probe's choice, the plain transcript, as a file.
    argv = (home / "templates").glob("*.jinja")
    assert any(p.read_text() == TRANSCRIPT.jinja for p in argv)


def test_a_chat_that_sets_no_temperature_gets_the_probes_greedy_answer(served: tuple[Path, str]) -> None:
    client = openai.OpenAI(base_url=f"{served[1]}/v1", api_key="none", http_client=openai.DefaultHttpxClient(
        trust_env=False))
    messages: list[Any] = [{"role": "user", "content": "Tell me a story about a dragon."}]
    greedy = client.chat.completions.create(model=MODEL, max_tokens=24, temperature=0, messages=messages)
    unset = [client.chat.completions.create(model=MODEL, max_tokens=24, messages=messages) for _ in range(2)]
    assert [a.choices[0].message.content for a in unset] == [greedy.choices[0].message.content] * 2
    # A temperature the request sets is its own: the engine samples (seeded, so the test does not depend on luck).
    hot = {client.chat.completions.create(model=MODEL, max_tokens=24, messages=messages, temperature=1.5,
                                          seed=seed).choices[0].message.content for seed in (1, 2, 3)}
    assert hot != {greedy.choices[0].message.content}


@pytest.mark.slow(reason="a greedy loop decoded on the real engine until the guard ends it: up to ~450 tokens")
def test_a_streamed_answer_that_loops_is_stopped_where_the_loop_is_found(served: tuple[Path, str]) -> None:
    # Greedy, the base model answers "la la la la" in a loop until its context is full; the loop guard ends it
    # (blazar/serving/loop_guard.py; every dialect's shape of the stop: tests/integration/test_loop_guard.py).
    home, base = served
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=300,
                           http_client=openai.DefaultHttpxClient(trust_env=False))
    asked = 1000  # the context (1024) holds it: unguarded, the loop would run to it
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, max_tokens=asked, stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "la la la la"}])
    trace = raw.headers["x-blazar-trace-id"]
    text, finish, usage = [], None, None
    for chunk in raw.parse():
        if chunk.choices:
            text.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
        usage = chunk.usage or usage
    said = "".join(text)
    assert finish == "stop", said
    assert usage is not None and usage.completion_tokens < asked, usage
    (stop,) = [e["data"] for e in read_events(home, "request.loop_stopped") if e["trace_id"] == trace]
    assert stop["completion_tokens"] == usage.completion_tokens
    # What it ended in ("la" over and over, or a digit: the greedy answer depends on what the slot held before) is
    # one piece, said at least three times over its last SPAN_CHARS characters.
    tail = " ".join(said.split())[-stop["span_chars"]:]
    piece = stop["period_chars"]
    assert len(tail) == stop["span_chars"] >= max(SPAN_CHARS, 3 * piece) and tail[piece:] == tail[:-piece], said
    (done,) = [e["data"] for e in read_events(home, "request.completed") if e["trace_id"] == trace]
    assert done["finish_reason"] == "stop" and done["completion_tokens"] == usage.completion_tokens


def test_show_says_which_template_and_where_it_comes_from(served: tuple[Path, str]) -> None:
    home, base = served
    probed = ("transcript (chosen by its template probe: the GGUF has none; served greedy unless a request or the "
              "model's parameters set a temperature)")
    shown = blazar_cli(home, "show", MODEL).stdout
    assert " ".join(probed.split()) in " ".join(shown.split()) and "template probe" in shown
    template = json.loads(blazar_cli(home, "show", MODEL, "--json").stdout)["template"]
    assert template["source"] == "probe" and template["sampling"] == {"temperature": 0.0}
    s = httpx2.post(f"{base}/api/show", json={"model": MODEL}, trust_env=False).json()
    assert s["blazar"] == {"completion_only": True, "template_source": "probe", "template": probed}
    assert s["parameters"].split() == ["temperature", "0.0"]  # the default a request gets, in Ollama's words
    assert s["template"] == TRANSCRIPT.jinja and s["capabilities"] == ["completion"]
    # A template set for the model wins, and show says so.
    said = blazar_cli(home, "model", "set", MODEL, "--template", "chatml").stdout
    try:
        assert "template: built-in chatml (set for this model)" in said
        assert "built-in chatml (set for this model)" in blazar_cli(home, "show", MODEL).stdout
    finally:
        said = blazar_cli(home, "model", "set", MODEL, "--clear-template").stdout
    assert f"template: {probed}" in said


def test_show_on_an_architecture_without_a_known_template_says_chatml_is_the_fallback(tmp_path: Path) -> None:
    from blazar.adapters.engines.tiny_model import write_tiny_model  # a llama GGUF: no architecture template

    home = tmp_path / "home"
    home.mkdir()
    blazar_cli(home, "import", str(write_tiny_model(tmp_path / "tiny.gguf")), "--name", "tiny")
    shown = json.loads(blazar_cli(home, "show", "tiny", "--json").stdout)
    assert shown["template"]["source"] == "fallback" and "ChatML" in shown["template"]["summary"]
