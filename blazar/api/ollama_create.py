"""Ollama's `POST /api/create`: a variant of a stored model (its bytes, not a copy) with a template, a system prompt
and default parameters, from the request's fields or a legacy `modelfile` text (fields win over its lines). Parse and
render only: what is accepted and what is recorded is decided by blazar/store/model_settings.py.

Refused with a 400 in Ollama's shape: quantize, files (blob uploads), messages/MESSAGE, license/LICENSE, a FROM that
is not a model in the store, and an adapter (`adapters`, ADAPTER) that is not one the FROM model already has in the
store (`blazar lora add`): by its name, or (the SDK's `adapters={file: "sha256:..."}`) by its digest.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import falcon
import falcon.asgi
import orjson
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr

from blazar.api.auth import Access
from blazar.api.bounds import MAX_NAME_CHARS
from blazar.api.ollama import _body, _guard
from blazar.api.routes import Op, Route
from blazar.api.schemas import JSON, NDJSON, ref
from blazar.context import Blazar
from blazar.dialects import modelfile
from blazar.errors import DialectError
from blazar.queries.catalog import model
from blazar.store.model_settings import SettingsChange, create_variant, parse_parameters


class CreateBody(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)  # like Ollama: unknown fields are ignored

    model: StrictStr | None = Field(default=None, min_length=1, max_length=MAX_NAME_CHARS)
    name: StrictStr | None = Field(default=None, min_length=1, max_length=MAX_NAME_CHARS)  # the legacy spelling
    from_: StrictStr | None = Field(default=None, alias="from", min_length=1, max_length=MAX_NAME_CHARS)
    template: StrictStr | None = None
    system: StrictStr | None = None
    parameters: dict[str, Any] | None = None
    modelfile: StrictStr | None = None
    stream: StrictBool = True
    # Accepted by Ollama, refused here (see `refusals`).
    quantize: StrictStr | None = None
    files: dict[str, Any] | None = None
    adapters: dict[str, Any] | None = None
    messages: list[Any] | None = None
    license: StrictStr | list[StrictStr] | None = None
    path: StrictStr | None = None


def refusals(body: CreateBody) -> str | None:
    """The first field Blazar cannot act on, as the message to answer with."""
    if body.quantize:
        return ("quantize is not supported: Blazar serves a GGUF as it is; pull the quantization you want "
                "(blazar pull owner/repo:Q4_K_M)")
    if body.files:
        return ("files: uploading model blobs is not supported; FROM must name a model in the store (blazar import "
                "FILE --name NAME adds one)")
    if body.messages:
        return "messages: " + modelfile._REFUSED["message"]
    if body.license:
        return "license: " + modelfile._REFUSED["license"]
    if body.path:
        return "path: reading a Modelfile from the server's disk is not supported; send its text in `modelfile`"
    return None


def _from(value: str | None) -> str:
    if value is None:
        raise DialectError("from: required (the model to make the variant of), or a FROM line in `modelfile`")
    if value.startswith(("/", "./", "../", "~")) or value.lower().endswith(".gguf"):
        raise DialectError(f"FROM {value!r}: must name a model in the store, not a file; import the file first "
                           "(blazar import FILE --name NAME), then FROM NAME")
    return value


def _adapters(app: Blazar, base: str, asked: list[tuple[str, Any]]) -> dict[str, float]:
    """The FROM model's adapters that ADAPTER lines and the `adapters` field name, each applied at scale 1: by
    name, or by the digest of its bytes (the SDK sends {file name: "sha256:<hex>"})."""
    origin = model(app, base)
    if origin is None:
        return {}  # create_variant refuses the FROM, naming it
    by_digest = {a.sha256: a.name for a in origin.loras}
    names: dict[str, float] = {}
    for key, value in asked:
        digest = value.removeprefix("sha256:") if isinstance(value, str) else None
        name = key if key in {a.name for a in origin.loras} else by_digest.get(digest or "")
        if name is None:
            raise DialectError(f"ADAPTER {key!r}: {origin.name} has no LoRA adapter by that name or digest; a file "
                               f"from a client is not taken: add it on the server first (blazar lora add "
                               f"{origin.name} FILE --name NAME), then ADAPTER NAME")
        names[name] = 1.0
    return names


class Create:
    def __init__(self, app: Blazar) -> None:
        self.app = app

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        await _guard(resp, self._create(req, resp))

    async def _create(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        body = await _body(req, CreateBody)
        name = body.model or body.name
        if name is None:
            raise DialectError("model: required (the name of the model to create)")
        if (refused := refusals(body)) is not None:
            raise DialectError(refused)
        mf = modelfile.parse(body.modelfile) if body.modelfile else modelfile.Modelfile()
        pairs = [*mf.parameters, *(body.parameters or {}).items()]
        change = SettingsChange(template=body.template if body.template is not None else mf.template,
                                system=body.system if body.system is not None else mf.system,
                                parameters=parse_parameters(pairs))
        base = _from(body.from_ or mf.from_)
        asked = [*((a, None) for a in mf.adapters), *((k, v) for k, v in (body.adapters or {}).items())]
        if asked:
            change = replace(change, lora=_adapters(self.app, base, asked))
        await create_variant(self.app, name, base, change)
        lines = [{"status": "success"}]
        if body.stream:
            lines = [*self._progress(change, base), *lines]
        resp.status = 200
        resp.content_type = "application/x-ndjson" if body.stream else falcon.MEDIA_JSON
        resp.data = b"".join(orjson.dumps(line) + b"\n" for line in lines) if body.stream else orjson.dumps(lines[0])

    def _progress(self, change: SettingsChange, base: str) -> list[dict[str, str]]:
        """Ollama's status lines for what was done: the base's layer reused, one per setting, the manifest."""
        origin = model(self.app, base)
        lines = [{"status": "reading model metadata"}]
        if origin is not None:
            lines.append({"status": f"using existing layer sha256:{origin.sha256}"})
        for part, given in (("template", change.template), ("system", change.system),
                            ("params", change.parameters), ("adapter", change.lora)):
            if given:
                lines.append({"status": f"creating {part} layer"})
        lines.append({"status": "writing manifest"})
        return lines


_M = "gemma3-270m"
ROUTES = (
    Route("/api/create", Access.ADMIN, lambda d: Create(d.app), {"post": Op(
        "A variant of a model: its bytes, with a template, system prompt and default parameters (NDJSON status lines "
        "unless stream is false)", ref("PullStatus"), statuses=(404, 409), body=CreateBody, ok_types=(JSON, NDJSON),
        line=ref("PullLine"), examples=(
            {"model": "brief", "from": _M, "system": "Answer in one sentence.", "parameters": {"temperature": 0.2},
             "stream": False},
            {"model": "brief", "modelfile": f"FROM {_M}\nPARAMETER temperature 0.2\n", "stream": False}))}),
)
