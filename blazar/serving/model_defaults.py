"""A model's settings applied to one request, after the model is resolved and before it is routed: its system prompt
becomes the first message of a chat that has none, and its default parameters fill what the request left unset (the
request's own value always wins). The template is the engine's (set on its argv), not the request's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from blazar.dialects.ollama import map_options
from blazar.events.model_settings import ModelSettings
from blazar.serving.loop_guard import LoopGuard

if TYPE_CHECKING:
    from blazar.serving.call import Call

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
# A request field that already sets an engine field under another name.
_ALSO = {"max_tokens": ("max_completion_tokens", "n_predict")}
_SYSTEM_ROLES = frozenset({"system", "developer"})
# A generation held to a grammar (a forced tool call, structured output) is not guarded: cut by the guard, its JSON
# would be half-written; its grammar and max_tokens bound it.
_CONSTRAINED = frozenset({"grammar", "json_schema", "response_format"})


def apply_settings(call: Call, settings: ModelSettings) -> bool:
    """Fill `call` from `settings` (see the module's docstring): True when its engine body changed."""
    request = call.request
    if request.embeddings or request.engine_path not in (CHAT, COMPLETIONS):
        return False
    body: dict[str, Any] = dict(call.engine_body())
    changed = False
    if settings.system is not None and request.engine_path == CHAT:
        messages = body.get("messages")
        if isinstance(messages, list) and not any(isinstance(m, dict) and m.get("role") in _SYSTEM_ROLES
                                                  for m in messages):
            # A new list: the client's parsed body (kept for the record) is never changed in place.
            body["messages"] = [{"role": "system", "content": settings.system}, *messages]
            changed = True
    sampling, ctx = map_options(dict(settings.parameters))  # Ollama names -> llama-server's fields (validated)
    for name, value in sampling.items():
        if name in body or any(other in body for other in _ALSO.get(name, ())):
            continue
        body[name] = value
        changed = True
        if name == "max_tokens" and call.max_tokens is None:
            call.max_tokens = int(value)
    if ctx is not None and call.ctx is None:
        call.ctx = ctx
    if changed:
        call.writable_body().update(body)
    return changed


def add_template_defaults(call: Call, stops: tuple[str, ...], sampling: Mapping[str, float], *,
                          loop_guard: bool = False) -> bool:
    """What the template of the request's instance adds to a chat request: its stop strings (a template Blazar ships:
    its end-of-turn marker and the next turns' openers), after the request's own, so a base model that runs on past
    its answer stops where the next speaker would begin; its default sampling (a probed template's: greedy,
    blazar/store/chat_templates.py PROBED_SAMPLING) where the request set none; and, for a streamed answer of a
    template that guards loops and held to no grammar, the engine's per-token timings the guard reads
    (`call.loop_guarded`). True when the engine body changed."""
    if (not stops and not sampling and not loop_guard) or call.request.embeddings \
            or call.request.engine_path != CHAT:
        return False
    body = call.engine_body()
    changes: dict[str, Any] = {name: value for name, value in sampling.items() if name not in body}
    if loop_guard and call.request.stream and call.request.forced is None and not _CONSTRAINED.intersection(body):
        call.loop_guarded = True
        changes.update(LoopGuard.body_changes())
    own = body.get("stop")
    asked = [own] if isinstance(own, str) else list(own) if isinstance(own, list) else []
    added = [s for s in stops if s not in asked]
    if added:
        changes["stop"] = [*asked, *added]
    if not changes:
        return False
    call.writable_body().update(changes)
    return True
