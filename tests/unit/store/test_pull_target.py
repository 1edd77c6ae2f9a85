"""What `blazar pull TARGET` means: registry shortnames, hub repos with an optional quant, files in a repo, and the
store name each kind of target gets by default."""

from __future__ import annotations

import pytest

from blazar.errors import InvalidModelName
from blazar.store.models import check_name
from blazar.store.pull_target import Target, parse_target


@pytest.mark.parametrize("text", ["gemma3-270m", "gemma3:270m", "qwen2.5_0.5b"])
def test_a_bare_name_is_a_registry_shortname_and_its_own_default_name(text: str) -> None:
    target = parse_target(text)
    assert target == Target(text=text, kind="registry", shortname=text)
    assert target.default_name() == text


def test_owner_repo_is_a_hub_quant_target_defaulting_to_q4_k_m() -> None:
    target = parse_target("ggml-org/gemma-3-270m-it-GGUF")
    assert (target.kind, target.repo, target.quant, target.path) == (
        "hub-quant", "ggml-org/gemma-3-270m-it-GGUF", None, None)
    # The repo name, lower-cased and without its "-GGUF" suffix, tagged with the quant.
    assert target.default_name() == "gemma-3-270m-it:q4_k_m"


def test_owner_repo_colon_quant_names_the_quant() -> None:
    target = parse_target("unsloth/Qwen3-0.6B-GGUF:Q8_0")
    assert (target.kind, target.repo, target.quant) == ("hub-quant", "unsloth/Qwen3-0.6B-GGUF", "Q8_0")
    assert target.default_name() == "qwen3-0.6b:q8_0"


@pytest.mark.parametrize(("text", "path", "name"), [
    ("org/repo/tiny-Q8_0.gguf", "tiny-Q8_0.gguf", "tiny-q8_0"),
    ("org/repo/sub/dir/Model-Q4_K_M.gguf", "sub/dir/Model-Q4_K_M.gguf", "model-q4_k_m"),
    ("org/repo/UPPER.GGUF", "UPPER.GGUF", "upper"),
    # Any part of a split model names the model, without the part numbering.
    ("org/repo/split/big-Q2_K-00002-of-00003.gguf", "split/big-Q2_K-00002-of-00003.gguf", "big-q2_k"),
])
def test_owner_repo_path_to_a_gguf_is_a_hub_file_target_named_after_the_file(text: str, path: str,
                                                                              name: str) -> None:
    target = parse_target(text)
    assert (target.kind, target.repo, target.path, target.quant) == ("hub-file", "org/repo", path, None)
    assert target.default_name() == name


@pytest.mark.parametrize(("text", "kind", "repo"), [
    ("hf.co/org/repo", "hub-quant", "org/repo"),
    ("hf.co/org/repo:Q8_0", "hub-quant", "org/repo"),
    ("huggingface.co/org/repo/sub/f.gguf", "hub-file", "org/repo"),
    ("https://huggingface.co/org/repo:Q4_K_M", "hub-quant", "org/repo"),
    ("https://hf.co/org/repo/f.gguf", "hub-file", "org/repo"),
    ("HF.CO/org/repo", "hub-quant", "org/repo"),
])
def test_hub_url_prefixes_are_stripped_and_the_original_text_kept(text: str, kind: str, repo: str) -> None:
    target = parse_target(text)
    assert (target.kind, target.repo, target.text) == (kind, repo, text)


@pytest.mark.parametrize("text", [
    "",
    "   ",
    "org/",
    "/repo",
    "org/repo/",
    "org/repo:",
    "org/repo/notes.txt",
    "org/repo/sub/",
    "org/repo/../escape.gguf",
    "org/repo/.hidden.gguf",
    "a/b/c/d",
    "-leading-dash",
    "has space",
    "org/repo:Q4 K",
    "https://example.com/org/repo",
])
def test_malformed_targets_are_refused_with_the_accepted_forms(text: str) -> None:
    with pytest.raises(InvalidModelName) as info:
        parse_target(text)
    msg = info.value.message
    assert f"cannot pull {text!r}" in msg
    assert "owner/repo[:QUANT]" in msg and "owner/repo/file.gguf" in msg


@pytest.mark.parametrize("text", [
    "gemma3-270m", "org/Some_Repo.GGUF", "org/repo-GGUF:IQ4_XS", "org/repo/a/b/c-F16.gguf",
    "org/r/x-00001-of-00002.gguf",
])
def test_every_default_name_is_a_valid_store_name(text: str) -> None:
    name = parse_target(text).default_name()
    assert check_name(name) == name
