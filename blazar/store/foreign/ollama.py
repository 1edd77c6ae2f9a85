"""Ollama's store, read as Ollama lays it out (its manifest/paths.go, manifest/manifest.go, server/images.go):

    MODELS/manifests/HOST/NAMESPACE/MODEL/TAG   a Docker v2 manifest (JSON): a config blob and layers, each with
                                                its mediaType, digest (sha256:HEX) and size
    MODELS/blobs/sha256-HEX                     each layer's bytes, named by its digest

MODELS is `OLLAMA_MODELS`, else ~/.ollama/models; Ollama's Linux install script runs the service as the user
`ollama` whose home is /usr/share/ollama, so /usr/share/ollama/.ollama/models where the first is absent.

A model's layers, by media type (application/vnd.ollama.image.*): `model` the GGUF weights, `projector` a vision
projector, `adapter` a LoRA adapter, `template` (older: `prompt`) its Go chat template, `system` its system prompt,
`params` its parameters (JSON), `license`, `messages` (a conversation it starts from). The name is the manifest's
path as `ollama list` shows it: `llama3.2:3b` for registry.ollama.ai/library/llama3.2/3b.

Only names, digests (hex) and files inside MODELS are followed: a manifest cannot name a path.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from blazar.dialects.go_template import to_jinja
from blazar.errors import InvalidModelSettings, ModelFileError, TemplateNotConvertible
from blazar.store.foreign.found import ForeignAdapter, ForeignModel, Skipped
from blazar.store.foreign.ollama_params import carried_parameters
from blazar.store.model_settings import check_system, parse_template

SERVICE_ROOT = Path("/usr/share/ollama/.ollama/models")
DEFAULT_HOST = "registry.ollama.ai"
MANIFEST_MEDIA_TYPE = "application/vnd.docker.distribution.manifest.v2+json"
_IMAGE = "application/vnd.ollama.image."
_DIGEST = re.compile(r"sha256[:-]([0-9a-fA-F]{64})")
_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,349}")  # a name part as Ollama accepts one (types/model/name.go)
_MANIFEST_BYTES = 1 << 20
_TEXT_BYTES = 1 << 20  # a template, system prompt or params blob read whole: more is not one Ollama wrote
_NOT_CARRIED = {
    "license": "license: not carried (Blazar keeps no license text; it stays in Ollama's store)",
    "messages": "messages: Ollama's MESSAGE turns (a conversation the model starts from) are not carried",
    "draft": "draft: Ollama's draft model is not carried (blazar drafts MODEL lists drafts in the store)",
    "embed": "embed: a deprecated embeddings layer Ollama itself ignores",
}


def default_root(env: Mapping[str, str], service_root: Path = SERVICE_ROOT) -> Path:
    """Where Ollama keeps its models: `OLLAMA_MODELS`; else ~/.ollama/models; else, where that is absent and the
    Linux service's store exists, /usr/share/ollama/.ollama/models."""
    if env.get("OLLAMA_MODELS"):
        return Path(env["OLLAMA_MODELS"]).expanduser()
    home = Path(env["HOME"]) if env.get("HOME") else Path.home()
    user = home / ".ollama" / "models"
    return service_root if not user.is_dir() and service_root.is_dir() else user


def find(root: Path) -> list[ForeignModel]:
    return [e for e in _read(root) if isinstance(e, ForeignModel)]


def skipped(root: Path) -> list[Skipped]:
    return [e for e in _read(root) if isinstance(e, Skipped)]


def blazar_name(host: str, namespace: str, model: str, tag: str) -> str:
    """The name Blazar serves an Ollama model under: Ollama's short name (`llama3.2:3b`); a namespace or another
    registry joined by "-" (`user-model:tag`, `hf.co-org-repo:tag`), since Blazar's names hold no "/"."""
    if host.lower() == DEFAULT_HOST:
        base = model if namespace.lower() == "library" else f"{namespace}-{model}"
    else:
        base = f"{host.replace(':', '-')}-{namespace}-{model}"
    return f"{base}:{tag}"


def ollama_name(host: str, namespace: str, model: str, tag: str) -> str:
    """The name as `ollama list` shows it (DisplayShortest)."""
    if host.lower() != DEFAULT_HOST:
        return f"{host}/{namespace}/{model}:{tag}"
    return f"{model}:{tag}" if namespace.lower() == "library" else f"{namespace}/{model}:{tag}"


# -- reading ------------------------------------------------------------------------------------------------------


def _read(root: Path) -> list[ForeignModel | Skipped]:
    manifests = root / "manifests"
    base = root.resolve()
    out: list[ForeignModel | Skipped] = []
    for path in sorted(manifests.glob("*/*/*/*")):  # as Ollama globs them: HOST/NAMESPACE/MODEL/TAG
        if not path.is_file():
            continue
        if not path.resolve().is_relative_to(base):
            out.append(Skipped("ollama", str(path), "the manifest is a link out of Ollama's store"))
            continue
        parts = path.relative_to(manifests).parts
        if not all(_PART.fullmatch(p) for p in parts):
            out.append(Skipped("ollama", str(path), "not a model name Ollama reads"))
            continue
        try:
            out.append(_model(root, base, path, parts))
        except ModelFileError as e:  # this model is passed over, with why; the others are still read
            out.append(Skipped("ollama", str(path), e.message))
    return out


def _model(root: Path, base: Path, path: Path, parts: tuple[str, ...]) -> ForeignModel:
    manifest = _manifest(path)
    name = blazar_name(*parts)
    shown = ollama_name(*parts)
    carried: list[str] = []
    left: list[str] = [] if shown == name else [
        f"name: Ollama's {shown} holds '/', which Blazar's names cannot; served as {name}"]
    config = _json_blob(root, base, manifest["config"], "config") if manifest.get("config") else {}
    fmt = config.get("model_format") if isinstance(config, dict) else None
    if fmt not in (None, "", "gguf"):
        raise ModelFileError(f"its weights are {fmt}, not GGUF (a model for Ollama's own engine)")
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for layer in manifest["layers"]:
        kind = layer["mediaType"].removeprefix(_IMAGE) if layer["mediaType"].startswith(_IMAGE) else ""
        by_kind.setdefault(kind, []).append(layer)
    weights = by_kind.pop("model", [])
    if len(weights) != 1:
        extra = " (its tensors are layers for Ollama's own engine)" if "tensor" in by_kind else ""
        raise ModelFileError(f"{len(weights)} GGUF weight layers, where one is expected{extra}")
    gguf = _blob(root, base, weights[0])
    with gguf.open("rb") as f:
        if f.read(4) != b"GGUF":
            raise ModelFileError("its weights layer is not a GGUF file")
    carried.append("weights")
    projector = None
    for n, layer in enumerate(by_kind.pop("projector", [])):
        if n == 0:
            projector = _blob(root, base, layer)
            carried.append("projector")
        else:
            left.append("projector: a second projector is not carried (Blazar pairs one with a model)")
    adapters = tuple(ForeignAdapter(f"adapter-{_hex(layer)[:12]}", _blob(root, base, layer))
                     for layer in by_kind.pop("adapter", []))
    carried += [f"adapter {a.name}" for a in adapters]
    template = _template(root, base, by_kind.pop("template", []) + by_kind.pop("prompt", []), carried, left)
    system = None
    for layer in by_kind.pop("system", [])[-1:]:
        try:
            system = check_system(_text_blob(root, base, layer, "system"))
            carried.append("system")
        except InvalidModelSettings as e:
            left.append(e.message)
    pairs: tuple[tuple[str, str], ...] = ()
    for layer in by_kind.pop("params", [])[-1:]:
        params = _json_blob(root, base, layer, "params")
        pairs, words, refused = carried_parameters(params if isinstance(params, dict) else {})
        carried += words
        left += refused
    for kind, layers in sorted(by_kind.items()):
        left.append(_NOT_CARRIED.get(kind, f"layer {layers[0]['mediaType']}: not carried"))
    return ForeignModel(tool="ollama", name=name, source=str(path), weights=(gguf,), projector=projector,
                        adapters=adapters, template=template, system=system, parameters=pairs,
                        carried=tuple(carried), not_carried=tuple(left))


def _template(root: Path, base: Path, layers: list[dict[str, Any]], carried: list[str], left: list[str]
              ) -> str | None:
    """The Go template (the last layer, as Ollama reads them) as Jinja; None with the reason where it is not."""
    if not layers:
        return None
    go = _text_blob(root, base, layers[-1], "template")
    try:
        jinja = to_jinja(go)
        parse_template(jinja)
    except (TemplateNotConvertible, InvalidModelSettings) as e:
        left.append(f"template: {e.message}; the GGUF's own chat template is used (else its architecture's)")
        return None
    carried.append("template (converted to Jinja)")
    return jinja


def _manifest(path: Path) -> dict[str, Any]:
    if path.stat().st_size > _MANIFEST_BYTES:
        raise ModelFileError("the manifest is larger than any Ollama writes")
    try:
        doc = orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError:
        raise ModelFileError("the manifest is not JSON") from None
    if not isinstance(doc, dict) or doc.get("schemaVersion") != 2 or not isinstance(doc.get("layers"), list):
        raise ModelFileError("not an Ollama manifest (schemaVersion 2 with layers)")
    for layer in [*doc["layers"], *([doc["config"]] if doc.get("config") else [])]:
        if not (isinstance(layer, dict) and isinstance(layer.get("mediaType"), str)
                and isinstance(layer.get("digest"), str) and isinstance(layer.get("size"), int)):
            raise ModelFileError("a layer without its mediaType, digest and size")
    return doc


def _hex(layer: dict[str, Any]) -> str:
    m = _DIGEST.fullmatch(layer["digest"])
    if m is None:
        raise ModelFileError(f"a layer's digest {layer['digest'][:80]!r} is not sha256:HEX")
    return m.group(1)


def _blob(root: Path, base: Path, layer: dict[str, Any]) -> Path:
    """A layer's blob: named by its digest alone, present, inside the store, of the size the manifest says."""
    path = root / "blobs" / f"sha256-{_hex(layer)}"
    if not path.is_file():
        raise ModelFileError(f"its {layer['mediaType'].removeprefix(_IMAGE)} blob {path.name} is missing")
    if not path.resolve().is_relative_to(base):
        raise ModelFileError(f"its blob {path.name} is a link out of Ollama's store")
    if path.stat().st_size != layer["size"]:
        raise ModelFileError(f"its blob {path.name} is {path.stat().st_size:,} bytes where the manifest says "
                    f"{layer['size']:,} (a download not finished?)")
    return path


def _text_blob(root: Path, base: Path, layer: dict[str, Any], what: str) -> str:
    path = _blob(root, base, layer)
    if layer["size"] > _TEXT_BYTES:
        raise ModelFileError(f"its {what} layer is larger than any Ollama writes")
    try:
        return path.read_bytes().decode()
    except UnicodeDecodeError:
        raise ModelFileError(f"its {what} layer is not UTF-8 text") from None


def _json_blob(root: Path, base: Path, layer: dict[str, Any], what: str) -> Any:
    try:
        return orjson.loads(_text_blob(root, base, layer, what))
    except orjson.JSONDecodeError:
        raise ModelFileError(f"its {what} layer is not JSON") from None
