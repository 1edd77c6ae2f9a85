"""`blazar import --from lmstudio|hf-cache|llama-cpp` through the real CLI, on stores laid out as each tool lays them
out, found where each tool keeps them (its environment variables, HOME): a dry run writes nothing, an import links
the bytes and records one `model.imported` per model, a second run imports nothing new; the real demo GGUF imported
from LM Studio's folder then answers through the real engine. (The readers' and the planner's cases:
tests/unit/store/foreign/.)"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from tests.conftest import Cli
from tests.support.blazar_home import read_events
from tests.support.daemon import free_port, stop_home_daemon
from tests.support.gguf_factory import write_plain

REV = "0123456789abcdef0123456789abcdef01234567"


def store_files(home: Path) -> list[str]:
    models = home / "models"
    return sorted(str(p.relative_to(models)) for p in models.rglob("*") if p.is_file()) if models.exists() else []


def imported(home: Path) -> list[dict]:
    return [e["data"] for e in read_events(home, "model.imported")]


def test_lmstudio_models_are_imported_once_and_answer_through_the_engine(
        cli: Cli, home: Path, tmp_path: Path, gemma_path: Path, engine_binary: Path) -> None:
    user = tmp_path / "user"
    folder = user / ".lmstudio" / "models" / "lmstudio-community" / "gemma-3-270m-GGUF"
    folder.mkdir(parents=True)
    weights = folder / "gemma-3-270m-Q4_K_M.gguf"
    os.link(gemma_path, weights)  # the one assembled copy of the session, not another 253 MB
    cli.env["HOME"] = str(user)  # LM Studio's default folder, found from HOME

    plan = cli("import", "--from", "lmstudio", "--dry-run", "--json").json()
    assert (plan["root"], plan["dry_run"]) == (str(user / ".lmstudio" / "models"), True)
    (row,) = plan["models"]
    assert (row["name"], row["action"], row["bytes"], row["carried"]) == (
        "gemma-3-270m:q4_k_m", "import", weights.stat().st_size, ["weights"])
    assert imported(home) == [] and store_files(home) == []

    done = cli("import", "--from", "lmstudio")
    assert "gemma-3-270m:q4_k_m" in done.stdout and "hardlink" in done.stdout
    assert "imported 1, already present 0, not imported 0" in done.stdout
    (ev,) = imported(home)
    assert (ev["name"], ev["source"], ev["source_kind"], ev["placed"], ev["linked"]) == (
        "gemma-3-270m:q4_k_m", str(weights), "lmstudio", "hardlink", True)
    assert (home / "models" / ev["path"]).samefile(weights)

    again = cli("import", "--from", "lmstudio", "--json").json()
    assert (again["imported"], again["present"], again["failed"]) == (0, 1, 0)
    assert len(imported(home)) == 1

    cli("engine", "install", "--path", str(engine_binary))
    # A template of its own: the GGUF has none, and a first load would probe three (tests/integration/
    # test_template_probe.py covers that); the import is what this test is about.
    cli("model", "set", "gemma-3-270m:q4_k_m", "--template", "blazar:gemma")
    for key, value in (("ctx", "512"), ("port", str(free_port()))):
        cli("config", "set", key, value)
    try:
        answer = cli("run", "gemma-3-270m:q4_k_m", "The capital of France is", "--max-tokens", "4",
                     "--temperature", "0", "--json", timeout=240).json()
    finally:
        stop_home_daemon(home)
    assert answer["model"] == "gemma-3-270m:q4_k_m" and answer["usage"]["completion_tokens"] >= 1


def hub_file(repo_dir: Path, name: str, weights: Path) -> Path:
    """A GGUF as huggingface_hub caches it: the bytes in blobs/<sha256> (hardlinked from `weights`), the snapshot's
    entry a relative symlink to it, refs/main naming the snapshot."""
    with weights.open("rb") as fh:
        digest = hashlib.file_digest(fh, "sha256").hexdigest()
    blob = repo_dir / "blobs" / digest
    blob.parent.mkdir(parents=True, exist_ok=True)
    os.link(weights, blob)
    entry = repo_dir / "snapshots" / REV / name
    entry.parent.mkdir(parents=True, exist_ok=True)
    entry.symlink_to(os.path.relpath(blob, entry.parent))
    (repo_dir / "refs").mkdir(exist_ok=True)
    (repo_dir / "refs" / "main").write_text(REV)
    return blob


def test_the_hub_cache_is_imported_from_its_blobs_never_its_symlinks(cli: Cli, home: Path, tmp_path: Path,
                                                                     gemma_path: Path) -> None:
    cache = tmp_path / "hf" / "hub"
    blob = hub_file(cache / "models--ggml-org--gemma-3-270m-GGUF", "gemma-3-270m-Q4_K_M.gguf", gemma_path)
    cli.env["HF_HUB_CACHE"] = str(cache)

    assert cli("import", "--from", "hf-cache", "--dry-run").code == 0 and imported(home) == []
    done = cli("import", "--from", "hf-cache", "--json").json()
    assert [(m["name"], m["outcome"], m["placed"]) for m in done["models"]] == [
        ("gemma-3-270m:q4_k_m", "imported", "hardlink")]
    (ev,) = imported(home)
    stored = home / "models" / ev["path"]
    assert not stored.is_symlink() and stored.samefile(blob) and ev["source_kind"] == "hf-cache"
    assert cli("import", "--from", "hf-cache", "--json").json()["imported"] == 0 and len(imported(home)) == 1


def test_llama_cpps_cache_is_imported_and_a_name_taken_here_is_left_alone(cli: Cli, home: Path, tmp_path: Path,
                                                                           gemma_path: Path) -> None:
    cache = tmp_path / "llama.cpp"
    cache.mkdir()
    os.link(gemma_path, cache / "ggml-org_gemma-3-270m-GGUF_gemma-3-270m-Q4_K_M.gguf")
    (cache / "manifest=ggml-org=gemma-3-270m-GGUF=latest.json").write_text(
        '{"ggufFile": {"rfilename": "gemma-3-270m-Q4_K_M.gguf"}}')
    write_plain(cache / "ai_smollm2_135M-Q4_0.gguf", seed=5)
    mine = tmp_path / "mine.gguf"
    write_plain(mine, seed=9)
    cli("import", str(mine), "--name", "gemma-3-270m:q4_k_m")  # the name is another model's here
    cli.env["LLAMA_CACHE"] = str(cache)

    res = cli("import", "--from", "llama-cpp", "--json", check=False)
    assert res.code == 1
    rows = {m["name"]: m for m in res.json()["models"]}
    assert rows["ai_smollm2_135m:q4_0"]["outcome"] == "imported"
    assert rows["gemma-3-270m:q4_k_m"]["action"] == "name-taken" and rows["gemma-3-270m:q4_k_m"]["outcome"] is None
    assert [e["name"] for e in imported(home)] == ["gemma-3-270m:q4_k_m", "ai_smollm2_135m:q4_0"]
    assert imported(home)[0]["source"] == str(mine)  # untouched

    only = cli("import", "--from", "llama-cpp", "--only", "ai_smollm2_135m:q4_0", "--json").json()
    assert [(m["name"], m["action"]) for m in only["models"]] == [("ai_smollm2_135m:q4_0", "present")]


@pytest.mark.parametrize(("args", "says"), [
    (["--from", "chatgpt"], "'chatgpt': expected one of ollama, lmstudio, hf-cache, llama-cpp"),
    (["--from", "lmstudio", "--name", "x"], "--name, --mmproj and --load are for one FILE"),
    (["--dry-run"], "--dry-run and --only go with --from TOOL"),
    ([], "give a FILE and --name NAME (or --from TOOL"),
    (["--from", "lmstudio", "{tmp}/nowhere"], "LM Studio's models folder not found at {tmp}/nowhere"),
    (["--from", "lmstudio", "{tmp}", "--only", "nope:q4"], "--only nope:q4: no model of that name was found"),
])
def test_a_wrong_combination_is_one_clear_line_and_a_non_zero_exit(cli: Cli, home: Path, tmp_path: Path,
                                                                  args: list[str], says: str) -> None:
    res = cli("import", *[a.replace("{tmp}", str(tmp_path)) for a in args], check=False)
    assert res.code == 2
    assert says.replace("{tmp}", str(tmp_path)) in " ".join(res.stderr.split())
    assert imported(home) == []
