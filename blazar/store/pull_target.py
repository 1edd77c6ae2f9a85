"""What `blazar pull TARGET` means: a registry shortname, `owner/repo[:QUANT]`, or `owner/repo/path/file.gguf`.

Pure parsing; also the default store name each kind of target gets.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from blazar.errors import InvalidModelName

_HUB_PREFIXES = ("hf.co/", "huggingface.co/", "https://huggingface.co/", "https://hf.co/")
_PART = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_REPO = re.compile(rf"^(?P<owner>{_PART})/(?P<repo>{_PART})(?::(?P<quant>[A-Za-z0-9_.-]+))?$")
_FILE = re.compile(rf"^(?P<owner>{_PART})/(?P<repo>{_PART})/(?P<path>(?:{_PART}/)*{_PART}\.gguf)$", re.IGNORECASE)
_SHORT = re.compile(rf"^{_PART}(?::{_PART})?$")


@dataclass(frozen=True)
class Target:
    text: str
    kind: Literal["registry", "hub-quant", "hub-file"]
    shortname: str | None = None
    repo: str | None = None  # owner/repo
    quant: str | None = None
    path: str | None = None

    def default_name(self) -> str:
        if self.kind == "registry":
            assert self.shortname is not None
            return self.shortname
        assert self.repo is not None
        base = self.repo.split("/", 1)[1]
        base = re.sub(r"[-_.]gguf$", "", base, flags=re.IGNORECASE).lower()
        if self.kind == "hub-file":
            assert self.path is not None
            stem = self.path.rsplit("/", 1)[-1][: -len(".gguf")].lower()
            return re.sub(r"-\d{5}-of-\d{5}$", "", stem)
        return f"{base}:{(self.quant or 'Q4_K_M').lower()}"


def parse_target(text: str) -> Target:
    t = text.strip()
    for prefix in _HUB_PREFIXES:
        if t.lower().startswith(prefix):
            t = t[len(prefix):]
            break
    if m := _FILE.match(t):
        return Target(text=text.strip(), kind="hub-file", repo=f"{m['owner']}/{m['repo']}", path=m["path"])
    if m := _REPO.match(t):
        return Target(text=text.strip(), kind="hub-quant", repo=f"{m['owner']}/{m['repo']}", quant=m["quant"])
    if "/" not in t and _SHORT.match(t):
        return Target(text=text.strip(), kind="registry", shortname=t)
    raise InvalidModelName(
        f"cannot pull {text!r}: expected a registry name (gemma3-270m), owner/repo[:QUANT] "
        "(ggml-org/gemma-3-270m-it-GGUF:Q8_0) or owner/repo/file.gguf"
    )
