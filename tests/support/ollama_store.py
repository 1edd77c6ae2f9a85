"""An Ollama store laid out as Ollama writes one (its manifest/layer.go NewLayer, manifest.go WriteManifest): every
layer a blob `blobs/sha256-HEX` named by the sha256 of its bytes, and a Docker v2 manifest at
`manifests/HOST/NAMESPACE/MODEL/TAG` listing the config blob and the layers with their media types. Names parse as
Ollama's `ParseName` does: `llama3.2` is registry.ollama.ai/library/llama3.2:latest."""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Any

MANIFEST_MEDIA_TYPE = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG_MEDIA_TYPE = "application/vnd.docker.container.image.v1+json"
IMAGE = "application/vnd.ollama.image."


def blob(root: Path, data: bytes) -> dict[str, Any]:
    """Store `data` as a blob; its descriptor (digest and size) for a manifest."""
    digest = hashlib.sha256(data).hexdigest()
    path = root / "blobs" / f"sha256-{digest}"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        path.write_bytes(data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


@functools.cache
def _sha256(src: Path, size: int, mtime_ns: int) -> str:  # the demo GGUF is hashed once, however many tags use it
    h = hashlib.sha256()
    with src.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def file_blob(root: Path, src: Path) -> dict[str, Any]:
    """Store the file `src` as a blob, hardlinked (a GGUF is not copied: Ollama's own blobs are files like it)."""
    st = src.stat()
    digest = _sha256(src, st.st_size, st.st_mtime_ns)
    path = root / "blobs" / f"sha256-{digest}"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        os.link(src, path)
    return {"digest": f"sha256:{digest}", "size": st.st_size}


def layer(root: Path, kind: str, data: bytes | Path) -> dict[str, Any]:
    """A layer of media type application/vnd.ollama.image.KIND."""
    desc = file_blob(root, data) if isinstance(data, Path) else blob(root, data)
    return {"mediaType": IMAGE + kind, **desc}


def parse_name(name: str) -> tuple[str, str, str, str]:
    """(host, namespace, model, tag) as Ollama's ParseName fills them in."""
    tag = "latest"
    if name.rfind(":") > name.rfind("/"):
        name, tag = name.rsplit(":", 1)
    parts = name.split("/")
    host, namespace = "registry.ollama.ai", "library"
    if len(parts) == 3:
        host, namespace, model = parts
    elif len(parts) == 2:
        namespace, model = parts
    else:
        (model,) = parts
    return host, namespace, model, tag


def write_manifest(root: Path, name: str, layers: list[dict[str, Any]], config: dict[str, Any] | None = None
                   ) -> Path:
    cfg = blob(root, json.dumps(config or {"model_format": "gguf", "model_family": "gemma3", "file_type": "Q4_K_M",
                                           "model_type": "268.10M"}).encode())
    path = root / "manifests" / Path(*parse_name(name))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"schemaVersion": 2, "mediaType": MANIFEST_MEDIA_TYPE,
                                "config": {"mediaType": CONFIG_MEDIA_TYPE, **cfg}, "layers": layers}) + "\n")
    return path


def add_model(root: Path, name: str, weights: Path, *, template: str | None = None, system: str | None = None,
              params: dict[str, Any] | None = None, projector: Path | None = None, adapters: tuple[Path, ...] = (),
              extra: tuple[tuple[str, bytes], ...] = ()) -> Path:
    """One model as `ollama create`/`pull` leaves it: its manifest's path."""
    layers = [layer(root, "model", weights)]
    if projector is not None:
        layers.append(layer(root, "projector", projector))
    layers += [layer(root, "adapter", a) for a in adapters]
    if template is not None:
        layers.append(layer(root, "template", template.encode()))
    if system is not None:
        layers.append(layer(root, "system", system.encode()))
    if params is not None:
        layers.append(layer(root, "params", json.dumps(params).encode()))
    layers += [layer(root, kind, data) for kind, data in extra]
    return write_manifest(root, name, layers)


# Ollama's gemma3-instruct template (its template/gemma3-instruct.gotmpl).
GEMMA3 = """{{- range $i, $_ := .Messages }}
{{- $last := eq (len (slice $.Messages $i)) 1 }}
{{- if eq .Role "user" }}<start_of_turn>user
{{- if and (eq $i 1) $.System }}
{{ $.System }}
{{ end }}
{{ .Content }}<end_of_turn>
{{ else if eq .Role "assistant" }}<start_of_turn>model
{{ .Content }}<end_of_turn>
{{ end }}
{{- if $last }}<start_of_turn>model
{{ end }}
{{- end }}
"""
