"""Reading Ollama's store (blazar/store/foreign/ollama.py) as Ollama lays it out: manifests and digest-named blobs
built at test time (tests/support/ollama_store.py) around tiny GGUFs, a tiny projector and a tiny LoRA adapter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from blazar.store.foreign.ollama import blazar_name, default_root, find, ollama_name, skipped
from blazar.store.foreign.ollama_params import carried_parameters
from blazar.store.turn_formats import render_jinja
from tests.support import gguf_factory
from tests.support.ollama_store import add_model, layer, write_manifest
from tests.support.tiny_lora import write_tiny_lora
from tests.support.tiny_mmproj import write_tiny_mmproj

CHATML = ("{{- range .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n{{ end }}"
          "<|im_start|>assistant\n")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("ollama-files")
    gguf_factory.write_plain(d / "model.gguf")
    gguf_factory.write_plain(d / "other.gguf", name="other", embd=32)
    return {"model": d / "model.gguf", "other": d / "other.gguf",
            "mmproj": write_tiny_mmproj(d / "mmproj.gguf", n_embd=64),
            "lora": write_tiny_lora(d / "lora.gguf", d / "model.gguf")}


def test_a_store_is_read_with_its_names_template_system_parameters_projector_and_adapter(
        tmp_path: Path, files: dict[str, Path]) -> None:
    root = tmp_path / "models"
    manifest = add_model(root, "llama3.2:3b", files["model"], template=CHATML, system="You are terse.",
                         params={"num_ctx": 8192, "stop": ["<|im_start|>", "<|im_end|>"], "temperature": 0.7,
                                 "num_gpu": 99},
                         projector=files["mmproj"], adapters=(files["lora"],), extra=(("license", b"MIT"),))
    add_model(root, "someone/tiny", files["other"])
    add_model(root, "hf.co/org/Tiny-GGUF:Q8_0", files["other"])
    found = {m.name: m for m in find(root)}
    assert sorted(found) == ["hf.co-org-Tiny-GGUF:Q8_0", "llama3.2:3b", "someone-tiny:latest"]
    assert skipped(root) == []

    m = found["llama3.2:3b"]
    assert m.tool == "ollama" and m.source == str(manifest)
    (weights,) = m.weights
    assert weights.parent == root / "blobs" and weights.read_bytes() == files["model"].read_bytes()
    assert m.projector is not None and m.projector.read_bytes() == files["mmproj"].read_bytes()
    (adapter,) = m.adapters
    assert adapter.name.startswith("adapter-") and adapter.path.read_bytes() == files["lora"].read_bytes()
    assert m.system == "You are terse."
    assert m.parameters == (("num_ctx", "8192"), ("stop", "<|im_start|>"), ("stop", "<|im_end|>"),
                            ("temperature", "0.7"))
    assert m.template is not None and render_jinja(m.template, [{"role": "user", "content": "Hi"}]) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert set(m.carried) >= {"weights", "projector", f"adapter {adapter.name}", "template (converted to Jinja)",
                              "system", "num_ctx=8192", "stop (2)", "temperature=0.7"}
    assert any(n.startswith("num_gpu: Blazar's memory planner") for n in m.not_carried)
    assert any(n.startswith("license: not carried") for n in m.not_carried)

    assert found["someone-tiny:latest"].not_carried == (
        "name: Ollama's someone/tiny:latest holds '/', which Blazar's names cannot; served as someone-tiny:latest",)
    assert found["hf.co-org-Tiny-GGUF:Q8_0"].template is None and found["hf.co-org-Tiny-GGUF:Q8_0"].parameters == ()


def test_names_map_as_ollama_list_shows_them() -> None:
    assert ollama_name("registry.ollama.ai", "library", "llama3.2", "3b") == "llama3.2:3b"
    assert blazar_name("registry.ollama.ai", "library", "llama3.2", "3b") == "llama3.2:3b"
    assert ollama_name("registry.ollama.ai", "user", "m", "latest") == "user/m:latest"
    assert blazar_name("registry.ollama.ai", "user", "m", "latest") == "user-m:latest"
    assert ollama_name("hf.co", "bartowski", "Llama-3.2-1B-Instruct-GGUF", "Q4_K_M") == \
        "hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M"
    assert blazar_name("hf.co", "bartowski", "Llama-3.2-1B-Instruct-GGUF", "Q4_K_M") == \
        "hf.co-bartowski-Llama-3.2-1B-Instruct-GGUF:Q4_K_M"


def test_the_default_root_is_ollama_models_else_the_users_else_the_linux_services(tmp_path: Path) -> None:
    service = tmp_path / "usr-share-ollama" / ".ollama" / "models"
    assert default_root({"OLLAMA_MODELS": str(tmp_path / "elsewhere"), "HOME": str(tmp_path)}, service) == \
        tmp_path / "elsewhere"
    assert default_root({"HOME": str(tmp_path)}, service) == tmp_path / ".ollama" / "models"
    service.mkdir(parents=True)
    assert default_root({"HOME": str(tmp_path)}, service) == service  # no user store: the service's
    (tmp_path / ".ollama" / "models").mkdir(parents=True)
    assert default_root({"HOME": str(tmp_path)}, service) == tmp_path / ".ollama" / "models"


def test_what_cannot_be_read_is_skipped_with_why_and_never_followed_out_of_the_store(
        tmp_path: Path, files: dict[str, Path]) -> None:
    root = tmp_path / "models"
    add_model(root, "good:1", files["model"])
    bad = root / "manifests" / "registry.ollama.ai" / "library" / "broken" / "latest"
    bad.parent.mkdir(parents=True)
    bad.write_text("{not json")
    missing = add_model(root, "missing:1", files["other"], system="s")
    system_blob = json.loads(missing.read_text())["layers"][1]["digest"].replace(":", "-")
    (root / "blobs" / system_blob).unlink()
    secret = tmp_path / "secret.gguf"
    secret.write_bytes(files["model"].read_bytes())
    write_manifest(root, "escape:1", [{"mediaType": "application/vnd.ollama.image.model",
                                       "digest": "sha256:../../secret.gguf", "size": secret.stat().st_size}])
    outside = tmp_path / "outside-manifest"
    outside.write_text(json.dumps({"schemaVersion": 2, "layers": []}))
    link = root / "manifests" / "registry.ollama.ai" / "library" / "linked" / "latest"
    link.parent.mkdir(parents=True)
    link.symlink_to(outside)
    short = layer(root, "model", files["other"])
    write_manifest(root, "partial:1", [{**short, "size": short["size"] + 1}])
    write_manifest(root, "engine:1", [layer(root, "tensor", b"\0" * 8)], config={"model_format": "safetensors"})
    write_manifest(root, "notgguf:1", [layer(root, "model", b"PK\x03\x04 not a gguf")])

    assert [m.name for m in find(root)] == ["good:1"]
    reasons = {Path(s.source).parent.name: s.reason for s in skipped(root)}
    assert reasons == {
        "broken": "the manifest is not JSON",
        "missing": f"its system blob {system_blob} is missing",
        "escape": "a layer's digest 'sha256:../../secret.gguf' is not sha256:HEX",
        "linked": "the manifest is a link out of Ollama's store",
        "partial": f"its blob sha256-{short['digest'][7:]} is {short['size']:,} bytes where the manifest says "
                   f"{short['size'] + 1:,} (a download not finished?)",
        "engine": "its weights are safetensors, not GGUF (a model for Ollama's own engine)",
        "notgguf": "its weights layer is not a GGUF file",
    }


def test_a_template_that_is_not_converted_leaves_the_ggufs_own_and_says_why(
        tmp_path: Path, files: dict[str, Path]) -> None:
    root = tmp_path / "models"
    tools = "{{ if .Tools }}{{ json .Tools }}{{ end }}{{ range .Messages }}{{ .Content }}{{ end }}"
    add_model(root, "tools:1", files["model"], template=tools, extra=(("messages", b"[]"),))
    (m,) = find(root)
    assert m.template is None
    assert "template: the Go template uses .Tools, which is not converted; the GGUF's own chat template is used " \
           "(else its architecture's)" in m.not_carried
    assert any(n.startswith("messages: Ollama's MESSAGE turns") for n in m.not_carried)


def test_parameters_carry_what_model_settings_take_and_say_why_not_the_rest() -> None:
    pairs, carried, left = carried_parameters({
        "num_ctx": 4096, "top_k": 40, "repeat_penalty": 1.1, "seed": 7, "num_predict": 128, "min_p": 0.05,
        "num_thread": 8, "use_mmap": True, "made_up": 1, "temperature": "warm",
        "stop": [f"s{i}" for i in range(20)]})
    assert pairs == (("min_p", "0.05"), ("num_ctx", "4096"), ("num_predict", "128"), ("repeat_penalty", "1.1"),
                     ("seed", "7"), *[("stop", f"s{i}") for i in range(16)], ("top_k", "40"))
    assert "stop (16)" in carried and "num_ctx=4096" in carried
    assert [entry.split(":")[0] for entry in left] == ["made_up", "num_thread", "stop", "temperature", "use_mmap"]
    assert "4 stop strings past the 16" in left[2]
