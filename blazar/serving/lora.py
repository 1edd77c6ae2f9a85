"""A request's LoRA adapters: which of its model's adapters apply, at what scale, as llama-server's per-request
`lora` list, as a `Patch` (blazar/serving/patch.py) the call applies. After the model (and its settings) are resolved,
before routing.

The client names adapters (`lora: [{"name": "N", "scale": 0.8}]`, or llama-server's own `{"id": i, "scale": s}`);
a variant made by an Ollama Modelfile's ADAPTER applies its adapters when the request names none. The engine gets
every adapter the model loads with, in load order, with its scale, 0 for the unnamed. NOTE: always the whole list:
llama-server applies a loaded adapter at its load-time scale to a request without one (even with
--lora-init-without-apply), so a request that says nothing must say 0 for each.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from blazar.errors import Refused
from blazar.instances.live import ResolvedModel
from blazar.serving.patch import NO_PATCH, Patch
from blazar.serving.request import Request

# The engine routes whose body takes a `lora` list.
_ROUTES = frozenset({"/v1/chat/completions", "/v1/completions"})
# A scale beyond this is a mistake, not a style: the tiny test adapter already turns text to noise at 1.
SCALE_MAX = 10.0


def _bad(message: str) -> Refused:
    return Refused(message, reason="invalid_request", http_status=400, error_type="invalid_request_error")


def _scale(entry: dict[str, Any], which: str) -> float:
    scale = entry.get("scale", 1.0)
    if isinstance(scale, bool) or not isinstance(scale, int | float) or not math.isfinite(scale) \
            or abs(scale) > SCALE_MAX:
        raise _bad(f"lora {which}: scale {scale!r} is not a number between -{SCALE_MAX:g} and {SCALE_MAX:g}")
    return float(scale)


def engine_lora(asked: Any, names: list[str], model: str) -> list[dict[str, Any]]:
    """llama-server's `lora` list (every adapter of `names`, in order, with its scale) for the client's `asked`.
    Raises Refused (400) for a list that is not one, an unknown name or id, a bad scale, or an adapter named twice.
    Pure."""
    if not isinstance(asked, list):
        raise _bad('lora must be a list like [{"name": "ADAPTER", "scale": 1.0}]')
    scales = [0.0] * len(names)
    seen: set[int] = set()
    have = ", ".join(names) or "none (blazar lora add adds one)"
    for entry in asked:
        if not isinstance(entry, dict) or ("name" in entry) == ("id" in entry) \
                or set(entry) - {"name", "id", "scale"}:
            raise _bad(f'lora entry {entry!r}: give {{"name": "ADAPTER", "scale": S}} or {{"id": I, "scale": S}}')
        if "name" in entry:
            name = entry["name"]
            if not isinstance(name, str) or name not in names:
                raise _bad(f"{model} has no LoRA adapter named {name!r} (it has: {have})")
            index, which = names.index(name), repr(name)
        else:
            index = entry["id"]
            if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(names):
                raise _bad(f"{model} has no LoRA adapter with id {index!r} (it has: {have}, ids from 0)")
            which = f"id {index}"
        if index in seen:
            raise _bad(f"lora {which} is named twice")
        seen.add(index)
        scales[index] = _scale(entry, which)
    return [{"id": i, "scale": s} for i, s in enumerate(scales)]


def lora_patch(request: Request, body: Mapping[str, Any], resolved: ResolvedModel) -> Patch:
    """The engine body's `lora` for a request to `resolved` (see the module's docstring). A model without adapters
    takes no `lora`: a request naming one is refused."""
    if request.engine_path not in _ROUTES:
        return NO_PATCH
    asked = body.get("lora")
    names = [a.name for a in resolved.loras]
    if asked is None and resolved.settings is not None and resolved.settings.lora:
        asked = [{"name": n, "scale": s} for n, s in resolved.settings.lora.items()]
    if not names:
        if asked:  # [] or absent: nothing asked, nothing to say (the engine has nothing loaded to apply)
            engine_lora(asked, names, resolved.name)  # raises: the message names what is wrong
        return NO_PATCH
    return Patch(fields={"lora": engine_lora([] if asked is None else asked, names, resolved.name)})
