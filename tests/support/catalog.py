"""A model as the catalog is fed it: a `model.imported` event with small metadata, any field overridden."""

from __future__ import annotations

from blazar.events.models import ModelImported, ModelMetadata

META = ModelMetadata(architecture="llama", name="tiny", parameter_count=90_560, file_type="Q8_0", ctx_train=2048,
                     block_count=3, chat_template=True, tensor_count=30)


def imported(name: str, path: str | None = None, **overrides: object) -> ModelImported:
    fields: dict[str, object] = {
        "name": name, "path": path or f"{name.replace(':', '--')}.gguf", "source": f"/src/{name}.gguf",
        "bytes": 100, "sha256": "ab" * 32, "linked": True, "metadata": META,
    }
    return ModelImported(**(fields | overrides))
