"""The readers of LM Studio's models folder, the Hugging Face cache and llama.cpp's cache: stores laid out as each tool
lays them out (placeholder bytes: a reader reads names and links, never a GGUF header), found as `ForeignModel`s
with the names a user recognises, their parts and projectors; what cannot be carried is skipped with its reason."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from blazar.store.foreign import hf_cache, llama_cpp, lmstudio

REV_OLD = "a" * 40
REV_MAIN = "b" * 40


def gguf(path: Path, payload: bytes = b"") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"GGUF" + payload + path.name.encode())
    return path


# -- LM Studio -----------------------------------------------------------------------------------------------------


def test_lmstudio_models_are_publisher_repo_files_named_repo_and_quant(tmp_path: Path) -> None:
    repo = tmp_path / "lmstudio-community" / "gemma-3-270m-it-GGUF"
    model = gguf(repo / "gemma-3-270m-it-Q4_K_M.gguf")
    q8 = gguf(repo / "gemma-3-270m-it-Q8_0.gguf")
    proj_f16 = gguf(repo / "mmproj-gemma-3-270m-it-F16.gguf")
    proj_q8 = gguf(repo / "mmproj-gemma-3-270m-it-Q8_0.gguf")
    parts = [gguf(tmp_path / "bartowski" / "Qwen3-8B-GGUF" / f"Qwen3-8B-Q6_K-0000{i}-of-00002.gguf") for i in (2, 1)]

    found = {m.name: m for m in lmstudio.find(tmp_path)}
    assert sorted(found) == ["gemma-3-270m-it:q4_k_m", "gemma-3-270m-it:q8_0", "qwen3-8b:q6_k"]
    g = found["gemma-3-270m-it:q4_k_m"]
    assert (g.tool, g.weights, g.source, g.projector) == ("lmstudio", (model,), str(model), proj_f16)
    assert found["gemma-3-270m-it:q8_0"].weights == (q8,) and found["gemma-3-270m-it:q8_0"].projector == proj_q8
    assert found["qwen3-8b:q6_k"].weights == tuple(reversed(parts)) and found["qwen3-8b:q6_k"].projector is None
    assert found["qwen3-8b:q6_k"].carried == ("weights (2 parts)",) and g.carried == ("weights", "projector")


def test_two_publishers_of_one_repo_and_quant_each_take_their_publisher_in_front(tmp_path: Path) -> None:
    for publisher in ("bartowski", "unsloth"):
        gguf(tmp_path / publisher / "Qwen3-8B-GGUF" / "Qwen3-8B-Q4_K_M.gguf")
    gguf(tmp_path / "unsloth" / "Qwen3-8B-GGUF" / "Qwen3-8B-Q8_0.gguf")
    names = [m.name for m in lmstudio.find(tmp_path)]
    assert names == ["bartowski-qwen3-8b:q4_k_m", "unsloth-qwen3-8b:q4_k_m", "qwen3-8b:q8_0"]
    assert names == [m.name for m in lmstudio.find(tmp_path)]  # the same names on every run


def test_a_file_without_a_quantization_in_its_name_is_tagged_with_its_name(tmp_path: Path) -> None:
    gguf(tmp_path / "me" / "My Model" / "Final Version.gguf")
    (model,) = lmstudio.find(tmp_path)
    assert model.name == "my-model:final-version"


def test_a_model_one_folder_deep_counts_as_lmstudio_lists_it(tmp_path: Path) -> None:
    sideloaded = gguf(tmp_path / "my-llama" / "my-llama-Q5_K_M.gguf")
    gguf(tmp_path / "ignored-at-the-root-Q4_0.gguf")
    (model,) = lmstudio.find(tmp_path)
    assert (model.name, model.weights) == ("my-llama:q5_k_m", (sideloaded,))


def test_a_split_model_missing_a_part_is_skipped_saying_which(tmp_path: Path) -> None:
    repo = tmp_path / "bartowski" / "Big-GGUF"
    gguf(repo / "Big-Q4_K_M-00001-of-00003.gguf")
    gguf(repo / "Big-Q4_K_M-00003-of-00003.gguf")
    models, skipped = lmstudio.scan(tmp_path)
    assert models == []
    (s,) = skipped
    assert s.source == str(repo / "Big-Q4_K_M-*-of-00003.gguf") and "has 2 of 3: missing 2" in s.reason


def test_lmstudio_lives_where_its_home_pointer_or_its_settings_say(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path)}
    assert lmstudio.default_root(env) == tmp_path / ".lmstudio" / "models"
    (tmp_path / ".cache" / "lm-studio" / "models").mkdir(parents=True)  # only the older location exists
    assert lmstudio.default_root(env) == tmp_path / ".cache" / "lm-studio" / "models"
    (tmp_path / ".lmstudio-home-pointer").write_text(str(tmp_path / "elsewhere") + "\n")
    assert lmstudio.default_root(env) == tmp_path / "elsewhere" / "models"
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "settings.json").write_text('{"downloadsFolder": "/big/disk/models"}')
    assert lmstudio.default_root(env) == Path("/big/disk/models")


# -- the Hugging Face cache -----------------------------------------------------------------------------------------


def hub_file(repo_dir: Path, rev: str, name: str, payload: bytes = b"") -> Path:
    """A file as huggingface_hub stores it: the bytes in blobs/<sha256>, the snapshot's entry a relative symlink."""
    data = b"GGUF" + payload + name.encode()
    blob = repo_dir / "blobs" / hashlib.sha256(data).hexdigest()
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(data)
    entry = repo_dir / "snapshots" / rev / name
    entry.parent.mkdir(parents=True, exist_ok=True)
    entry.symlink_to(os.path.relpath(blob, entry.parent))
    return entry


def test_the_hub_cache_reads_the_revision_refs_main_names(tmp_path: Path) -> None:
    repo = tmp_path / "models--ggml-org--gemma-3-270m-GGUF"
    hub_file(repo, REV_OLD, "gemma-3-270m-Q4_0.gguf")
    model = hub_file(repo, REV_MAIN, "gemma-3-270m-Q8_0.gguf")
    proj = hub_file(repo, REV_MAIN, "mmproj-model-f16.gguf")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REV_MAIN)
    (found,) = hf_cache.find(tmp_path)
    assert (found.tool, found.name, found.weights, found.projector) == (
        "hf-cache", "gemma-3-270m:q8_0", (model,), proj)
    assert found.source == str(model) and Path(os.path.realpath(found.weights[0])).parent.name == "blobs"


def test_without_refs_the_newest_snapshot_is_read_and_subfolders_count(tmp_path: Path) -> None:
    repo = tmp_path / "models--unsloth--Qwen3-8B-GGUF"
    hub_file(repo, REV_OLD, "Qwen3-8B-Q4_0.gguf")
    parts = [hub_file(repo, REV_MAIN, f"Q8_0/Qwen3-8B-Q8_0-0000{i}-of-00002.gguf") for i in (1, 2)]
    os.utime(repo / "snapshots" / REV_OLD, (1, 1))
    (found,) = hf_cache.find(tmp_path)
    assert (found.name, found.weights) == ("qwen3-8b:q8_0", tuple(parts))


def test_a_missing_blob_or_a_link_out_of_the_cache_is_skipped(tmp_path: Path) -> None:
    repo = tmp_path / "models--org--repo-GGUF"
    gone = hub_file(repo, REV_MAIN, "repo-Q4_0.gguf")
    os.unlink(os.path.realpath(gone))
    outside = gguf(tmp_path.parent / f"{tmp_path.name}-elsewhere" / "secret.gguf")
    escaping = repo / "snapshots" / REV_MAIN / "repo-Q8_0.gguf"
    escaping.symlink_to(outside)
    models, skipped = hf_cache.scan(tmp_path)
    assert models == []
    reasons = {Path(s.source).name: s.reason for s in skipped}
    assert "blob is missing" in reasons["repo-Q4_0.gguf"] and "points outside the cache" in reasons["repo-Q8_0.gguf"]


def test_the_hub_cache_lives_where_huggingface_hub_says(tmp_path: Path) -> None:
    home = {"HOME": str(tmp_path)}
    assert hf_cache.default_root(home) == tmp_path / ".cache" / "huggingface" / "hub"
    assert hf_cache.default_root({**home, "XDG_CACHE_HOME": "/x"}) == Path("/x/huggingface/hub")
    assert hf_cache.default_root({**home, "XDG_CACHE_HOME": "/x", "HF_HOME": "/h"}) == Path("/h/hub")
    assert hf_cache.default_root({**home, "HF_HOME": "/h", "HUGGINGFACE_HUB_CACHE": "/old"}) == Path("/old")
    assert hf_cache.default_root({**home, "HUGGINGFACE_HUB_CACHE": "/old", "HF_HUB_CACHE": "/c"}) == Path("/c")


# -- llama.cpp's cache ----------------------------------------------------------------------------------------------


def test_llama_cpp_flat_cache_names_models_by_their_manifest(tmp_path: Path) -> None:
    model = gguf(tmp_path / "ggml-org_gemma-3-4b-it-GGUF_gemma-3-4b-it-Q4_K_M.gguf")
    (tmp_path / f"{model.name}.etag").write_text('"abc"')
    proj = gguf(tmp_path / "ggml-org_gemma-3-4b-it-GGUF_mmproj-model-f16.gguf")
    (tmp_path / "manifest=ggml-org=gemma-3-4b-it-GGUF=latest.json").write_text(
        '{"ggufFile": {"rfilename": "gemma-3-4b-it-Q4_K_M.gguf", "size": 1}, '
        '"mmprojFile": {"rfilename": "mmproj-model-f16.gguf"}}')
    parts = [gguf(tmp_path / f"unsloth_Big-GGUF_Q4_K_M_Big-Q4_K_M-0000{i}-of-00002.gguf") for i in (1, 2)]
    (tmp_path / "manifest=unsloth=Big-GGUF=Q4_K_M.json").write_text(
        '{"ggufFile": {"rfilename": "Q4_K_M/Big-Q4_K_M-00001-of-00002.gguf"}}')
    loose = gguf(tmp_path / "ai_smollm2_135M-Q4_0.gguf")  # a docker model: no manifest names it
    (tmp_path / "broken.gguf.downloadInProgress").write_bytes(b"GG")

    found = {m.name: m for m in llama_cpp.find(tmp_path)}
    assert sorted(found) == ["ai_smollm2_135m:q4_0", "big:q4_k_m", "gemma-3-4b-it:q4_k_m"]
    g = found["gemma-3-4b-it:q4_k_m"]
    assert (g.tool, g.weights, g.projector, g.source) == ("llama-cpp", (model,), proj, str(model))
    assert found["big:q4_k_m"].weights == tuple(parts)
    assert found["ai_smollm2_135m:q4_0"].weights == (loose,) and found["ai_smollm2_135m:q4_0"].projector is None


def test_llama_cpp_newer_builds_write_the_hub_layout_into_its_cache(tmp_path: Path) -> None:
    model = hub_file(tmp_path / "models--ggml-org--gemma-3-270m-GGUF", REV_MAIN, "gemma-3-270m-Q8_0.gguf")
    (found,) = llama_cpp.find(tmp_path)
    assert (found.tool, found.name, found.weights) == ("llama-cpp", "gemma-3-270m:q8_0", (model,))


def test_llama_cpp_cache_lives_where_llama_cpp_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llama_cpp.sys, "platform", "linux")
    home = {"HOME": str(tmp_path)}
    assert llama_cpp.default_root(home) == tmp_path / ".cache" / "llama.cpp"
    assert llama_cpp.default_root({**home, "XDG_CACHE_HOME": "/x"}) == Path("/x/llama.cpp")
    assert llama_cpp.default_root({**home, "LLAMA_CACHE": "/l"}) == Path("/l")
    monkeypatch.setattr(llama_cpp.sys, "platform", "darwin")
    assert llama_cpp.default_root(home) == tmp_path / "Library" / "Caches" / "llama.cpp"
