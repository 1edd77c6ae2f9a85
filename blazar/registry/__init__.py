"""The model registry: shortnames (`blazar pull gemma3-270m`) mapped to verified sources and the settings a pulled
model starts with (its chat template, system prompt, default parameters), read from the `models.toml` data file
beside this module."""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.resources import files
from typing import Any, Literal


@dataclass(frozen=True)
class Source:
    kind: Literal["python-package", "hub"]
    sha256: str | None = None
    package: str | None = None  # python-package: the importable module
    requirements: list[str] = field(default_factory=list)  # python-package: what pip installs (PyPI requirements)
    file: str | None = None  # the GGUF file name (in the package, or in the repo)
    repo: str | None = None  # hub: owner/repo
    # python-package, a model of several files (a whisper model, a piper voice): each file of the model, assembled
    # from "package:path" pieces in order (a file split across packages is their concatenation), and each file's
    # pinned sha256. `package` is then the one whose absence means none is installed.
    files: dict[str, list[str]] = field(default_factory=dict)
    sha256s: dict[str, str] = field(default_factory=dict)

    def modules(self) -> list[str]:
        """python-package: the modules it reads, the packages of its pieces and `package`, all to be importable."""
        pieces = {piece.split(":", 1)[0] for parts in self.files.values() for piece in parts}
        return sorted(pieces | ({self.package} if self.package else set()))


@dataclass(frozen=True)
class Entry:
    name: str
    description: str
    sources: list[Source] = field(default_factory=list)
    # What the model is given once pulled (blazar/store/model_settings.py validates them); None/{}: nothing.
    template: str | None = None  # a llama.cpp built-in template name, for a GGUF that carries none
    system: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    kind: str = "llama-server"  # what runs it (a ModelImported kind): llama-server, whisper or piper


def load(text: str | None = None) -> dict[str, Entry]:
    """The registry, from `text` (tests) or the packaged models.toml."""
    if text is None:
        text = files("blazar.registry").joinpath("models.toml").read_text()
    data = tomllib.loads(text)
    out: dict[str, Entry] = {}
    for name, spec in data.get("models", {}).items():
        sources = [Source(**s) for s in spec.get("sources", [])]
        out[name] = Entry(name=name, description=spec.get("description", ""), sources=sources,
                          template=spec.get("template"), system=spec.get("system"),
                          parameters=dict(spec.get("parameters", {})), kind=spec.get("kind", "llama-server"))
    return out


def to_install(entry: Entry, importable: Callable[[str], bool]) -> list[str]:
    """What pip must install before `entry` can be pulled: nothing while a source is usable as it is (a hub source,
    or a python-package one whose modules all import), else the first python-package source's requirements."""
    for source in entry.sources:
        if source.kind == "hub" or all(importable(m) for m in source.modules()):
            return []
    return next((s.requirements for s in entry.sources if s.kind == "python-package"), [])
