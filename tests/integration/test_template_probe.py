"""The demo model as Blazar ships it, from its first load: a GGUF with no chat template gets the template its
model ends its turn in, chosen by the template probe on that load and recorded; its answers end (no user stop words,
no variant); tools reach the prompt; `blazar show` says what was chosen and why; `model set --template` overrides it.
Real `blazar serve`, real llama-server, the real Gemma 3 270M, through the openai SDK."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from blazar.store.turn_formats import TRANSCRIPT
from tests.support.blazar_home import read_events
from tests.support.daemon import wait_for
from tests.support.serving import blazar_cli, serving_gemma

MODEL = "gemma"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


class Daemon:
    def __init__(self, home: Path, port: int) -> None:
        self.home = home
        self.client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0,
                                    timeout=300)

    def events(self, *types: str) -> list[dict[str, Any]]:
        return read_events(self.home, *types)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, engine_binary: Path, gemma_path: Path) -> Iterator[Daemon]:
    home = tmp_path_factory.mktemp("probe-home")
    with serving_gemma(home, engine_binary, gemma_path, MODEL, {"ctx": 2048, "slots": 1}, template=None,
                       probed=False) as (port, _):
        yield Daemon(home, port)


def _ask(d: Daemon, text: str, **kwargs: Any) -> Any:
    return d.client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": text}],
                                            temperature=0, **kwargs)


@pytest.mark.slow(reason="a first load: two engine starts and the probe's fifteen short answers between them")
def test_the_first_load_probes_and_the_answer_ends_its_turn(daemon: Daemon) -> None:
    chat = _ask(daemon, "What is the capital of France?", max_tokens=64)
    choice = chat.choices[0]
    # The answer ended by itself, well before the limit, with words in it.
    assert choice.finish_reason == "stop" and (choice.message.content or "").strip(), choice
    assert chat.usage is not None and chat.usage.completion_tokens < 64
    (probe,) = daemon.events("model.template_probed")
    data = probe["data"]
    assert data["name"] == MODEL and [t["template"] for t in data["trials"]] == ["gemma", "chatml", "transcript"]
    gemma, chatml, transcript = data["trials"]
    # The demo base model never ends a Gemma turn; it ends a transcript's turn with words more often than ChatML's.
    assert gemma["ended"] == 0 and transcript["answered"] > gemma["answered"]
    assert data["chosen"] == "transcript" and transcript["answered"] >= chatml["answered"]
    # Started with the architecture's template, probed before it served anything, then started again with the
    # chosen one: the request was served by the second.
    starts = daemon.events("instance.started")
    exits = {e["data"]["instance_id"]: e["data"] for e in daemon.events("instance.exited")}
    assert len(starts) == 2 and exits[starts[0]["data"]["instance_id"]]["reason"] == "template_probed"
    assert starts[0]["seq"] < probe["seq"] < starts[1]["seq"]
    assert "chat-template-file" in " ".join(starts[1]["data"]["argv"])
    routed = [e["data"] for e in daemon.events("request.routed")]
    assert routed[-1]["instance_id"] == starts[1]["data"]["instance_id"]


def test_show_says_which_template_and_the_probes_numbers(daemon: Daemon) -> None:
    wait_for(lambda: daemon.events("model.template_probed"), "the probe", timeout=120)
    text = blazar_cli(daemon.home, "show", MODEL).stdout
    said = " ".join(text.split())
    assert "transcript (chosen by its template probe: the GGUF has none; served greedy" in said
    assert "chose transcript (gemma: 0 of 5 answered" in said
    shown = json.loads(blazar_cli(daemon.home, "show", MODEL, "--json").stdout)
    assert shown["template"]["source"] == "probe" and shown["template"]["name"] == "transcript"
    assert shown["template"]["stops"] == list(TRANSCRIPT.stops)
    assert shown["template"]["sampling"] == {"temperature": 0.0}
    assert shown["template_probe"]["chosen"] == "transcript"


def test_tools_reach_the_prompt_and_a_later_load_does_not_probe_again(daemon: Daemon) -> None:
    bare = _ask(daemon, "What is the weather in Paris?", max_tokens=1)
    tooled = _ask(daemon, "What is the weather in Paris?", max_tokens=1, tools=[WEATHER])
    assert bare.usage is not None and tooled.usage is not None
    size = len(json.dumps(WEATHER["function"]))
    assert tooled.usage.prompt_tokens - bare.usage.prompt_tokens > size // 8  # the definition, and the instruction
    blazar_cli(daemon.home, "stop", MODEL)
    _ask(daemon, "Hello!", max_tokens=8)
    assert len(daemon.events("model.template_probed")) == 1
    assert len(daemon.events("instance.started")) == 3


def test_a_template_set_for_the_model_overrides_the_probe(daemon: Daemon) -> None:
    said = blazar_cli(daemon.home, "model", "set", MODEL, "--template", "blazar:chatml").stdout
    assert "template: chatml (Blazar's) (set for this model)" in said

    def served_by_chatml() -> bool:
        _ask(daemon, "Hello!", max_tokens=4)
        last = daemon.events("instance.started")[-1]["data"]
        return len(daemon.events("instance.started")) == 4 and "chat-template-file" in " ".join(last["argv"])

    wait_for(served_by_chatml, "an instance started with the template set", timeout=120)
    assert len(daemon.events("model.template_probed")) == 1
    assert "chatml (Blazar's) (set for this model)" in blazar_cli(daemon.home, "show", MODEL).stdout
