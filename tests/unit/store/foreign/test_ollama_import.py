"""An Ollama store (laid out as Ollama writes it: tests/support/ollama_store.py) through the importer in-process, on
a real home and tiny GGUFs: the model comes in under its Ollama name with its converted template, its system prompt,
its parameters, its projector and its adapter applied by default, as Ollama served it; what Blazar does not take is
said in the row; a skipped model is listed with why and nothing of it is imported."""

from __future__ import annotations

from pathlib import Path

from blazar.context import Blazar
from blazar.dialects.go_template import to_jinja
from blazar.projections.catalog import models, stored
from blazar.store.foreign.importer import discover, plan, run
from tests.support.gguf_factory import write_plain
from tests.support.ollama_store import add_model, write_manifest
from tests.support.tiny_lora import write_tiny_lora
from tests.support.tiny_mmproj import write_tiny_mmproj

PHI3 = ("{{- range .Messages }}<|{{ .Role }}|>\n{{ .Content }}<|end|>\n{{ end }}<|assistant|>\n")


async def test_an_ollama_model_comes_in_with_everything_ollama_served_it_with(app: Blazar, tmp_path: Path) -> None:
    files = tmp_path / "files"
    files.mkdir()
    write_plain(files / "model.gguf")
    lora = write_tiny_lora(files / "lora.gguf", files / "model.gguf")
    mmproj = write_tiny_mmproj(files / "mmproj.gguf", n_embd=64)
    root = tmp_path / "ollama" / "models"
    add_model(root, "tiny:q8", files / "model.gguf", template=PHI3, system="Be terse.",
              params={"num_ctx": 1024, "stop": ["<|end|>"], "top_k": 20, "num_thread": 4},
              projector=mmproj, adapters=(lora,))
    write_manifest(root, "gone:1", [{"mediaType": "application/vnd.ollama.image.model", "digest": "sha256:" + "0" * 64,
                                     "size": 1}])

    found = discover("ollama", root)
    assert [s.reason for s in found.skipped] == [f"its model blob sha256-{'0' * 64} is missing"]
    (row,) = plan(app.runner.state("catalog"), found.found)
    (done,) = await run(app, [row])
    assert done.outcome == "imported", done.reason
    assert any(n.startswith("num_thread:") for n in done.not_carried)

    entry = stored(app.runner.state("catalog"), "tiny:q8")
    assert entry is not None and entry.source_kind == "ollama"
    s = entry.settings
    assert s is not None and (s.template_kind, s.template) == ("jinja", to_jinja(PHI3))
    assert s.system == "Be terse."
    assert s.parameters == {"num_ctx": 1024, "stop": ["<|end|>"], "top_k": 20}
    (adapter,) = entry.loras
    assert adapter.name.startswith("adapter-") and s.lora == {adapter.name: 1.0}
    assert entry.projector is not None
    assert [m.name for m in models(app.runner.state("catalog"))] == ["tiny:q8"]
