"""llama.cpp's own download cache (`llama-server -hf ORG/REPO[:QUANT]`), in either of the layouts its versions
wrote:

- flat (older builds): the file as `ORG_REPO_FILE.gguf` (every `/` made `_`), split parts beside it
  (`..._STEM-00002-of-00003.gguf`), an `.etag` (older: `.json`) beside each, and per repo and tag the hub's answer
  as `manifest=ORG=REPO=TAG.json`, whose `ggufFile.rfilename` and `mmprojFile.rfilename` say which file is the
  model and which its projector. A GGUF no manifest names (`-mu URL`, `-dr` docker models) is a model of its own.
- the Hugging Face hub cache's layout (`models--ORG--REPO/...`, blazar/store/foreign/hf_cache.py), which newer
  builds write into `LLAMA_CACHE` when it is set (and into the hub cache itself when it is not).

Where it is, as llama.cpp's fs_get_cache_directory says: `LLAMA_CACHE`, else `~/Library/Caches/llama.cpp` on macOS,
else `XDG_CACHE_HOME/llama.cpp`, else `~/.cache/llama.cpp`."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

import orjson

from blazar.store.foreign.found import ForeignModel, Skipped
from blazar.store.foreign.hf_cache import repo_candidates
from blazar.store.foreign.layout import Candidate, group_weights, is_projector, settle


def default_root(env: Mapping[str, str]) -> Path:
    if env.get("LLAMA_CACHE"):
        return Path(env["LLAMA_CACHE"])
    home = Path(env.get("HOME") or Path.home())
    if sys.platform == "darwin":
        return home / "Library" / "Caches" / "llama.cpp"
    if env.get("XDG_CACHE_HOME"):
        return Path(env["XDG_CACHE_HOME"]) / "llama.cpp"
    return home / ".cache" / "llama.cpp"


def _manifests(root: Path) -> dict[str, tuple[str, str, str | None]]:
    """Each manifest's model file name in the cache -> (org, repo, its projector's file name in the cache)."""
    named: dict[str, tuple[str, str, str | None]] = {}
    for path in sorted(root.glob("manifest=*.json")):
        parts = path.name.removesuffix(".json").split("=")
        if len(parts) != 4:
            continue
        _, org, repo, _tag = parts
        try:
            body = orjson.loads(path.read_bytes())
            gguf = body["ggufFile"]["rfilename"]
            mmproj = (body.get("mmprojFile") or {}).get("rfilename")
        except (OSError, orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
            continue
        if not isinstance(gguf, str):
            continue

        def cached(rfilename: str, org: str = org, repo: str = repo) -> str:
            return f"{org}/{repo}_{rfilename}".replace("/", "_")

        named[cached(gguf)] = (org, repo, cached(mmproj) if isinstance(mmproj, str) else None)
    return named


def scan(root: Path) -> tuple[list[ForeignModel], list[Skipped]]:
    candidates: list[Candidate] = []
    skipped: list[Skipped] = []
    for repo_dir in sorted(d for d in root.iterdir() if d.name.startswith("models--") and d.is_dir()):
        found, missing = repo_candidates(repo_dir, "llama-cpp")
        candidates += found
        skipped += missing
    ggufs = [f for f in root.iterdir() if f.suffix.lower() == ".gguf" and f.is_file()]
    manifests = _manifests(root)
    models, missing = group_weights([f for f in ggufs if not is_projector(f)], "llama-cpp")
    skipped += missing
    for weights in models:
        org, repo, mmproj = manifests.get(weights[0].name, (None, None, None))
        projector = root / mmproj if mmproj is not None and (root / mmproj).is_file() else None
        candidates.append(Candidate("llama-cpp", weights, str(weights[0]), repo, org, projector))
    return settle(candidates), skipped


def find(root: Path) -> list[ForeignModel]:
    return scan(root)[0]


def skipped(root: Path) -> list[Skipped]:
    return scan(root)[1]
