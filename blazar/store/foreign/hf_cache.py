"""The Hugging Face hub cache: `models--ORG--REPO/snapshots/REVISION/**.gguf`, each a symlink into the repo's
`blobs/` (huggingface_hub's layout; on a filesystem without symlinks, the file itself). The revision read is the one
`refs/main` names, else the newest snapshot.

Where it is, as huggingface_hub documents it: `HF_HUB_CACHE` (or the older `HUGGINGFACE_HUB_CACHE`), else
`HF_HOME/hub`, else `XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub`. Newer llama.cpp builds
download `-hf` models into this same layout (blazar/store/foreign/llama_cpp.py reads them there too)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from blazar.store.foreign.found import ForeignModel, ForeignTool, Skipped
from blazar.store.foreign.layout import Candidate, group_weights, is_projector, projector_for, settle

_COMMIT = re.compile(r"^[0-9a-f]{40}$")


def default_root(env: Mapping[str, str]) -> Path:
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(var):
            return Path(env[var])
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]) / "hub"
    if env.get("XDG_CACHE_HOME"):
        return Path(env["XDG_CACHE_HOME"]) / "huggingface" / "hub"
    return Path(env.get("HOME") or Path.home()) / ".cache" / "huggingface" / "hub"


def revision(repo_dir: Path) -> Path | None:
    """The snapshot to read: the one `refs/main` names, else the newest; None when there is none."""
    snapshots = repo_dir / "snapshots"
    try:
        ref = (repo_dir / "refs" / "main").read_text().strip()
    except OSError:
        ref = ""
    if _COMMIT.fullmatch(ref) and (snapshots / ref).is_dir():
        return snapshots / ref
    found = [s for s in snapshots.iterdir() if s.is_dir()] if snapshots.is_dir() else []
    return max(found, key=lambda s: (s.stat().st_mtime, s.name)) if found else None


def repo_candidates(repo_dir: Path, tool: ForeignTool) -> tuple[list[Candidate], list[Skipped]]:
    """The models of one `models--ORG--REPO` directory, at its revision."""
    org, _, repo = repo_dir.name.removeprefix("models--").partition("--")
    snapshot = revision(repo_dir)
    if snapshot is None or not repo:
        return [], []
    skipped: list[Skipped] = []
    by_dir: dict[Path, list[Path]] = {}
    inside = repo_dir.resolve()
    for f in sorted(snapshot.rglob("*")):
        if f.suffix.lower() != ".gguf":
            continue
        if not f.exists():
            skipped.append(Skipped(tool, str(f), "its blob is missing (an interrupted download, or a cache cleaned "
                                   "by hand)"))
            continue
        target = Path(os.path.realpath(f))
        if not target.is_relative_to(inside):
            skipped.append(Skipped(tool, str(f), f"it points outside the cache ({target}): not read"))
            continue
        by_dir.setdefault(f.parent, []).append(f)
    candidates: list[Candidate] = []
    for files in by_dir.values():
        projectors = [f for f in files if is_projector(f)]
        models, missing = group_weights([f for f in files if not is_projector(f)], tool)
        skipped += missing
        candidates += [Candidate(tool, w, str(w[0]), repo.replace("--", "-"), org, projector_for(w, projectors))
                       for w in models]
    return candidates, skipped


def scan(root: Path, tool: ForeignTool = "hf-cache") -> tuple[list[ForeignModel], list[Skipped]]:
    candidates: list[Candidate] = []
    skipped: list[Skipped] = []
    for repo_dir in sorted(d for d in root.iterdir() if d.name.startswith("models--") and d.is_dir()):
        found, missing = repo_candidates(repo_dir, tool)
        candidates += found
        skipped += missing
    return settle(candidates), skipped


def find(root: Path) -> list[ForeignModel]:
    return scan(root)[0]


def skipped(root: Path) -> list[Skipped]:
    return scan(root)[1]
