"""The Ollama dialect's model-management routes: /, /api/version, /api/tags, /api/ps, /api/show, /api/delete,
/api/copy (/api/create is blazar/api/ollama_create.py). Errors answer in Ollama's shape `{"error": "..."}` (rendered
here, not by blazar/api/errors.py, which speaks OpenAI's)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, TypeVar

import falcon
import falcon.asgi
import orjson
from gguf.constants import LlamaFileType
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, StrictStr, ValidationError

import blazar
from blazar.adapters.engines.kinds import ROUTE_PATHS, engine_kind
from blazar.api import bounds
from blazar.api.auth import Access, principal_of
from blazar.api.bounds import MAX_NAME_CHARS
from blazar.api.routes import Op, Route
from blazar.api.schemas import TEXT, obj, ref
from blazar.context import Blazar
from blazar.dialects.modelfile import render_modelfile, render_parameters
from blazar.errors import BlazarError, DialectError, ModelNotFound
from blazar.queries.catalog import StoredModel, alias_target, aliases, is_model, model, models
from blazar.queries.ps import instance
from blazar.serving.ports import SupervisorPort
from blazar.store.chat_templates import completion_only, served_template
from blazar.store.model_settings import reranks
from blazar.store.models import alias_model, remove_model, unalias_model
from blazar.store.projectors import projector_info

# What Ollama answers for a model kept loaded forever: a time far past any real expiry.
FOREVER = "2318-01-01T00:00:00Z"

_Body = TypeVar("_Body", bound=BaseModel)



class ModelBody(BaseModel):
    # Like Ollama: fields it does not act on are ignored, and the model is `model` or, as its older clients send it
    # (LiteLLM, aider), `name`.
    model_config = ConfigDict(extra="ignore", title="OllamaModelBody")
    model: StrictStr = Field(min_length=1, max_length=MAX_NAME_CHARS, validation_alias=AliasChoices("model", "name"))


class CopyBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    source: StrictStr = Field(min_length=1, max_length=MAX_NAME_CHARS)
    destination: StrictStr = Field(min_length=1, max_length=MAX_NAME_CHARS)


def rfc3339(ts: float | None) -> str:
    return datetime.fromtimestamp(ts or 0, UTC).isoformat().replace("+00:00", "Z")


def parameter_size(n: int) -> str:
    """Ollama's style: "268.10M", "7.2B"."""
    if n >= 1e9:
        return f"{n / 1e9:.1f}B"
    if n >= 1e6:
        return f"{n / 1e6:.2f}M"
    return f"{n / 1e3:.2f}K" if n >= 1e3 else str(n)


def file_type_number(name: str | None) -> int | None:
    """"Q4_K_M" → 15, llama.cpp's file type number (what the GGUF's general.file_type holds)."""
    for prefix in ("MOSTLY_", "ALL_", ""):
        member = LlamaFileType.__members__.get(f"{prefix}{name}")
        if member is not None:
            return int(member)
    return None


# The format of a model that is no GGUF, by its kind (Ollama's `details.format`).
_FORMATS = {"whisper": "ctranslate2", "piper": "onnx"}


def details(m: StoredModel) -> dict[str, Any]:
    md = m.metadata
    arch = md.architecture or ""
    if not m.gguf:  # a whisper model or a piper voice: no parameter count or quantization is known, none invented
        return {"parent_model": m.base or "", "format": _FORMATS.get(m.kind, m.kind), "family": m.kind,
                "families": [m.kind], "parameter_size": "", "quantization_level": ""}
    return {"parent_model": m.base or "", "format": "gguf", "family": arch, "families": [arch] if arch else None,
            "parameter_size": parameter_size(md.parameter_count), "quantization_level": md.file_type or ""}


def show_other_kind(entry: StoredModel) -> dict[str, Any]:
    """/api/show of a whisper model or a piper voice: its kind and the routes it serves; no GGUF facts, template or
    parameters (it has none)."""
    kind = engine_kind(entry.kind)
    return {"modelfile": f"FROM {entry.name}\n", "parameters": "", "template": "", "details": details(entry),
            "model_info": {"general.architecture": entry.kind}, "capabilities": sorted(kind.routes),
            "modified_at": rfc3339(entry.added_ts),
            "blazar": {"kind": kind.name, "describes": kind.describes,
                       "serves": [ROUTE_PATHS[r] for r in ROUTE_PATHS if kind.serves(r)]}}


async def _body(req: falcon.asgi.Request, model: type[_Body]) -> _Body:
    raw = await req.stream.read()
    try:
        data = bounds.loads(raw)  # the nesting bound, as on every route
    except orjson.JSONDecodeError:
        raise DialectError("invalid JSON body", code="invalid_json") from None
    try:
        return model.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise DialectError(f"{where}: {first['msg']}") from None


async def _guard(resp: falcon.asgi.Response, coro: Any) -> None:
    try:
        await coro
    except BlazarError as e:
        resp.status, resp.media = e.http_status, {"error": e.message}


class Root:
    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.content_type = "text/plain; charset=utf-8"
        resp.text = "Ollama is running"

    async def on_head(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.content_type = "text/plain; charset=utf-8"
        resp.content_length = len("Ollama is running")


# The Ollama API Blazar answers as: Ollama clients read /api/version as Ollama's own and refuse one they find too old
# (Codex --oss asks for 0.13.4 or newer). Blazar's own version goes in its own header.
OLLAMA_API_VERSION = "0.13.5"
VERSION_HEADER = "x-blazar-version"


class Version:
    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.set_header(VERSION_HEADER, blazar.__version__)
        resp.media = {"version": OLLAMA_API_VERSION}


class Tags:
    def __init__(self, app: Blazar) -> None:
        self.app = app

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        rows = []
        names = {m.name: m for m in models(self.app)}
        names.update({a: names[t] for a, t in aliases(self.app).items() if t in names})
        p = principal_of(req)  # a key sees only the models in its scope
        for name, m in sorted(names.items()):
            if p is not None and not p.allows(name, m.name):
                continue
            rows.append({"name": name, "model": name, "modified_at": rfc3339(m.added_ts), "size": m.bytes,
                         "digest": m.sha256, "details": details(m)})
        resp.media = {"models": rows}

    async def on_head(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.status = 200


class Ps:
    def __init__(self, app: Blazar, supervisor: SupervisorPort) -> None:
        self.app, self.supervisor = app, supervisor

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        rows = []
        p = principal_of(req)  # a key sees only the models in its scope, as in /api/tags
        for r in self.supervisor.ps():
            if p is not None and not p.allows(r["model"]):
                continue
            entry = model(self.app, r["model"])
            size = r.get("measured_bytes") or r.get("planned_bytes") or 0
            inst = instance(self.app, r["instance_id"])
            gpu = inst.gpu_layers if inst is not None else 0
            expires = FOREVER if r.get("expires_at") is None else rfc3339(r["expires_at"])
            rows.append({"name": r["model"], "model": r["model"], "size": size,
                         "digest": entry.sha256 if entry is not None else "",
                         "details": details(entry) if entry is not None else {}, "expires_at": expires,
                         "size_vram": size if gpu else 0, "context_length": r.get("ctx_tokens")})
        resp.media = {"models": rows}


class Show:
    def __init__(self, app: Blazar) -> None:
        self.app = app

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        await _guard(resp, self._show(req, resp))

    async def _show(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        body = await _body(req, ModelBody)
        entry = model(self.app, body.model)
        p = principal_of(req)  # a model outside the key's scope is not shown, as if it did not exist
        if entry is None or (p is not None and not p.allows(body.model, entry.name)):
            raise ModelNotFound(f"model '{body.model}' not found")
        if not entry.gguf:
            resp.media = show_other_kind(entry)
            return
        md = entry.metadata
        arch = md.architecture or ""
        info: dict[str, Any] = {"general.architecture": arch, "general.parameter_count": md.parameter_count}
        if (ftype := file_type_number(md.file_type)) is not None:
            info["general.file_type"] = ftype  # a number in the GGUF and in Ollama's answer, as "Q4_K_M" is in details
        if md.name:
            info["general.name"] = md.name
        for key, field in (("context_length", "ctx_train"), ("block_count", "block_count"),
                           ("embedding_length", "embedding_length"), ("attention.head_count", "head_count"),
                           ("attention.head_count_kv", "head_count_kv"), ("attention.key_length", "key_length"),
                           ("attention.value_length", "value_length"),
                           ("attention.sliding_window", "sliding_window"), ("expert_count", "expert_count"),
                           ("expert_used_count", "expert_used_count")):
            if (value := getattr(md, field)) is not None:
                info[f"{arch}.{key}"] = value
        if md.vocab_size is not None:
            info[f"{arch}.vocab_size"] = md.vocab_size
        # Ollama's words: an embedding model embeds only; any other model completes (chat or not).
        caps = ["embedding"] if md.embedding_model else ["completion"]
        caps += ["rerank"] if reranks(md, entry.settings) else []
        # What its projector lets it take in, in Ollama's words ("vision"; "audio" for an audio projector).
        caps += list(entry.projector.modalities) if entry.projector is not None and not md.embedding_model else []
        s = entry.settings
        system = s.system if s is not None else None
        params = dict(s.parameters) if s is not None else {}
        served = served_template(md, s, entry.template_probe.chosen if entry.template_probe is not None else None)
        # The template the model is served with, as text, where Blazar holds it (set, probed or by architecture);
        # the GGUF's own stays in the file ("").
        template = served.template if served.source in ("settings", "probe", "architecture") else None
        media: dict[str, Any] = {
            "modelfile": render_modelfile(entry.name, entry.base or entry.name, s.template if s else None, system,
                                          params, list(s.lora) if s else ()),
            # The defaults a request gets: the model's own, over its probed template's sampling (greedy).
            "parameters": render_parameters({**served.sampling, **params}), "template": template or "",
            "details": details(entry),
            "model_info": info, "capabilities": caps, "modified_at": rfc3339(entry.added_ts),
            # Blazar's own, beside Ollama's fields: whether the model only continues text (`blazar run` reads it),
            # and where its chat template comes from.
            "blazar": {"completion_only": completion_only(md), "template_source": served.source,
                       "template": served.describe()}}
        if system is not None:
            media["system"] = system
        if entry.projector is not None:
            media["projector_info"] = projector_info(entry.projector.metadata)
        resp.media = media


class Delete:
    def __init__(self, app: Blazar) -> None:
        self.app = app

    async def on_delete(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        await _guard(resp, self._delete(req, resp))

    async def _delete(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        body = await _body(req, ModelBody)
        await self.app.runner.catch_up()
        # An alias (what /api/copy makes) is dropped as a name; the model it names stays.
        for name in (body.model, f"{body.model}:latest") if ":" not in body.model else (body.model,):
            if alias_target(self.app, name) is not None and not is_model(self.app, name):
                await unalias_model(self.app, name)
                resp.status = 200
                return
        if model(self.app, body.model) is None:
            raise ModelNotFound(f"model '{body.model}' not found")
        await remove_model(self.app, body.model)
        resp.status = 200


class Copy:
    def __init__(self, app: Blazar) -> None:
        self.app = app

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        await _guard(resp, self._copy(req, resp))

    async def _copy(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        body = await _body(req, CopyBody)
        await self.app.runner.catch_up()
        if model(self.app, body.source) is None:
            raise ModelNotFound(f"model '{body.source}' not found")
        await alias_model(self.app, body.destination, body.source)
        resp.status = 200


_MODEL_EXAMPLE = ({"model": "gemma3-270m"},)
ROUTES = (
    # Listings: the handlers apply the key's scope.
    Route("/", Access.KEY, lambda d: Root(), {
        "get": Op("Ollama's liveness answer", ok_types=(TEXT,)),
        "head": Op("Ollama's liveness answer, head only")}),
    Route("/api/version", Access.KEY, lambda d: Version(), {"get": Op(
        "The Ollama API version Blazar answers as (its own is in x-blazar-version)",
        obj(["version"], version={"const": OLLAMA_API_VERSION}))}),
    Route("/api/tags", Access.KEY, lambda d: Tags(d.app), {
        "get": Op("The models in the store", ref("Tags")),
        "head": Op("The models in the store, head only")}),
    Route("/api/ps", Access.KEY, lambda d: Ps(d.app, d.supervisor), {"get": Op("The loaded models", ref("OllamaPs"))}),
    Route("/api/show", Access.KEY, lambda d: Show(d.app), {"post": Op(
        "One model's details", ref("Show"), statuses=(404,), body=ModelBody, examples=_MODEL_EXAMPLE)}),
    # Model management: the admin's.
    Route("/api/delete", Access.ADMIN, lambda d: Delete(d.app), {"delete": Op(
        "Remove a model, or an alias", statuses=(404, 409), body=ModelBody, examples=_MODEL_EXAMPLE)}),
    Route("/api/copy", Access.ADMIN, lambda d: Copy(d.app), {"post": Op(
        "A new name (an alias) for a model", statuses=(404, 409), body=CopyBody,
        examples=({"source": "gemma3-270m", "destination": "gemma"},))}),
)
