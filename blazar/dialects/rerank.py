"""The rerank dialect (Jina's and Cohere's shape, which llama-server's own /v1/rerank speaks too): a client's body
turned into the engine's, and the engine's answer into the client's. Pure: no I/O.

    {"model", "query", "documents": [str | {"text": str}], "top_n"?, "return_documents"?}
      -> the engine: {"model", "query", "documents": [str], "top_n"}
      <- the engine: {"results": [{"index", "relevance_score"}] (best first, top_n of them), "usage"}
      -> the client: {"model", "object": "list", "results": [{"index", "relevance_score", "document"?}], "usage"}

`return_documents` defaults to true, as Jina's API does (Cohere's clients send it when they want it): each result
then carries its document as `{"text": ...}`, the shape both APIs answer with.
"""

from __future__ import annotations

from typing import Any

from blazar.dialects.errors import DialectError

# More documents than this in one request is a 400: each is one engine task (a prompt of its own).
MAX_DOCUMENTS = 1000


def _text(doc: Any, i: int) -> str:
    """A document as text: a string, or Cohere's `{"text": ...}` object."""
    if isinstance(doc, str):
        return doc
    text = doc.get("text") if isinstance(doc, dict) else None
    if isinstance(text, str):
        return text
    raise DialectError(f"documents[{i}]: expected a string or an object with a string `text`, got "
                       f"{type(doc).__name__}")


def rerank_request(body: dict[str, Any]) -> tuple[str, dict[str, Any], list[str], bool]:
    """A client's rerank body -> (model, the engine's body, the documents as text, return_documents)."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise DialectError("model: a non-empty string is required")
    query = body.get("query")
    if not isinstance(query, str) or not query:
        raise DialectError("query: a non-empty string is required")
    docs = body.get("documents")
    if not isinstance(docs, list) or not docs:
        raise DialectError("documents: a non-empty array of strings (or of {\"text\": ...} objects) is required")
    if len(docs) > MAX_DOCUMENTS:
        raise DialectError(f"documents: {len(docs)} given, at most {MAX_DOCUMENTS} per request")
    texts = [_text(d, i) for i, d in enumerate(docs)]
    top_n = body.get("top_n")
    if top_n is None:
        top_n = len(texts)
    elif isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1:
        raise DialectError("top_n: a positive integer is required")
    return_documents = body.get("return_documents", True)
    if not isinstance(return_documents, bool):
        raise DialectError("return_documents: a boolean is required")
    engine = {"model": model, "query": query, "documents": texts, "top_n": min(top_n, len(texts))}
    return model, engine, texts, return_documents


def rerank_reply(answer: dict[str, Any], model: str, texts: list[str], return_documents: bool) -> dict[str, Any]:
    """The engine's rerank answer in the client's shape: results best first (sorted again: the order is the
    contract, whatever the engine did), each with its document when asked for, and the usage."""
    rows = [r for r in answer.get("results") or [] if isinstance(r, dict) and isinstance(r.get("index"), int)
            and 0 <= r["index"] < len(texts)]
    rows.sort(key=lambda r: -float(r.get("relevance_score") or 0.0))
    results = []
    for r in rows:
        item: dict[str, Any] = {"index": r["index"], "relevance_score": float(r.get("relevance_score") or 0.0)}
        if return_documents:
            item["document"] = {"text": texts[r["index"]]}
        results.append(item)
    got = answer.get("usage")
    usage: dict[str, Any] = got if isinstance(got, dict) else {}
    tokens = int(usage.get("prompt_tokens") or 0)
    return {"model": model, "object": "list", "results": results,
            "usage": {"prompt_tokens": tokens, "total_tokens": int(usage.get("total_tokens") or tokens)}}
