"""A GGUF's tokenizer identity: its tokenizer model, vocabulary size, a hash of its token list and its BOS/EOS
tokens, read from the header. `blazar tune` and `blazar drafts` (blazar/tuning/drafts.py) offer a draft model only
when the draft's identity is the model's: speculative decoding verifies the draft's token ids, which mean the same
only under one tokenizer, and llama.cpp refuses a draft whose BOS or EOS differs (common/speculative.cpp
`common_speculative_are_compatible`)."""

from __future__ import annotations

import hashlib
import mmap
from dataclasses import dataclass
from pathlib import Path

from blazar.adapters.gguf_header import ArrayValue, parse_header
from blazar.errors import ModelFileError, ShortRead

_SPECIALS = ("bos_token_id", "eos_token_id", "add_bos_token", "add_eos_token")


@dataclass(frozen=True)
class TokenizerIdentity:
    """None where the file does not say. Two identities match when the model and size agree, where both files give
    a token list the lists are byte-identical, and where both files give a BOS or EOS id or flag it is the same (a
    flag one file leaves out is the tokenizer model's default, the same for both)."""

    model: str | None  # tokenizer.ggml.model: "llama", "gpt2", ...
    vocab_size: int | None
    tokens_sha256: str | None  # sha256 of the serialised tokenizer.ggml.tokens array
    bos_id: int | None = None
    eos_id: int | None = None
    add_bos: bool | None = None
    add_eos: bool | None = None

    def matches(self, other: TokenizerIdentity) -> bool:
        if self.model is None or self.vocab_size is None:
            return False  # an unknown tokenizer shares nothing
        if (self.model, self.vocab_size) != (other.model, other.vocab_size):
            return False
        for mine, theirs in ((self.bos_id, other.bos_id), (self.eos_id, other.eos_id),
                             (self.add_bos, other.add_bos), (self.add_eos, other.add_eos)):
            if mine is not None and theirs is not None and mine != theirs:
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
    bos, eos, add_bos, add_eos = (header.kv.get(f"tokenizer.ggml.{k}") for k in _SPECIALS)
    return TokenizerIdentity(model if isinstance(model, str) else None, size if isinstance(size, int) else None,
                             digest, _int(bos), _int(eos), add_bos if isinstance(add_bos, bool) else None,
                             add_eos if isinstance(add_eos, bool) else None)


def _int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None
