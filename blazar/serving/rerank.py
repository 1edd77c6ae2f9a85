"""The one check a rerank request adds to the pipeline: its model reranks (blazar/store/model_settings.py's
`reranks`), else a clear 400 that names the model, what it can do, and how to force rerank mode."""

from __future__ import annotations

from blazar.errors import Refused
from blazar.instances.supervisor import ResolvedModel
from blazar.store.model_settings import reranks


def refuse_unless_reranker(model: ResolvedModel) -> None:
    """Refused (400) when `model` has no rerank head and is not set to be served as a reranker."""
    if reranks(model.metadata, model.settings):
        return
    meta = model.metadata
    can = ["completion", *(["chat"] if meta.chat_template else []), *(["embedding"] if meta.embedding_model else [])]
    raise Refused(f"{model.name} cannot rerank: it has no rerank head (its GGUF's pooling type is "
                  f"{meta.pooling_type or 'none'}, a reranker's is rank); it can do {', '.join(can)}. Use a reranker "
                  f"model, or serve this one in rerank mode anyway (its scores would mean nothing): "
                  f"blazar model set {model.name} --rerank", reason="invalid_request", http_status=400,
                  observations={"pooling_type": meta.pooling_type, "architecture": meta.architecture})

