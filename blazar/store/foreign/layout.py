"""What the GGUF-directory stores (LM Studio, the Hugging Face cache, llama.cpp's cache) have in common: GGUFs in a
directory, split ones as `STEM-0000i-of-0000N.gguf`, a projector (`mmproj*.gguf`) beside the model, and a repo
(`ORG/REPO`) each model came from. The readers find the files; this turns them into `ForeignModel`s with names.

A name is what a user recognises: the repo without its `-GGUF` suffix, tagged with the quantization the file name
carries (`lmstudio-community/gemma-3-270m-it-GGUF/gemma-3-270m-it-Q4_K_M.gguf` -> `gemma-3-270m-it:q4_k_m`).
Where two models would get one name, each takes its publisher in front (`lmstudio-community-gemma-3-270m-it:q4_k_m`).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from blazar.store.foreign.found import ForeignModel, ForeignTool, Skipped

SPLIT = re.compile(r"^(?P<stem>.+)-(?P<part>\d{5})-of-(?P<parts>\d{5})\.gguf$", re.IGNORECASE)
_QUANT = re.compile(r"(?<![A-Za-z0-9])((?:I?Q|TQ)\d(?:_[A-Za-z0-9]+)*|BF16|F16|F32)(?![A-Za-z0-9])", re.IGNORECASE)
_UNSAFE = re.compile(r"[^a-z0-9._-]+")


@dataclass(frozen=True)
class Candidate:
    """A model a reader found before names are settled: its files and where it came from."""

    tool: ForeignTool
    weights: tuple[Path, ...]
    source: str
    repo: str | None  # the repo's own name ("gemma-3-270m-it-GGUF"); None when the store does not say
    publisher: str | None  # who published it ("lmstudio-community", the hub org)
    projector: Path | None = None


def is_projector(path: Path) -> bool:
    return "mmproj" in path.name.lower()


def quant_of(filename: str) -> str | None:
    found = _QUANT.findall(filename)
    return found[-1].upper() if found else None


def group_weights(files: list[Path], tool: ForeignTool) -> tuple[list[tuple[Path, ...]], list[Skipped]]:
    """The models among `files` (GGUFs of one directory, projectors left out): a plain file is one model, the
    parts of a split one are one model in order; a split model missing a part is skipped, saying which."""
    models: list[tuple[Path, ...]] = []
    skipped: list[Skipped] = []
    splits: dict[str, list[tuple[int, int, Path]]] = {}
    for f in sorted(files):
        m = SPLIT.match(f.name)
        if m is None:
            models.append((f,))
        else:
            splits.setdefault(str(f.parent / m["stem"]), []).append((int(m["part"]), int(m["parts"]), f))
    for stem, parts in sorted(splits.items()):
        count = parts[0][1]
        have = {p for p, n, _ in parts if n == count}
        missing = sorted(set(range(1, count + 1)) - have)
        if missing or len(parts) != count:
            skipped.append(Skipped(tool, f"{stem}-*-of-{count:05d}.gguf", "a split model with parts missing ("
                                   f"has {len(have)} of {count}: missing {', '.join(map(str, missing)) or 'none'}; "
                                   "an interrupted download?)"))
            continue
        models.append(tuple(f for _, _, f in sorted(parts)))
    return models, skipped


def projector_for(weights: tuple[Path, ...], projectors: list[Path]) -> Path | None:
    """Of the projectors beside a model: the one in the model's own precision, else F16 (what converters write by
    default), else the first by name."""
    if not projectors:
        return None
    found = sorted(projectors)
    own = quant_of(weights[0].name)
    for wanted in (own, "F16"):
        match = [p for p in found if wanted is not None and quant_of(p.name) == wanted]
        if match:
            return match[0]
    return found[0]


def _clean(text: str, limit: int) -> str:
    """`text` as a part of a Blazar model name (blazar/store/models.py check_name): lower case, `[a-z0-9._-]`,
    starting with a letter or digit."""
    out = _UNSAFE.sub("-", text.lower()).lstrip("._-")[:limit].rstrip("._-")
    return out or "model"


def _stem(weights: tuple[Path, ...]) -> str:
    m = SPLIT.match(weights[0].name)
    return m["stem"] if m else weights[0].name.removesuffix(".gguf").removesuffix(".GGUF")


def names_of(candidate: Candidate) -> tuple[str, str]:
    """(the name it gets, the one with its publisher in front for when another model would get the same)."""
    stem = _stem(candidate.weights)
    quant = quant_of(stem)
    if candidate.repo is not None:
        model = re.sub(r"[-_.]gguf$", "", candidate.repo, flags=re.IGNORECASE)
        tag = quant or stem
    else:  # a file on its own: its name without the quantization, tagged with it
        model = re.sub(r"[-_.]+$", "", stem[: stem.upper().rfind(quant)]) if quant else stem
        tag = quant or "latest"
    publisher = f"{candidate.publisher}-" if candidate.publisher else ""
    tag = _clean(tag, 64)
    return f"{_clean(model, 100)}:{tag}", f"{_clean(publisher + model, 120)}:{tag}"


def settle(candidates: list[Candidate], carried_extra: tuple[str, ...] = ()) -> list[ForeignModel]:
    """The candidates as `ForeignModel`s with distinct names, decided by the whole set (the same store gives the
    same names on every run): a name two would share goes to neither; each takes its publisher's, and what still
    collides is numbered in order of source."""
    ordered = sorted(candidates, key=lambda c: c.source)
    pairs = [names_of(c) for c in ordered]
    shared = Counter(first for first, _ in pairs)
    chosen = [second if shared[first] > 1 else first for first, second in pairs]
    seen: Counter[str] = Counter()
    out: list[ForeignModel] = []
    for cand, name in zip(ordered, chosen, strict=True):
        seen[name] += 1
        if seen[name] > 1:
            model, _, tag = name.partition(":")
            name = f"{model}:{tag[:60]}-{seen[name]}"
        carried = ("weights" + (f" ({len(cand.weights)} parts)" if len(cand.weights) > 1 else ""),
                   *(["projector"] if cand.projector is not None else []), *carried_extra)
        out.append(ForeignModel(tool=cand.tool, name=name, source=cand.source, weights=cand.weights,
                                projector=cand.projector, carried=carried))
    return out
