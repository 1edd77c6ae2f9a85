"""POST /v1/rerank and /rerank: Jina's and Cohere's rerank API, for models with a rerank head (a GGUF whose pooling
type is rank) or set to be served as one (`blazar model set NAME --rerank`).

A thin resource like every inference route: the body validated here and translated by blazar/dialects/rerank.py,
then the same pipeline as /v1/embeddings (key scope and limits, admission, trace and metrics: Gateway.serve). The
request asks for an instance in rerank mode (llama-server --reranking), which serves nothing else; the gateway
refuses a model without a rerank head (blazar/serving/resolve.py, `Resolver.check_kind`). Errors take OpenAI's shape.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from blazar.api.auth import Access
from blazar.api.bounds import MAX_NAME_CHARS
from blazar.api.openai import M
from blazar.api.proxy import Proxy
from blazar.api.routes import Route, inference
from blazar.dialects import rerank as rerank_dialect
from blazar.serving.request import Hooks, Request


class RerankDocument(BaseModel):
    """Cohere's document object: its `text` is what is ranked."""

    model_config = ConfigDict(extra="allow")

    text: StrictStr


class RerankBody(BaseModel):
    # Other providers' fields (Cohere's max_chunks_per_doc, rank_fields) are accepted and change nothing.
    model_config = ConfigDict(extra="allow")

    model: StrictStr = Field(min_length=1, max_length=MAX_NAME_CHARS)
    query: StrictStr = Field(min_length=1)
    documents: list[StrictStr | RerankDocument] = Field(min_length=1, max_length=rerank_dialect.MAX_DOCUMENTS)
    top_n: StrictInt | None = Field(None, ge=1)
    return_documents: StrictBool = True


class Rerank(Proxy):
    def ask(self, data: dict[str, Any]) -> Request:
        RerankBody.model_validate(data)
        model, body, texts, with_docs = rerank_dialect.rerank_request(data)
        return Request(model=model, engine_path="/v1/rerank", body=body, stream=False, rerank=True,
                       hooks=Hooks(reply=lambda answer, call: rerank_dialect.rerank_reply(answer, call.model, texts,
                                                                                          with_docs)))


_EXAMPLE = {"model": M, "query": "What is a panda?", "documents": ["hi", "The giant panda is a bear."], "top_n": 1}
ROUTES = (
    Route("/v1/rerank", Access.KEY, lambda d: Rerank(d.gateway), {"post": inference(
        "Rerank documents by relevance to a query (Jina/Cohere)", RerankBody, "RerankList", None,
        examples=(_EXAMPLE,))}),
    Route("/rerank", Access.KEY, lambda d: Rerank(d.gateway), {"post": inference(
        "Rerank (the same as /v1/rerank)", RerankBody, "RerankList", None, examples=(_EXAMPLE,))}),
)
