"""The checks a request's route adds to the pipeline: a rerank request's model reranks (blazar/store/model_settings.py's
`reranks`), else a clear 400 that names the model, what it can do, and how to force rerank mode; a speech request's
model is of a kind that serves its route (blazar/adapters/engines/kinds.py), else a 400 that says what it serves."""

from __future__ import annotations

from blazar.adapters.engines.kinds import engine_kind
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


def refuse_unless_serves(model: ResolvedModel, route: str) -> None:
    """Refused (400, model_kind_mismatch) when `model`'s kind does not serve `route` (a transcription to a chat
    model, speech to a whisper model)."""
    kind = engine_kind(getattr(model, "kind", "llama-server"))
    if kind.serves(route):
        return
    raise Refused(kind.refusal(model.name), reason="model_kind_mismatch", http_status=400,
                  observations={"kind": kind.name, "route": route})
