"""LoRA adapters end to end: `blazar lora add|list|rm` against a running `blazar serve`, the real llama-server loading
the adapter (tests/support/tiny_lora.py: random rank-4 weights for Gemma 3 270M) beside the real model, and requests
through the official `openai` and `ollama` SDKs that apply it per request (`lora: [{name, scale}]`) or by an Ollama
variant (ADAPTER).

The adapter's weights are random and large: applied at scale 1 the greedy text turns to noise; at scale 0 (or when
a request names no adapter) it is the model's own. Texts are compared with the model's own, never with each other
at scale 1 (chaotic: a cached prompt computed in another batch shape may give other noise), and never timed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx2
import ollama
import openai
import pytest

from tests.support.sdk_daemons import VariantsDaemon
from tests.support.serving import blazar_cli, serving_gemma
from tests.support.tiny_lora import write_tiny_lora

MODEL = "gemma-lora"
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def adapter(tmp_path_factory: pytest.TempPathFactory, gemma_path: Path) -> Path:
    return write_tiny_lora(tmp_path_factory.mktemp("lora") / "tiny.gguf", gemma_path)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, engine_binary: Path, gemma_path: Path) -> Iterator[VariantsDaemon]:
    home = tmp_path_factory.mktemp("lora-home")
    with serving_gemma(home, engine_binary, gemma_path, MODEL, {"ctx": 1024}, template=None) as (port, _):
        yield VariantsDaemon(home, port)


def complete(d: VariantsDaemon, model: str = MODEL, lora: list[dict] | None = None) -> str:
    extra = {} if lora is None else {"lora": lora}
    r = d.openai().completions.create(model=model, prompt=PROMPT, max_tokens=10, temperature=0, extra_body=extra)
    return r.choices[0].text


def test_an_added_adapter_loads_with_the_model_and_applies_only_where_a_request_asks(daemon: VariantsDaemon,
                                                                                    adapter: Path) -> None:
    added = daemon.cli("lora", "add", MODEL, str(adapter), "--name", "tiny")
    assert "adapter tiny added: gemma3, rank 4" in added.stdout
    listed = json.loads(daemon.cli("lora", "list", MODEL, "--json").stdout)
    assert [(a["id"], a["name"], a["metadata"]["rank"]) for a in listed] == [(0, "tiny", 4)]
    stored = daemon.home / "models" / listed[0]["path"]
    assert stored.name == f"{listed[0]['sha256']}.gguf" and stored.is_file()
    assert "0: tiny (rank 4" in " ".join(daemon.cli("show", MODEL).stdout.split())

    base = complete(daemon, lora=[{"name": "tiny", "scale": 0}])
    applied = complete(daemon, lora=[{"name": "tiny", "scale": 1}])
    assert base.strip() and applied != base
    # llama-server's own spelling, by id (the load order), means the same adapter. NOTE: its text is compared with
    # the model's own only: at scale 1 these random weights make the greedy text chaotic, and the engine's reuse of a
    # cached prompt (computed in another batch shape) may pick other noise.
    assert complete(daemon, lora=[{"id": 0, "scale": 1.0}]) != base
    # A request that names none gets none, even right after one that applied it (the engine would keep it).
    assert complete(daemon) == base
    chat = daemon.openai().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": PROMPT}], max_tokens=10, temperature=0,
        extra_body={"lora": [{"name": "tiny", "scale": 1}]})
    plain = daemon.openai().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": PROMPT}], max_tokens=10, temperature=0)
    assert chat.choices[0].message.content != plain.choices[0].message.content
    argv = [e["argv"] for e in daemon.events("instance.starting") if e["model"] == MODEL][-1]
    assert argv[argv.index("--lora") + 1] == str(stored) and "--lora-init-without-apply" in argv
    sent = [e for e in daemon.events("lora.added") if e["model"] == MODEL][-1]
    assert sent["sha256"] == listed[0]["sha256"] and sent["metadata"]["architecture"] == "gemma3"


@pytest.mark.parametrize(("lora", "words"), [
    ([{"name": "nosuch", "scale": 1}], ["nosuch", "tiny"]),
    ([{"name": "tiny", "scale": "high"}], ["scale"]),
    ([{"name": "tiny", "scale": 1e9}], ["scale"]),
    ([{"id": 3, "scale": 1}], ["id 3"]),
    ({"name": "tiny"}, ["must be a list"]),
])
def test_an_unknown_adapter_or_a_bad_scale_is_a_400(daemon: VariantsDaemon, adapter: Path, lora: object,
                                                   words: list[str]) -> None:
    if not json.loads(daemon.cli("lora", "list", MODEL, "--json").stdout):
        daemon.cli("lora", "add", MODEL, str(adapter), "--name", "tiny")
    with pytest.raises(openai.BadRequestError) as e:
        daemon.openai().completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, extra_body={"lora": lora})
    for w in words:
        assert w in e.value.message


def test_an_ollama_variant_with_adapter_applies_it(daemon: VariantsDaemon, adapter: Path) -> None:
    listed = json.loads(daemon.cli("lora", "list", MODEL, "--json").stdout)
    if not listed:
        daemon.cli("lora", "add", MODEL, str(adapter), "--name", "tiny")
        listed = json.loads(daemon.cli("lora", "list", MODEL, "--json").stdout)
    client = daemon.ollama()
    # The SDK sends {file: digest}: the adapter already in the store under the model, by its bytes.
    assert client.create(model="tuned", from_=MODEL, adapters={"tiny.gguf": "sha256:" + listed[0]["sha256"]}
                         ).status == "success"
    opts = {"temperature": 0, "num_predict": 10}
    tuned = client.generate(model="tuned", prompt=PROMPT, options=opts).response
    own = client.generate(model=MODEL, prompt=PROMPT, options=opts).response
    assert tuned != own
    shown = client.show("tuned")
    assert shown.modelfile is not None and "ADAPTER tiny" in shown.modelfile
    # The variant's own request can still turn it off.
    assert complete(daemon, "tuned", [{"name": "tiny", "scale": 0}]) == complete(daemon, MODEL)
    # A legacy Modelfile names it; a file path from the client is refused with how to add one.
    r = httpx2.post(f"{daemon.base}/api/create", trust_env=False, json={
        "model": "tuned2", "modelfile": f"FROM {MODEL}\nADAPTER tiny\n", "stream": False})
    assert r.status_code == 200, r.text
    r = httpx2.post(f"{daemon.base}/api/create", trust_env=False, json={
        "model": "bad", "modelfile": f"FROM {MODEL}\nADAPTER /etc/passwd\n", "stream": False})
    assert r.status_code == 400 and "blazar lora add" in r.json()["error"]
    with pytest.raises(ollama.ResponseError) as e:
        client.create(model="bad", from_=MODEL, adapters={"x.gguf": "sha256:" + "0" * 64})
    assert e.value.status_code == 400 and "blazar lora add" in e.value.error


def test_a_bad_file_is_refused_and_nothing_is_stored(daemon: VariantsDaemon, adapter: Path, gemma_path: Path,
                                                    tmp_path: Path) -> None:
    before = sorted((daemon.home / "models" / "lora").glob("*"))
    wrong = blazar_cli(daemon.home, "lora", "add", MODEL, str(adapter), "--name", "other", "--sha256", "0" * 64,
                       check=False)
    assert wrong.returncode != 0 and "does not match" in wrong.stderr
    llama = write_tiny_lora(tmp_path / "llama.gguf", gemma_path, arch="llama")
    other = blazar_cli(daemon.home, "lora", "add", MODEL, str(llama), "--name", "other", check=False)
    assert other.returncode != 0 and "'llama'" in other.stderr and "'gemma3'" in other.stderr
    model = blazar_cli(daemon.home, "lora", "add", MODEL, str(gemma_path), "--name", "other", check=False)
    assert model.returncode != 0 and "not a LoRA adapter" in model.stderr
    assert sorted((daemon.home / "models" / "lora").glob("*")) == before


def test_the_gateway_never_forwards_the_engines_adapter_routes(daemon: VariantsDaemon) -> None:
    for path in ("/lora-adapters", "/v1/lora-adapters"):
        assert httpx2.get(f"{daemon.base}{path}", trust_env=False).status_code == 404
        assert httpx2.post(f"{daemon.base}{path}", json=[{"id": 0, "scale": 1}], trust_env=False).status_code in (
            404, 405)


def test_removed_adapters_and_a_removed_model_take_their_files(daemon: VariantsDaemon, gemma_path: Path,
                                                               tmp_path: Path) -> None:
    own = write_tiny_lora(tmp_path / "own.gguf", gemma_path, seed=11)
    daemon.cli("import", str(gemma_path), "--name", "second")
    daemon.cli("lora", "add", "second", str(own), "--name", "own")
    (entry,) = json.loads(daemon.cli("lora", "list", "second", "--json").stdout)
    daemon.cli("lora", "rm", "second", "own")
    assert json.loads(daemon.cli("lora", "list", "second", "--json").stdout) == []
    assert not (daemon.home / "models" / entry["path"]).exists()
    with pytest.raises(openai.BadRequestError):
        complete(daemon, "second", [{"name": "own", "scale": 1}])
    daemon.cli("lora", "add", "second", str(own), "--name", "own")
    daemon.cli("rm", "second")
    assert not (daemon.home / "models" / entry["path"]).exists()
    gone = [e for e in daemon.events("lora.removed") if e["model"] == "second"]
    assert len(gone) == 2 and gone[-1]["file_deleted"]


def test_the_responses_and_anthropic_dialects_take_the_same_list(daemon: VariantsDaemon, adapter: Path) -> None:
    if not json.loads(daemon.cli("lora", "list", MODEL, "--json").stdout):
        daemon.cli("lora", "add", MODEL, str(adapter), "--name", "tiny")
    oa = daemon.openai()

    def respond(scale: float) -> str:
        return oa.responses.create(model=MODEL, input=PROMPT, max_output_tokens=10, temperature=0,
                                   extra_body={"lora": [{"name": "tiny", "scale": scale}]}).output_text

    assert respond(1) != respond(0)
    claude = anthropic.Anthropic(base_url=daemon.base, api_key="unused", max_retries=0, timeout=180)
    msgs = [{"role": "user", "content": PROMPT}]

    def message(scale: float) -> str:
        r = claude.messages.create(model=MODEL, max_tokens=10, messages=msgs,
                                   extra_body={"temperature": 0, "lora": [{"name": "tiny", "scale": scale}]})
        return "".join(b.text for b in r.content if b.type == "text")

    assert message(1) != message(0)
    with pytest.raises(openai.BadRequestError) as e:
        oa.responses.create(model=MODEL, input=PROMPT, max_output_tokens=2, extra_body={"lora": [{"name": "nosuch"}]})
    assert "nosuch" in e.value.message
    with pytest.raises(anthropic.BadRequestError) as a:
        claude.messages.create(model=MODEL, max_tokens=2, messages=msgs, extra_body={"lora": [{"name": "nosuch"}]})
    assert "nosuch" in str(a.value) and a.value.body["type"] == "error"  # type: ignore[index]


def test_a_key_scoped_to_a_model_reaches_only_that_models_adapters(daemon: VariantsDaemon, adapter: Path) -> None:
    """Last in this file: once a key exists, every request needs one."""
    if not json.loads(daemon.cli("lora", "list", MODEL, "--json").stdout):
        daemon.cli("lora", "add", MODEL, str(adapter), "--name", "tiny")
    daemon.ollama().create(model="scoped-out", from_=MODEL, adapters={"tiny": ""})
    secret = json.loads(daemon.cli("keys", "create", "tenant", "--models", MODEL, "--json").stdout)["secret"]
    keyed = openai.OpenAI(base_url=f"{daemon.base}/v1", api_key=secret, max_retries=0, timeout=180)
    r = keyed.completions.create(model=MODEL, prompt=PROMPT, max_tokens=10, temperature=0,
                                 extra_body={"lora": [{"name": "tiny", "scale": 1}]})
    assert r.choices[0].text
    with pytest.raises(openai.PermissionDeniedError):  # another model's adapters: its variant, outside the scope
        keyed.completions.create(model="scoped-out", prompt=PROMPT, max_tokens=2)
    shown = httpx2.post(f"{daemon.base}/api/show", json={"model": "scoped-out"}, trust_env=False,
                        headers={"Authorization": f"Bearer {secret}"})
    assert shown.status_code in (403, 404) and "ADAPTER" not in shown.text  # hidden, as any model outside it
