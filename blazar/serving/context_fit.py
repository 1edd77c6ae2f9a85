"""Does a request fit its slot's context? The pure decision `check_context` (blazar/serving/routing.py) acts
on, once it knows the prompt's exact size: as asked, bounded (the output capped at what the context leaves, as
Ollama does: the `max_tokens_over_context` setting, default `bound`), or refused. A prompt that does not fit is
never truncated: where nobody chose the context (no `ctx` setting, no num_ctx of the request or the model), it is
served by an instance whose context holds it (`grown_ctx`), up to the model's trained context; else refused.
"""

from __future__ import annotations

from typing import Any, Literal

from blazar.errors import Refused

Policy = Literal["bound", "refuse"]
# The engine-body fields that carry the output limit, by the routes' spellings (llama-server reads each).
LIMIT_FIELDS = ("max_tokens", "max_completion_tokens", "n_predict", "max_output_tokens")
BOUNDED_HEADER = "x-blazar-max-tokens-bounded"


def decide_max_tokens(prompt_tokens: int, max_tokens: int | None, ctx_tokens: int, model: str,
                      policy: Policy) -> int | None:
    """None when the request fits as asked; else the max_tokens it runs with (the context left after the prompt).
    Raises Refused (400 context_length_exceeded) when the prompt leaves no room for one token, or when the output
    does not fit and the policy is `refuse`."""
    need_out = max_tokens or 0
    if prompt_tokens + need_out <= ctx_tokens and prompt_tokens < ctx_tokens:
        return None
    numbers = {"prompt_tokens": prompt_tokens, "max_tokens": need_out, "ctx_tokens": ctx_tokens}
    if prompt_tokens >= ctx_tokens:
        raise Refused(f"this request's prompt is {prompt_tokens} tokens, but {model}'s context is {ctx_tokens} "
                      "tokens per request, which leaves no room for an answer; shorten the prompt (it is never "
                      "truncated)", reason="context_length_exceeded", http_status=400, observations=numbers)
    if policy == "refuse":
        raise Refused(f"this request needs {prompt_tokens} prompt tokens + {need_out} max_tokens = "
                      f"{prompt_tokens + need_out} tokens, but {model}'s context is {ctx_tokens} tokens per request; "
                      "shorten the prompt or lower max_tokens", reason="context_length_exceeded", http_status=400,
                      observations=numbers)
    return ctx_tokens - prompt_tokens


# What an answer gets, at least, in a context grown for a long prompt.
GROWTH_ROOM = 1024


def grown_ctx(prompt_tokens: int, ctx_tokens: int, ctx_train: int | None) -> int | None:
    """The context per request for a prompt that does not fit `ctx_tokens`: the next power of two that holds it and
    GROWTH_ROOM tokens of answer, at most the model's trained context; None when the prompt fits, or when even that
    cannot hold it (or the model does not say its trained context)."""
    if prompt_tokens < ctx_tokens or not ctx_train:
        return None
    ctx = min(1 << (prompt_tokens + GROWTH_ROOM - 1).bit_length(), ctx_train)
    return ctx if ctx > prompt_tokens and ctx > ctx_tokens else None


def bound_body(body: dict[str, Any], engine_path: str, max_tokens: int) -> dict[str, int]:
    """The engine-body fields to set so the engine generates at most `max_tokens`: each limit field the body has,
    else the route's own."""
    present = [name for name in LIMIT_FIELDS if name in body]
    if not present:
        present = ["max_output_tokens" if engine_path == "/v1/responses" else "max_tokens"]
    return dict.fromkeys(present, max_tokens)
