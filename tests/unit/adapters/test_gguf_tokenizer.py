"""A GGUF's tokenizer identity (what makes a model a possible draft for another): model, size, token-list hash and
the BOS/EOS tokens llama.cpp compares before it accepts a draft."""

from __future__ import annotations

from pathlib import Path

from gguf import GGUFWriter

from blazar.adapters.engines.tiny_model import write_tiny_model
from blazar.adapters.gguf_tokenizer import TokenizerIdentity, tokenizer_identity


def _vocab_only(path: Path, tokens: list[str], bos: int | None = None, add_bos: bool | None = None) -> Path:
    w = GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("llama")
    w.add_vocab_size(len(tokens))
    w.add_token_list(tokens)
    if bos is not None:
        w.add_bos_token_id(bos)
    if add_bos is not None:
        w.add_add_bos_token(add_bos)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_same_file_twice_matches_and_a_changed_token_list_does_not(tmp_path: Path) -> None:
    a = tokenizer_identity(write_tiny_model(tmp_path / "a.gguf"))
    b = tokenizer_identity(write_tiny_model(tmp_path / "b.gguf"))
    assert a.model == "llama" and a.vocab_size and a.tokens_sha256
    assert a == b and a.matches(b)
    x = tokenizer_identity(_vocab_only(tmp_path / "x.gguf", ["<s>", "a", "b"]))
    y = tokenizer_identity(_vocab_only(tmp_path / "y.gguf", ["<s>", "a", "c"]))
    assert x.vocab_size == y.vocab_size == 3
    assert not x.matches(y)
    assert not x.matches(a)


def test_unknown_shares_nothing() -> None:
    unknown = TokenizerIdentity(None, None, None)
    known = TokenizerIdentity("llama", 3, None)
    assert not unknown.matches(unknown)
    assert known.matches(TokenizerIdentity("llama", 3, "ab"))
    assert not known.matches(TokenizerIdentity("gpt2", 3, None))


def test_another_bos_token_or_bos_flag_is_another_tokenizer(tmp_path: Path) -> None:
    tokens = ["<s>", "</s>", "a", "b"]
    base = tokenizer_identity(_vocab_only(tmp_path / "base.gguf", tokens, bos=0, add_bos=True))
    assert (base.bos_id, base.add_bos, base.eos_id, base.add_eos) == (0, True, None, None)
    assert base.matches(tokenizer_identity(_vocab_only(tmp_path / "same.gguf", tokens, bos=0, add_bos=True)))
    assert not base.matches(tokenizer_identity(_vocab_only(tmp_path / "bos.gguf", tokens, bos=1, add_bos=True)))
    assert not base.matches(tokenizer_identity(_vocab_only(tmp_path / "flag.gguf", tokens, bos=0, add_bos=False)))
    # a file that leaves them out takes the tokenizer model's defaults: nothing to tell them apart by
    assert base.matches(tokenizer_identity(_vocab_only(tmp_path / "silent.gguf", tokens)))
