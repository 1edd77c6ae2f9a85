"""Rerank's decisions without an engine: the dialect's translation both ways (Jina's and Cohere's shapes, the order,
top_n, documents, usage), which models rerank (a rank head, or forced by a setting), the 400 that names the model
and the way out, and the flags an instance in rerank mode starts with."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from blazar.adapters.engines.llama_server import Capabilities, FlagSpec
from blazar.dialects.errors import DialectError
from blazar.dialects.rerank import MAX_DOCUMENTS, rerank_reply, rerank_request
from blazar.errors import EngineIncompatible, Refused
from blazar.events.model_settings import ModelSettings
from blazar.events.models import ModelMetadata
from blazar.instances.live import ResolvedModel
from blazar.instances.spawn import _mode_flags
from blazar.serving.rerank import refuse_unless_reranker
from blazar.store.engines import ActiveEngine
from blazar.store.model_settings import SettingsChange, reranks

DOCS = ["pandas eat bamboo", "Paris is in France", "tea"]


def test_jina_and_cohere_bodies_become_the_engines() -> None:
    model, engine, texts, with_docs = rerank_request({"model": "m", "query": "q", "documents": DOCS})
    assert (model, texts, with_docs) == ("m", DOCS, True)  # Jina's default: documents come back
    assert engine == {"model": "m", "query": "q", "documents": DOCS, "top_n": 3}
    _, engine, texts, with_docs = rerank_request({"model": "m", "query": "q", "top_n": 9, "return_documents": False,
                                                  "documents": [{"text": d, "id": i} for i, d in enumerate(DOCS)],
                                                  "max_chunks_per_doc": 4})
    assert texts == DOCS and not with_docs and engine["documents"] == DOCS and engine["top_n"] == 3


@pytest.mark.parametrize(("body", "words"), [
    ({"query": "q", "documents": DOCS}, "model"),
    ({"model": "m", "documents": DOCS}, "query"),
    ({"model": "m", "query": "", "documents": DOCS}, "query"),
    ({"model": "m", "query": "q", "documents": []}, "documents"),
    ({"model": "m", "query": "q", "documents": "one"}, "documents"),
    ({"model": "m", "query": "q", "documents": ["a", {"txt": "b"}]}, "documents[1]"),
    ({"model": "m", "query": "q", "documents": ["a"] * (MAX_DOCUMENTS + 1)}, f"at most {MAX_DOCUMENTS}"),
    ({"model": "m", "query": "q", "documents": DOCS, "top_n": 0}, "top_n"),
    ({"model": "m", "query": "q", "documents": DOCS, "top_n": True}, "top_n"),
    ({"model": "m", "query": "q", "documents": DOCS, "return_documents": "yes"}, "return_documents"),
])
def test_a_bad_rerank_body_is_refused_naming_the_field(body: dict[str, Any], words: str) -> None:
    with pytest.raises(DialectError, match=words.replace("[", r"\[").replace("]", r"\]")):
        rerank_request(body)


def test_the_answer_is_best_first_with_documents_and_usage() -> None:
    # The engine's order is not trusted: the reply sorts again; an index it should not have sent is dropped.
    engine = {"model": "gemma.gguf", "results": [{"index": 2, "relevance_score": -0.5},
                                                 {"index": 0, "relevance_score": 3.25},
                                                 {"index": 1, "relevance_score": 0.0},
                                                 {"index": 7, "relevance_score": 9.0}],
              "usage": {"prompt_tokens": 21, "total_tokens": 21}}
    got = rerank_reply(engine, "gemma", DOCS, True)
    assert got == {"model": "gemma", "object": "list", "usage": {"prompt_tokens": 21, "total_tokens": 21},
                   "results": [{"index": 0, "relevance_score": 3.25, "document": {"text": DOCS[0]}},
                               {"index": 1, "relevance_score": 0.0, "document": {"text": DOCS[1]}},
                               {"index": 2, "relevance_score": -0.5, "document": {"text": DOCS[2]}}]}
    bare = rerank_reply({"results": [{"index": 1, "relevance_score": 1.0}]}, "gemma", DOCS, False)
    assert bare["results"] == [{"index": 1, "relevance_score": 1.0}] and bare["usage"]["prompt_tokens"] == 0


def meta(pooling: str | None = None, **kw: Any) -> ModelMetadata:
    return ModelMetadata(architecture="bert" if pooling else "gemma3", pooling_type=pooling,
                         embedding_model=pooling is not None, **kw)


def test_a_model_reranks_with_a_rank_head_or_when_forced() -> None:
    assert reranks(meta("rank"), None)
    assert not reranks(meta("mean"), None) and not reranks(meta(), None)
    assert not reranks(meta(), ModelSettings())
    assert reranks(meta(), ModelSettings(rerank=True))


def test_forcing_rerank_is_a_setting_change_that_says_so() -> None:
    on, changed = SettingsChange(rerank=True).applied_to(None)
    assert on.rerank and changed == ["rerank"] and not on.is_empty()
    same, changed = SettingsChange(system="hi").applied_to(on)
    assert same.rerank and changed == ["system"]  # another change leaves it as it is
    off, changed = SettingsChange(rerank=False).applied_to(same)
    assert not off.rerank and changed == ["rerank"]


def test_a_model_without_a_rerank_head_is_refused_naming_it_what_it_can_do_and_the_way_out() -> None:
    gemma = ResolvedModel(name="gemma", path=Path("/store/g.gguf"), metadata=meta(chat_template=True))
    with pytest.raises(Refused) as e:
        refuse_unless_reranker(gemma)
    assert e.value.http_status == 400 and e.value.code == "invalid_request"
    assert e.value.message.startswith("gemma cannot rerank: it has no rerank head (its GGUF's pooling type is none")
    assert "it can do completion, chat." in e.value.message and "blazar model set gemma --rerank" in e.value.message
    embedder = ResolvedModel(name="e", path=Path("/store/e.gguf"), metadata=meta("mean"))
    with pytest.raises(Refused, match=r"pooling type is mean.*completion, embedding"):
        refuse_unless_reranker(embedder)
    refuse_unless_reranker(ResolvedModel(name="r", path=Path("/store/r.gguf"), metadata=meta("rank")))
    refuse_unless_reranker(ResolvedModel(name="gemma", path=Path("/store/g.gguf"), metadata=meta(),
                                         settings=ModelSettings(rerank=True)))


def engine(*flags: str) -> ActiveEngine:
    caps = Capabilities(flags=tuple(FlagSpec(names=(f,)) for f in flags))
    return cast(ActiveEngine, type("E", (), {"caps": caps, "tag": "t"})())


def test_an_instance_starts_with_the_flags_of_its_mode() -> None:
    full = engine("--embeddings", "--pooling", "--reranking")
    assert _mode_flags(full, meta(), embeddings=False, rerank=True) == ["--reranking"]
    assert _mode_flags(full, meta(), embeddings=True, rerank=False) == ["--embeddings", "--pooling", "mean"]
    assert _mode_flags(full, meta("cls"), embeddings=True, rerank=False) == ["--embeddings"]
    assert _mode_flags(full, meta(), embeddings=False, rerank=False) == []
    with pytest.raises(EngineIncompatible, match="--reranking"):
        _mode_flags(engine("--embeddings"), meta(), embeddings=False, rerank=True)
