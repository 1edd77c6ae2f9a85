"""What a model's settings and its instance's template change in one request, as a `Patch` (blazar/serving/patch.py)
the Call applies: after the model is resolved, its system prompt becomes the first message of a chat that has none,
and its default parameters fill what the request left unset (the request's own value always wins); once routed, the
template adds its stops and sampling. The template itself is the engine's (set on its argv), not the request's.
Pure: each reads the request and the engine's body as they are and changes neither.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from blazar.dialects.ollama import map_options
from blazar.events.model_settings import ModelSettings
from blazar.serving.loop_guard import LoopGuard
from blazar.serving.patch import NO_PATCH, Patch
from blazar.serving.request import Request

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
# A request field that already sets an engine field under another name.
_ALSO = {"max_tokens": ("max_completion_tokens", "n_predict")}
_SYSTEM_ROLES = frozenset({"system", "developer"})
# A generation held to a grammar (a forced tool call, structured output) is not guarded: cut by the guard, its JSON
# would be half-written; its grammar and max_tokens bound it.
_CONSTRAINED = frozenset({"grammar", "json_schema", "response_format"})


def settings_patch(request: Request, body: Mapping[str, Any], settings: ModelSettings) -> Patch:
    """What `settings` change in a request whose engine body is `body` (see the module's docstring)."""
    if request.embeddings or request.engine_path not in (CHAT, COMPLETIONS):
        return NO_PATCH
    fields: dict[str, Any] = {}
    if settings.system is not None and request.engine_path == CHAT:
        messages = body.get("messages")
        if isinstance(messages, list) and not any(isinstance(m, dict) and m.get("role") in _SYSTEM_ROLES
                                                  for m in messages):
            # A new list: the client's parsed body (kept for the record) is never changed in place.
            fields["messages"] = [{"role": "system", "content": settings.system}, *messages]
    sampling, ctx = map_options(dict(settings.parameters))  # Ollama names -> llama-server's fields (validated)
    max_tokens = None
    for name, value in sampling.items():
        if name in body or any(other in body for other in _ALSO.get(name, ())):
            continue
        fields[name] = value
        if name == "max_tokens":
            max_tokens = int(value)
    return Patch(fields=fields, max_tokens=max_tokens, ctx=ctx)


def template_patch(request: Request, body: Mapping[str, Any], stops: tuple[str, ...], sampling: Mapping[str, float],
                   *, loop_guard: bool = False) -> Patch:
    """What the template of the request's instance adds to a chat request: its stop strings (a template Blazar ships:
    its end-of-turn marker and the next turns' openers), after the request's own, so a base model that runs on past
    its answer stops where the next speaker would begin; its default sampling (a probed template's: greedy,
    blazar/store/chat_templates.py PROBED_SAMPLING) where the request set none; and, for a streamed answer of a
    template that guards loops and held to no grammar, the engine's per-token timings the guard reads (the patch's
    `loop_guarded`)."""
    if (not stops and not sampling and not loop_guard) or request.embeddings or request.engine_path != CHAT:
        return NO_PATCH
    changes: dict[str, Any] = {name: value for name, value in sampling.items() if name not in body}
    guarded = loop_guard and request.stream and request.forced is None and not _CONSTRAINED.intersection(body)
    if guarded:
        changes.update(LoopGuard.body_changes())
    own = body.get("stop")
    asked = [own] if isinstance(own, str) else list(own) if isinstance(own, list) else []
    added = [s for s in stops if s not in asked]
    if added:
        changes["stop"] = [*asked, *added]
    return Patch(fields=changes, loop_guarded=guarded)
