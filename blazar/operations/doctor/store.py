"""The model store against the catalog: every recorded file is there with its recorded size and sha256, and every
file there is recorded. `quick` hashes a random sample within a byte budget (sizes are always checked)."""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from pathlib import Path

from blazar.operations.doctor.report import Check, ok
from blazar.projections.catalog import CatalogState, models

# --quick hashes files in random order until this many bytes are read (at least one file, whatever its size).
QUICK_HASH_BYTES = 1 << 30
# What a pull in progress writes under the store: never a stray file.
PARTIAL_DIR = ".partial"


@dataclass(frozen=True)
class RecordedFile:
    model: str
    path: str  # relative to the models directory
    bytes: int
    sha256: str


def recorded_files(catalog: CatalogState) -> list[RecordedFile]:
    """Each model's one file, or each part of a split one, with its size and hash as imported; and each projector
    (--mmproj) and LoRA adapter (--lora) once, however many models name it."""
    out: list[RecordedFile] = []
    projectors: set[str] = set()
    for m in models(catalog):
        if m.parts:
            out += [RecordedFile(m.name, p.path, p.bytes, p.sha256) for p in m.parts]
        else:
            out.append(RecordedFile(m.name, m.file, m.bytes, m.sha256))
        if m.projector is not None and m.projector.path not in projectors:
            projectors.add(m.projector.path)
            out.append(RecordedFile(m.name, m.projector.path, m.projector.bytes, m.projector.sha256))
        for a in m.loras:  # each LoRA adapter (--lora) once too
            if a.path not in projectors:
                projectors.add(a.path)
                out.append(RecordedFile(m.name, a.path, a.bytes, a.sha256))
    return out


def _sha256(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _to_hash(files: list[RecordedFile], quick: bool) -> list[RecordedFile]:
    if not quick:
        return files
    order = random.sample(files, len(files))
    picked: list[RecordedFile] = []
    budget = QUICK_HASH_BYTES
    for f in order:
        if picked and f.bytes > budget:
            continue
        picked.append(f)
        budget -= f.bytes
    return picked


def model_files(models_dir: Path, catalog: CatalogState, *, quick: bool) -> list[Check]:
    """Three checks: recorded files present and intact, none missing, none unrecorded."""
    files = recorded_files(catalog)
    present = [f for f in files if (models_dir / f.path).is_file()]
    missing = [f for f in files if f not in present]
    wrong_size = [f for f in present if (models_dir / f.path).stat().st_size != f.bytes]
    hashed = _to_hash([f for f in present if f not in wrong_size], quick)
    corrupt = wrong_size + [f for f in hashed if _sha256(models_dir / f.path) != f.sha256]
    how = (f"sha256 of {len(hashed)} of {len(present)} file(s) (--quick: a random sample), sizes of all"
           if quick else f"sha256 and size of {len(present)} file(s)")
    checks: list[Check] = []
    if corrupt:
        checks.append(Check("store", "integrity", "fail", f"{len(corrupt)} file(s) differ from their record ({how}): "
                            + "; ".join(_differs(models_dir, f) for f in corrupt[:5]),
                            fix="; ".join(f"blazar rm {f.model} && blazar pull/import it again" for f in corrupt[:3])))
    else:
        checks.append(ok("store", "integrity", f"{how}: all match" if present else "no model files recorded"))
    if missing:
        checks.append(Check("store", "missing", "fail", f"{len(missing)} recorded file(s) are gone: "
                            + "; ".join(f"{f.model}: {models_dir / f.path}" for f in missing[:5]),
                            fix="; ".join(f"blazar rm {m}" for m in sorted({f.model for f in missing})[:3])
                            + " (then pull or import it again)"))
    else:
        checks.append(ok("store", "missing", f"every recorded file of {len(models(catalog))} model(s) is there"))
    checks.append(_strays(models_dir, {f.path for f in files}))
    return checks


def _differs(models_dir: Path, f: RecordedFile) -> str:
    size = (models_dir / f.path).stat().st_size
    what = f"{size} bytes, recorded {f.bytes}" if size != f.bytes else "sha256 differs from the record"
    return f"{f.model}: {models_dir / f.path} ({what})"


def _strays(models_dir: Path, known: set[str]) -> Check:
    strays: list[Path] = []
    if models_dir.is_dir():
        for p in sorted(models_dir.rglob("*")):
            rel = p.relative_to(models_dir)
            if rel.parts[0] == PARTIAL_DIR or not p.is_file() or str(rel) in known:
                continue
            strays.append(p)
    if not strays:
        return ok("store", "unrecorded", f"no file in {models_dir} without a record")
    return Check("store", "unrecorded", "warn", f"{len(strays)} file(s) in the store with no record: "
                 + ", ".join(str(p) for p in strays[:5]),
                 fix="; ".join(f"blazar import {p} --name NAME (or rm {p})" for p in strays[:3]))
