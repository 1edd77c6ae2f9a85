"""A GGUF's tokenizer identity: its tokenizer model, vocabulary size and a hash of its token list, read from the
header. `blazar tune` (blazar/tuning/candidates.py) offers a draft model only when the draft's identity is the
model's: speculative decoding verifies the draft's token ids, which mean the same only under one tokenizer."""

from __future__ import annotations

import hashlib
import mmap
from dataclasses import dataclass
from pathlib import Path

from blazar.adapters.gguf_header import ArrayValue, parse_header
from blazar.errors import ModelFileError, ShortRead


@dataclass(frozen=True)
class TokenizerIdentity:
    """None where the file does not say. Two identities match when the model and size agree and, where both files
    give a token list, the lists are byte-identical."""

    model: str | None  # tokenizer.ggml.model: "llama", "gpt2", ...
    vocab_size: int | None
    tokens_sha256: str | None  # sha256 of the serialised tokenizer.ggml.tokens array

    def matches(self, other: TokenizerIdentity) -> bool:
        if self.model is None or self.vocab_size is None:
            return False  # an unknown tokenizer shares nothing
        if (self.model, self.vocab_size) != (other.model, other.vocab_size):
            return False
        return self.tokens_sha256 is None or other.tokens_sha256 is None or self.tokens_sha256 == other.tokens_sha256


def tokenizer_identity(path: Path) -> TokenizerIdentity:
    """Read `path`'s header (memory-mapped, no tensor data). Raises ModelFileError for an unreadable file."""
    try:
        with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            header = parse_header(buf, len(buf), str(path))
            tokens = header.kv.get("tokenizer.ggml.tokens")
            digest = None
            if isinstance(tokens, ArrayValue) and tokens.span is not None:
                digest = hashlib.sha256(buf[tokens.span[0]:tokens.span[1]]).hexdigest()
    except (OSError, ValueError) as exc:
        raise ModelFileError(f"{path}: cannot read its tokenizer: {exc}") from None
    except ShortRead:
        raise ModelFileError(f"{path}: truncated GGUF header") from None
    model = header.kv.get("tokenizer.ggml.model")
    arch = header.kv.get("general.architecture")
    size = header.kv.get(f"{arch}.vocab_size") if isinstance(arch, str) else None
    if not isinstance(size, int) and isinstance(tokens, ArrayValue):
        size = tokens.count
    return TokenizerIdentity(model if isinstance(model, str) else None, size if isinstance(size, int) else None,
                             digest)
