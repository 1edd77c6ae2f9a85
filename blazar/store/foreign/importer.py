"""`blazar import --from TOOL [DIR]`: find every model in another tool's store (a reader per tool, loaded when asked
for), plan what to do with each (import it, or it is already here, or its name is another model's, or it cannot be
carried), and import the planned ones, each its own `model.imported` (blazar/store/foreign/carry.py).

Idempotent: a model whose source (or, under the same name, whose bytes) the store already holds is "present", so a
second run imports nothing new; a name the store gives to other bytes is "name taken", never overwritten.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import Any, Literal, get_args

from blazar.context import Blazar
from blazar.errors import BlazarError, ForeignStoreError, InvalidModelName
from blazar.events.models import Placed
from blazar.projections.catalog import CatalogState, StoredModel, alias_target, models, stored
from blazar.store.foreign.found import ForeignModel, ForeignTool, Skipped
from blazar.store.models import check_name, sha256_file

# Each tool's reader: a module with `default_root(env) -> Path`, `find(root) -> list[ForeignModel]` and, if it can
# say what it passed over, `skipped(root) -> list[Skipped]`. Imported when its tool is asked for.
READERS: dict[ForeignTool, str] = {
    "ollama": "blazar.store.foreign.ollama",
    "lmstudio": "blazar.store.foreign.lmstudio",
    "hf-cache": "blazar.store.foreign.hf_cache",
    "llama-cpp": "blazar.store.foreign.llama_cpp",
}
TOOLS: tuple[ForeignTool, ...] = get_args(ForeignTool)
DESCRIBED: dict[ForeignTool, str] = {"ollama": "Ollama's store", "lmstudio": "LM Studio's models folder",
                                     "hf-cache": "the Hugging Face cache", "llama-cpp": "llama.cpp's cache"}

Action = Literal["import", "present", "name-taken", "refused"]
Outcome = Literal["imported", "failed"]


@dataclass(frozen=True)
class Row:
    """One model found, what the plan does with it and, after the run, what came of it."""

    name: str
    source: str
    bytes: int
    action: Action
    reason: str = ""  # why it is present, taken or refused; after a failure, the error
    model: ForeignModel | None = None
    carried: tuple[str, ...] = ()
    not_carried: tuple[str, ...] = ()
    placed: Placed | None = None  # how the weights entered the store (after the run)
    outcome: Outcome | None = None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "source": self.source, "bytes": self.bytes, "action": self.action,
                "reason": self.reason or None, "carried": list(self.carried), "not_carried": list(self.not_carried),
                "placed": self.placed, "outcome": self.outcome}


@dataclass(frozen=True)
class Discovery:
    tool: ForeignTool
    root: Path
    found: list[ForeignModel]
    skipped: list[Skipped] = field(default_factory=list)


def reader(tool: ForeignTool) -> ModuleType:
    if tool not in READERS:
        raise ForeignStoreError(f"--from {tool!r}: expected one of {', '.join(TOOLS)}")
    try:
        return importlib.import_module(READERS[tool])
    except ModuleNotFoundError as e:
        if e.name != READERS[tool]:
            raise
        raise ForeignStoreError(f"--from {tool}: reading {DESCRIBED[tool]} is not available in this build") from None


def default_root(tool: ForeignTool, env: Mapping[str, str]) -> Path:
    """Where `tool` keeps its models on this machine, as the tool itself decides (its environment variables)."""
    where = reader(tool).default_root
    return Path(where(env) if inspect.signature(where).parameters else where())


def discover(tool: ForeignTool, root: Path) -> Discovery:
    mod = reader(tool)
    if not root.is_dir():
        raise ForeignStoreError(f"{DESCRIBED[tool]} not found at {root} (give its directory: blazar import --from "
                                f"{tool} DIR)")
    try:
        found = list(mod.find(root))
        passed = list(mod.skipped(root)) if hasattr(mod, "skipped") else []
    except OSError as e:
        raise ForeignStoreError(f"{DESCRIBED[tool]} at {root} cannot be read: {e}") from None
    return Discovery(tool, root, found, passed)


def _same_bytes(model: ForeignModel, entry: StoredModel) -> bool:
    """The store's model holds the bytes `model` would bring (its first file's sha256: a split model's first part)."""
    try:
        return entry.bytes == model.bytes and sha256_file(model.weights[0]) == entry.sha256
    except OSError:
        return False


def _row(catalog: CatalogState, model: ForeignModel, by_source: Mapping[str, str]) -> Row:
    try:
        size = model.bytes
    except OSError as e:
        return Row(model.name, model.source, 0, "refused", f"cannot read its file: {e.strerror or e}", model,
                   model.carried, model.not_carried)
    base = Row(model.name, model.source, size, "import", "", model, model.carried, model.not_carried)
    try:
        check_name(model.name)
    except InvalidModelName as e:
        return replace(base, action="refused", reason=e.message)
    if model.source in by_source:
        return replace(base, action="present", reason=f"already imported as {by_source[model.source]}")
    entry = stored(catalog, model.name)
    if entry is not None and _same_bytes(model, entry):
        return replace(base, action="present", reason=f"already in the store as {entry.name} (the same bytes)")
    if entry is not None or alias_target(catalog, model.name) is not None:
        return replace(base, action="name-taken", reason=f"the name {model.name} is another model's in this store "
                       f"(blazar show {model.name}); it is left as it is")
    return base


def plan(catalog: CatalogState, found: Iterable[ForeignModel], only: Iterable[str] = ()) -> list[Row]:
    """What to do with each model found (`only`: just the models of those names). Hashes a file only to tell
    whether a model under the same name already holds its bytes."""
    wanted = list(dict.fromkeys(only))
    chosen = [m for m in found if not wanted or m.name in wanted]
    unknown = [n for n in wanted if n not in {m.name for m in chosen}]
    if unknown:
        names = ", ".join(sorted(m.name for m in found)) or "none"
        raise ForeignStoreError(f"--only {unknown[0]}: no model of that name was found (found: {names})")
    by_source = {m.source: m.name for m in models(catalog) if m.source}
    return [_row(catalog, m, by_source) for m in chosen]


async def run(app: Blazar, rows: list[Row]) -> list[Row]:
    """Import every row planned as "import"; one that fails leaves nothing behind and does not stop the others."""
    from blazar.store.foreign.carry import carry  # the store's import paths: only a run needs them

    done: list[Row] = []
    for row in rows:
        if row.action != "import" or row.model is None:
            done.append(row)
            continue
        try:
            carried = await carry(app, row.model)
        except BlazarError as e:
            done.append(replace(row, outcome="failed", reason=e.message))
            continue
        except OSError as e:
            done.append(replace(row, outcome="failed", reason=f"{e.strerror or e}: {e.filename or row.source}"))
            continue
        done.append(replace(row, outcome="imported", placed=carried.placed, carried=carried.carried,
                            not_carried=carried.not_carried))
    return done
