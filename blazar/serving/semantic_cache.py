"""The semantic half of the response cache, pure: the text a request's embedding is made of (`prompt_text`), what
else must be equal for a semantic hit (`context_key`: the exact key less the prompt), and the vectors kept
(`VectorIndex`: per context key, least recently used first out, bounded in entries). The step that embeds, asks and
fills it is blazar/serving/semantic_step.py; the answers themselves are the exact cache's (response_cache.py).

A semantic hit needs everything the exact key holds but the prompt to be equal (the tenant, the model file, engine
build, posture, template, engine route, whether streamed, every other parameter) and the cosine similarity of the two
prompts' embeddings at or above the threshold.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from blazar.serving.response_cache import Identity, cache_key

PROMPT_FIELDS = ("messages", "prompt")  # the engine body's prompt (chat, completion): what is embedded
MAX_PROMPT_CHARS = 32_768  # a longer prompt is not looked up semantically (an embedding of it costs a whole prefill)


def semantic_on(key_setting: str | None, model_setting: str | None) -> bool:
    """Whether a request that uses the cache also looks for a similar entry: the key's setting, where its admin set
    one, else the model's, is "semantic"."""
    setting = key_setting if key_setting is not None else model_setting
    return setting == "semantic"


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: their text only (an image part is in the context key instead)
        return "\n".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def prompt_text(body: Mapping[str, Any]) -> str | None:
    """The prompt as the engine gets it, as one text: a chat's messages (role, then text, one per line) after every
    patch, or a completion's prompt; None when there is none to embed (or it is too long)."""
    messages, prompt = body.get("messages"), body.get("prompt")
    if isinstance(messages, list):
        text = "\n".join(f"{m.get('role', '')}: {_text_of(m.get('content'))}" for m in messages if isinstance(m, dict))
    elif isinstance(prompt, str):
        text = prompt
    else:
        return None
    return text if text.strip() and len(text) <= MAX_PROMPT_CHARS else None


def context_key(tenant: str | None, identity: Identity, engine_path: str, body: Mapping[str, Any], *,
                stream: bool) -> str | None:
    """The exact key of `body` less its prompt text: two requests whose context keys are equal differ at most in
    what they say. Content parts other than text (images, audio) stay in it: a different image is another request."""
    rest = {k: v for k, v in body.items() if k not in PROMPT_FIELDS}
    messages = body.get("messages")
    if isinstance(messages, list):
        rest["messages"] = [_shape_of(m) for m in messages]
    return cache_key(tenant, identity, engine_path, rest, stream=stream)


def _shape_of(message: Any) -> Any:
    """A message without its text: its role, and any part that is not text (the embedding holds the text)."""
    if not isinstance(message, dict):
        return message
    out = {k: v for k, v in message.items() if k != "content"}
    content = message.get("content")
    if isinstance(content, list):
        out["content"] = [p for p in content if not (isinstance(p, dict) and p.get("type") == "text")]
    return out


def unit(vector: list[float]) -> np.ndarray | None:
    """`vector` scaled to length 1 (cosine is then a dot product); None when it is empty, zero or not finite."""
    v = np.asarray(vector, dtype=np.float32)
    if v.ndim != 1 or v.size == 0 or not np.all(np.isfinite(v)):
        return None
    norm = float(np.linalg.norm(v))
    return v / norm if norm > 0 else None


@dataclass(frozen=True, slots=True)
class Vector:
    """A stored answer's prompt embedding: the exact entry it points at, under its context key."""

    context: str
    entry: str  # the exact cache's key of the answer
    model: str  # the store's name (what drops it when the model goes)
    vector: np.ndarray


@dataclass(frozen=True, slots=True)
class Match:
    entry: str
    similarity: float


class VectorIndex:
    """Prompt embeddings by the exact entry they stand for, at most `max_entries`, least recently used out first;
    looked up only among those of the same context key (so never another tenant's)."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self.embedder = ""  # the embedding model the vectors came from: another one drops them all
        self._vectors: OrderedDict[str, Vector] = OrderedDict()  # entry -> its vector
        self._by_context: dict[str, set[str]] = {}

    def __len__(self) -> int:
        return len(self._vectors)

    def embedded_by(self, model: str) -> None:
        """The vectors are `model`'s from now on: another model's are not comparable, and go."""
        if model != self.embedder:
            self._vectors.clear()
            self._by_context.clear()
            self.embedder = model

    def nearest(self, context: str, vector: np.ndarray, threshold: float,
                present: Any = None) -> tuple[Match | None, float | None]:
        """The most similar stored prompt of `context` at or above `threshold` (its vector used again: moved to the
        end), and the best similarity seen (None: nothing to compare). `present(entry)`: whether its answer is still
        kept (an entry whose answer went is skipped)."""
        best: Vector | None = None
        best_sim: float | None = None
        for entry in self._by_context.get(context, ()):
            v = self._vectors[entry]
            if v.vector.shape != vector.shape or (present is not None and not present(entry)):
                continue
            sim = float(np.dot(v.vector, vector))
            if best_sim is None or sim > best_sim:
                best, best_sim = v, sim
        if best is None or best_sim is None or best_sim < threshold:
            return None, best_sim
        self._vectors.move_to_end(best.entry)
        return Match(best.entry, best_sim), best_sim

    def put(self, v: Vector) -> None:
        self._drop(v.entry)
        self._vectors[v.entry] = v
        self._by_context.setdefault(v.context, set()).add(v.entry)
        self.bound(self.max_entries)

    def bound(self, max_entries: int) -> None:
        self.max_entries = max_entries
        while len(self._vectors) > max(0, self.max_entries):
            self._drop(next(iter(self._vectors)))

    def drop_model(self, model: str) -> int:
        gone = [e for e, v in self._vectors.items() if v.model == model]
        for entry in gone:
            self._drop(entry)
        return len(gone)

    def _drop(self, entry: str) -> None:
        v = self._vectors.pop(entry, None)
        if v is None:
            return
        same = self._by_context.get(v.context)
        if same is not None:
            same.discard(entry)
            if not same:
                del self._by_context[v.context]
