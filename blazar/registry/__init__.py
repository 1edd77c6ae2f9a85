"""The model registry: shortnames (`blazar pull gemma3-270m`) mapped to verified sources, read from the
`models.toml` data file beside this module."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from importlib.resources import files
from typing import Literal


@dataclass(frozen=True)
class Source:
    kind: Literal["python-package", "hub"]
    sha256: str | None = None
    package: str | None = None  # python-package: the importable module
    pip: str | None = None  # python-package: what to `pip install`
    file: str | None = None  # the GGUF file name (in the package, or in the repo)
    repo: str | None = None  # hub: owner/repo


@dataclass(frozen=True)
class Entry:
    name: str
    description: str
    sources: list[Source] = field(default_factory=list)


def load(text: str | None = None) -> dict[str, Entry]:
    """The registry, from `text` (tests) or the packaged models.toml."""
    if text is None:
        text = files("blazar.registry").joinpath("models.toml").read_text()
    data = tomllib.loads(text)
    out: dict[str, Entry] = {}
    for name, spec in data.get("models", {}).items():
        sources = [Source(**s) for s in spec.get("sources", [])]
        out[name] = Entry(name=name, description=spec.get("description", ""), sources=sources)
    return out
