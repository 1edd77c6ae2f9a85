"""A chat prompt's fingerprint, and where two of them first differ: what `request.prefix_compared` says about a turn
whose prompt the engine's prefix cache could not reuse (blazar/serving/prefix_watch.py keeps the fingerprints).

The engine's cache holds the rendered prompt's tokens, and a chat template renders the system message and the tool
list first, then the messages in order: a change anywhere makes everything after it a prefill again. So a prompt is
fingerprinted by its parts in that order (a hash of the tools list, one per message of its role and its content),
from the engine's body as the engine gets it (every Patch applied). Hashes only, never text; the work is one hash per
message per request, none per token.
"""

from __future__ import annotations

import re
from array import array
from dataclasses import dataclass
from typing import Any

import orjson

from blazar.events.requests import PrefixPart

# Messages past this many are not fingerprinted (a prompt's start is where a cache is lost; the bound keeps what a
# fingerprint holds, and the work of a comparison, small whatever a client sends).
MAX_MESSAGES = 1024
# A turn "missed" when the engine reused less than this share of the previous prompt's tokens ...
MISS_SHARE = 0.5
# ... and prefilled at least this many again: a break that costs less is not worth a word.
MIN_REPROCESSED_TOKENS = 64
# A User-Agent's product as its client's name: at most this many characters.
AGENT_CHARS = 64
# A message's role as a byte (an unknown role is OTHER_ROLE: its hash still tells its messages apart).
ROLES = {"system": 0, "developer": 1, "user": 2, "assistant": 3, "tool": 4, "function": 5}
OTHER_ROLE = 6
SYSTEM_ROLES = frozenset({ROLES["system"], ROLES["developer"]})
_AGENT = re.compile(r"[A-Za-z0-9._+\-/]+")


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """A chat prompt's parts as hashes, in the order a template renders them: 9 bytes a message."""

    tools: int  # the tools list's hash, in order (0: no tools)
    roles: array[int]  # each message's role, as a ROLES code
    messages: array[int]  # each message's hash: its role, content, tool calls, ... (the first MAX_MESSAGES)
    count: int  # how many messages the prompt had


@dataclass(frozen=True, slots=True)
class Difference:
    """Where a prompt first differs from the one before it."""

    part: PrefixPart
    message_index: int | None  # None: the tools


def _hash(value: Any) -> int:
    # NOTE: Python's own hash of the bytes (SipHash, seeded per process), not a cryptographic one: the fingerprints
    # never leave this process's memory, and it costs a fifth of blake2b's time here (bench/prefix.py).
    return hash(orjson.dumps(value, option=orjson.OPT_SORT_KEYS))


def _message_hash(message: Any) -> int:
    """A message's hash; a plain text turn (a role and a string, most of a conversation) without encoding it."""
    if type(message) is dict and len(message) == 2:
        role, content = message.get("role"), message.get("content")
        if type(role) is str and type(content) is str:
            return hash((role, content))
    return _hash(message)


def fingerprint(body: dict[str, Any]) -> Fingerprint | None:
    """The fingerprint of a chat body's prompt; None for a body with no messages list (a completion's prompt)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return None
    tools = body.get("tools")
    head = messages[:MAX_MESSAGES]
    return Fingerprint(tools=_hash(tools) if tools else 0, roles=array("B", (_role(m) for m in head)),
                       messages=array("q", (_message_hash(m) for m in head)), count=len(messages))


def _role(message: Any) -> int:
    role = message.get("role") if isinstance(message, dict) else None
    return ROLES.get(role, OTHER_ROLE) if isinstance(role, str) else OTHER_ROLE


def first_difference(previous: Fingerprint, current: Fingerprint) -> Difference | None:
    """Where `current` first differs from `previous` in the order the template renders them: a system message
    before the tools (the tools render after the system prompt), the tools, then each message; None when `current`
    holds every part of `previous` unchanged (it extends it, or repeats it)."""
    n = len(previous.messages)
    if previous.tools == current.tools and current.messages[:n] == previous.messages:
        return None  # the common case, compared in C: it extends the previous prompt
    lead = 0  # the system messages at the start, rendered before the tools
    while lead < min(n, len(current.roles)) and previous.roles[lead] in SYSTEM_ROLES:
        if current.roles[lead] != previous.roles[lead] or current.messages[lead] != previous.messages[lead]:
            return _at(previous, current, lead)
        lead += 1
    if previous.tools != current.tools:
        return Difference("tools", None)
    for i in range(lead, n):
        if i >= len(current.messages):
            return Difference("message", i)  # the prompt lost messages the previous one had
        if previous.roles[i] != current.roles[i] or previous.messages[i] != current.messages[i]:
            return _at(previous, current, i)
    return None


def _at(previous: Fingerprint, current: Fingerprint, i: int) -> Difference:
    if i >= len(current.roles) or previous.roles[i] != current.roles[i]:
        return Difference("role", i)
    return Difference("system" if current.roles[i] in SYSTEM_ROLES else "message", i)


def missed(previous_prompt_tokens: int, prompt_tokens: int, reused_tokens: int) -> bool:
    """Whether the engine's cache failed the turn: it reused less than MISS_SHARE of the previous prompt and
    prefilled at least MIN_REPROCESSED_TOKENS again."""
    return (reused_tokens < MISS_SHARE * previous_prompt_tokens
            and prompt_tokens - reused_tokens >= MIN_REPROCESSED_TOKENS)


def agent_of(user_agent: str | None) -> str | None:
    """A client's program by its User-Agent's first product, without its version ("claude-cli/1.0.3 (external)" is
    "claude-cli"; "OpenAI/Python 1.54.0" is "OpenAI/Python"); None when it says nothing usable."""
    if not user_agent:
        return None
    m = _AGENT.match(user_agent.strip())
    if m is None:
        return None
    product = re.split(r"/(?=v?\d)", m.group(0), maxsplit=1)[0].strip("/")
    return product[:AGENT_CHARS] or None
