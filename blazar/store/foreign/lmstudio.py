"""LM Studio's model store: `~/.lmstudio/models/PUBLISHER/REPO/*.gguf` (LM Studio 0.3 and later; earlier versions
kept it at `~/.cache/lm-studio/models`), a projector (`mmproj*.gguf`) beside the model it serves; a model one folder
deep (`models/NAME/*.gguf`) counts too, as LM Studio lists it.

Where it is: the models folder of LM Studio's home (`~/.lmstudio`, or the directory `~/.lmstudio-home-pointer`
names), or the folder its settings name (`downloadsFolder` in the home's `settings.json`, the "models directory" a
user moved in the app); else the older location when only that exists."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import orjson

from blazar.store.foreign.found import ForeignModel, Skipped
from blazar.store.foreign.layout import Candidate, group_weights, is_projector, projector_for, settle


def default_root(env: Mapping[str, str]) -> Path:
    home = Path(env.get("HOME") or Path.home())
    lms_home = home / ".lmstudio"
    pointer = home / ".lmstudio-home-pointer"
    named = pointer.read_text(errors="replace").strip() if pointer.is_file() else ""
    if named:
        lms_home = Path(named)
    moved = _downloads_folder(lms_home / "settings.json")
    if moved is not None:
        return moved
    current, older = lms_home / "models", home / ".cache" / "lm-studio" / "models"
    return older if not named and older.is_dir() and not current.is_dir() else current


def _downloads_folder(settings: Path) -> Path | None:
    try:
        folder = orjson.loads(settings.read_bytes()).get("downloadsFolder")
    except (OSError, orjson.JSONDecodeError, AttributeError):
        return None
    return Path(folder) if isinstance(folder, str) and folder else None


def scan(root: Path) -> tuple[list[ForeignModel], list[Skipped]]:
    candidates: list[Candidate] = []
    skipped: list[Skipped] = []
    for publisher in _folders(root):
        # NOTE: LM Studio also lists a model one folder deep (models/NAME/file.gguf, as people sideload them)
        for repo, owner in [(publisher, None), *((r, publisher.name) for r in _folders(publisher))]:
            ggufs = [f for f in repo.iterdir() if f.suffix.lower() == ".gguf" and f.is_file()]
            projectors = [f for f in ggufs if is_projector(f)]
            models, missing = group_weights([f for f in ggufs if not is_projector(f)], "lmstudio")
            skipped += missing
            candidates += [Candidate("lmstudio", w, str(w[0]), repo.name, owner, projector_for(w, projectors))
                           for w in models]
    return settle(candidates), skipped


def _folders(parent: Path) -> list[Path]:
    return sorted(p for p in parent.iterdir() if p.is_dir() and not p.name.startswith("."))


def find(root: Path) -> list[ForeignModel]:
    return scan(root)[0]


def skipped(root: Path) -> list[Skipped]:
    return scan(root)[1]
