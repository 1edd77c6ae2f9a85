"""Where a path the log names may lead: into the home's own directory for that kind of file, and nowhere else.

The log is data, not authority over the machine: a restored snapshot or a hand-appended row is read like any other,
so every path an event names (a model's file or a split model's parts, an engine's files, a KV-bank save, an
instance's log) is checked twice:

    untrusted(event)         pure, at fold and at restore: each path the event names that could lead out of its
                             directory (absolute, `..`, a name with a separator), and why. The projections fold such
                             an event into no usable entry (kept under `refused`); a restore refuses the snapshot.
    inside(root, path, what) right before a file is opened, executed, unlinked or removed: `path`, with symlinks
                             resolved and `..` collapsed, lies strictly inside `root` (itself resolved), else
                             OutsideHome naming `what` (the event) and where the path really leads.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from blazar.errors import OutsideHome
from blazar.events.base import Event
from blazar.events.engines import EngineInstalled
from blazar.events.instances import InstanceStarted, InstanceStarting
from blazar.events.lora import LoraAdded
from blazar.events.model_settings import ModelVariantCreated
from blazar.events.models import ModelImported
from blazar.events.projectors import ModelProjectorSet
from blazar.events.sessions import SessionDropped, SessionRemoved, SessionSaved

# The KV bank's files, relative to the data directory: slots/<model's store name>/<hash>.bin (kv_bank.py).
BANK_DIR = "slots"
# Projectors, relative to the models directory: mmproj/<sha256>.gguf (blazar/store/projectors.py).
PROJECTOR_DIR = "mmproj"
# LoRA adapters, relative to the models directory: lora/<sha256>.gguf (blazar/store/lora.py).
LORA_DIR = "lora"


@dataclass(frozen=True, slots=True)
class Untrusted:
    """One path (or name that becomes a path) an event gives, which could lead out of its directory."""

    field: str
    value: str
    why: str

    def __str__(self) -> str:
        return f"{self.field} {self.value!r} {self.why}"


def relative_problem(rel: str) -> str | None:
    """Why `rel` cannot name something below the directory it is relative to; None when it can (lexically: what
    the path says, not where symlinks on this disk would take it: `inside` checks that at use)."""
    if not rel:
        return "is empty"
    if "\0" in rel:
        return "holds a NUL byte"
    p = PurePosixPath(rel)
    if p.is_absolute():
        return "is absolute"
    if ".." in p.parts:
        return "climbs out with '..'"
    if not p.parts:
        return "names the directory itself"
    return None


def name_problem(name: str) -> str | None:
    """Why `name` cannot be one directory entry (a model's or engine's name becomes a file or directory name)."""
    if not name or name in (".", ".."):
        return "is not a name"
    if "/" in name or "\\" in name or "\0" in name:
        return "holds a path separator"
    return None


def _check(out: list[Untrusted], field: str, value: str, problem: str | None) -> None:
    if problem is not None:
        out.append(Untrusted(field, value, problem))


def _model(ev: ModelImported, out: list[Untrusted]) -> None:
    _check(out, "name", ev.name, name_problem(ev.name))  # its slot directory is named after it
    _check(out, "path", ev.path, relative_problem(ev.path))
    dirs = set()
    for i, sh in enumerate(ev.shards):
        field = f"shards[{i}].path"
        _check(out, field, sh.path, relative_problem(sh.path))
        parts = PurePosixPath(sh.path).parts
        # A split model is one directory of parts (`rm` removes that directory): <dir>/<part>, nothing else.
        if len(parts) != 2:
            out.append(Untrusted(field, sh.path, "is not <directory>/<part>, as a split model's parts are stored"))
        dirs.add(parts[0] if parts else "")
    if len(dirs) > 1:
        out.append(Untrusted("shards", ", ".join(sh.path for sh in ev.shards), "lie in more than one directory"))
    if ev.shards and ev.path != ev.shards[0].path:
        out.append(Untrusted("path", ev.path, "is not the split model's first part"))


def _engine(ev: EngineInstalled, out: list[Untrusted]) -> None:
    _check(out, "tag", ev.tag, name_problem(ev.tag))  # the engine's directory is engines/<tag>
    _check(out, "binary", ev.binary, relative_problem(ev.binary))
    for i, f in enumerate(ev.files):
        _check(out, f"files[{i}].path", f.path, relative_problem(f.path))
        if f.link_to is not None:
            # A soname link points at another file of the engine: resolved from the link's own directory.
            target = f.link_to if PurePosixPath(f.link_to).is_absolute() else posixpath.normpath(
                posixpath.join(posixpath.dirname(f.path), f.link_to))
            _check(out, f"files[{i}].link_to", f.link_to, relative_problem(target))
    if not any(f.path == ev.binary and f.link_to is None for f in ev.files):
        # NOTE: the binary must be a recorded file, so that the check before each spawn hashes what is executed.
        out.append(Untrusted("binary", ev.binary, "is not one of the engine's recorded files"))


def _bank_file(field: str, file: str, out: list[Untrusted]) -> None:
    problem = relative_problem(file)
    if problem is None:
        parts = PurePosixPath(file).parts
        if len(parts) != 3 or parts[0] != BANK_DIR:
            problem = f"is not {BANK_DIR}/<model>/<file>, where the KV bank keeps its saves"
    _check(out, field, file, problem)


def _projector(ev: ModelProjectorSet, out: list[Untrusted]) -> None:
    _check(out, "name", ev.name, name_problem(ev.name))
    _store_file(ev.path, PROJECTOR_DIR, "projectors", out)


def _store_file(path: str, directory: str, what: str, out: list[Untrusted]) -> None:
    problem = relative_problem(path)
    if problem is None:
        parts = PurePosixPath(path).parts
        if len(parts) != 2 or parts[0] != directory:
            problem = f"is not {directory}/<file>, where the store keeps {what}"
    _check(out, "path", path, problem)


def untrusted(event: Event) -> list[Untrusted]:
    """Every path `event` names that could lead out of the home's directory for it; [] for a trustworthy event (and
    for every event that names no path)."""
    out: list[Untrusted] = []
    if isinstance(event, ModelImported):
        _model(event, out)
    elif isinstance(event, ModelVariantCreated):
        _check(out, "name", event.name, name_problem(event.name))
    elif isinstance(event, ModelProjectorSet):
        _projector(event, out)
    elif isinstance(event, LoraAdded):
        _check(out, "model", event.model, name_problem(event.model))
        _store_file(event.path, LORA_DIR, "LoRA adapters", out)
    elif isinstance(event, EngineInstalled):
        _engine(event, out)
    elif isinstance(event, SessionSaved | SessionDropped):
        _bank_file("file", event.file, out)
    elif isinstance(event, SessionRemoved):
        for i, f in enumerate(event.files):
            _bank_file(f"files[{i}]", f, out)
    elif isinstance(event, InstanceStarting | InstanceStarted):
        _check(out, "instance_id", event.instance_id, name_problem(event.instance_id))  # run/instances/<id>.pid
        if event.log_path:
            _check(out, "log_path", event.log_path, relative_problem(event.log_path))
    return out


def describe(seq: int, type_name: str, problems: list[Untrusted]) -> str:
    """One line naming the event and each untrusted path in it."""
    return f"seq {seq} {type_name}: " + "; ".join(str(p) for p in problems)


def inside(root: Path, path: Path | str, *, what: str) -> Path:
    """`root / path` (path relative to root, or absolute), when it resolves strictly inside `root`; else
    OutsideHome. `what` names where the path came from ("model.imported (seq 12) of gemma")."""
    full = root / path
    try:
        real, base = full.resolve(), root.resolve()
    except (OSError, RuntimeError) as e:  # a symlink loop (RuntimeError before Python 3.13)
        raise OutsideHome(f"{what} names {full}, which cannot be resolved ({e}): refused") from None
    if real == base or not real.is_relative_to(base):
        where = str(full) if real == full else f"{full} (which leads to {real})"
        raise OutsideHome(f"{what} names {where}, outside {base}: refused; the log is not trusted with paths "
                          "(blazar doctor lists such events)")
    return full
