"""The Ollama dialect's model-management routes end to end: the official `ollama` SDK against `blazar serve` with
the real llama-server and the real Gemma 3 270M."""

from __future__ import annotations

import httpx2
import ollama
import pytest

import blazar
from blazar.api.ollama import OLLAMA_API_VERSION
from tests.support import sdk_daemons
from tests.support.sdk_daemons import MODEL, OllamaDaemon
from tests.support.serving import blazar_cli

_cli = blazar_cli
daemon = sdk_daemons.ollama_daemon  # the module-scoped real daemon


def test_root_and_version(daemon: OllamaDaemon) -> None:
    r = httpx2.get(f"{daemon.base}/", trust_env=False)
    assert r.status_code == 200 and r.text == "Ollama is running"
    assert httpx2.head(f"{daemon.base}/", trust_env=False).status_code == 200
    r = httpx2.get(f"{daemon.base}/api/version", trust_env=False)
    # Ollama's API version, as Ollama clients read it (Codex --oss needs 0.13.4 or newer); Blazar's in its header.
    assert r.status_code == 200 and r.json() == {"version": OLLAMA_API_VERSION}
    assert r.headers["x-blazar-version"] == blazar.__version__
    assert tuple(int(n) for n in r.json()["version"].split(".")) >= (0, 13, 4)


def test_list_shows_the_store_with_details(daemon: OllamaDaemon) -> None:
    models = daemon.client().list().models
    assert [m.model for m in models] == [MODEL]
    m = models[0]
    assert m.size and m.size > 0 and m.digest and len(m.digest) == 64 and m.modified_at is not None
    assert m.details is not None and m.details.format == "gguf" and m.details.family == "gemma3"
    assert m.details.families == ["gemma3"] and m.details.parameter_size and m.details.parameter_size.endswith("M")
    assert m.details.quantization_level


def test_show_has_model_info_and_capabilities(daemon: OllamaDaemon) -> None:
    s = daemon.client().show(MODEL)
    assert s.modelinfo is not None and s.modelinfo["general.architecture"] == "gemma3"
    assert s.modelinfo["gemma3.context_length"] > 0
    assert s.capabilities is not None and "completion" in s.capabilities
    assert s.details is not None and s.details.format == "gguf"


def test_show_unknown_is_404_in_ollama_shape(daemon: OllamaDaemon) -> None:
    with pytest.raises(ollama.ResponseError) as e:
        daemon.client().show("nosuch")
    assert e.value.status_code == 404 and "nosuch" in e.value.error
    r = httpx2.post(f"{daemon.base}/api/show", content=b"{nope", trust_env=False)
    assert r.status_code == 400 and "error" in r.json()
    r = httpx2.post(f"{daemon.base}/api/show", json={"name": 3}, trust_env=False)
    assert r.status_code == 400 and isinstance(r.json()["error"], str)


def test_show_takes_the_older_name_field_as_litellm_and_aider_send_it(daemon: OllamaDaemon) -> None:
    r = httpx2.post(f"{daemon.base}/api/show", json={"name": MODEL}, trust_env=False)
    assert r.status_code == 200 and r.json()["model_info"]["gemma3.context_length"] > 0
    assert httpx2.post(f"{daemon.base}/api/show", json={"name": "nosuch"}, trust_env=False).status_code == 404


def test_ps_is_empty_then_shows_the_loaded_model(daemon: OllamaDaemon) -> None:
    client = daemon.client()
    assert client.ps().models == []
    r = httpx2.post(f"{daemon.base}/v1/completions", json={"model": MODEL, "prompt": "Hello", "max_tokens": 2},
                    trust_env=False, timeout=120)
    assert r.status_code == 200
    models = client.ps().models
    assert [m.model for m in models] == [MODEL]
    m = models[0]
    assert m.size and m.size > 0 and m.expires_at is not None and m.size_vram is not None
    assert m.digest and m.details is not None and m.details.family == "gemma3"
    # A loaded model is not deleted out from under its instance.
    r = httpx2.request("DELETE", f"{daemon.base}/api/delete", json={"model": MODEL}, trust_env=False)
    assert r.status_code == 409 and "blazar stop" in r.json()["error"]


def test_copy_then_delete_the_copy(daemon: OllamaDaemon) -> None:
    client = daemon.client()
    assert client.copy(MODEL, "gemma-copy").status == "success"
    assert sorted(m.model for m in client.list().models) == ["gemma", "gemma-copy"]
    assert client.show("gemma-copy").modelinfo["general.architecture"] == "gemma3"
    assert client.delete("gemma-copy").status == "success"
    assert [m.model for m in client.list().models] == [MODEL]  # the copy's name went, the model stayed
    assert client.show(MODEL).capabilities
    with pytest.raises(ollama.ResponseError) as e:
        client.copy("nosuch", "other")
    assert e.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as e:
        client.delete("nosuch")
    assert e.value.status_code == 404
