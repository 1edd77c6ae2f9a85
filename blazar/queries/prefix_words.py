"""What `blazar why` says about a chat turn's prefix cache (`request.prefix_compared`): how much of the prompt the
engine reused from the previous turn on the same session or slot, and, where that was little, where the prompt first
differed and what prefilling it again cost. Pure: the event in, words out.
"""

from __future__ import annotations

from blazar.events.requests import RequestPrefixCompared

PART_WORDS = {"system": "system", "role": "a different role", "message": "an earlier turn"}


def fmt_prefill(ms: float | None) -> str:
    if ms is None:
        return "?"
    return f"{ms:.0f} ms" if ms < 1000 else f"{ms / 1000:.1f} s"


def where(ev: RequestPrefixCompared) -> str:
    """The conversation the turn was compared in."""
    if ev.session is not None:
        return f"on session {ev.session}"
    return f"on slot {ev.slot_id}" if ev.slot_id is not None else f"on instance {ev.instance_id}"


def changed_at(ev: RequestPrefixCompared) -> str | None:
    """Where the prompt first differed from the previous one, in words; None when it extended it unchanged."""
    if ev.part is None:
        return None
    if ev.part == "tools" or ev.message_index is None:
        return "the tool list (rendered before the messages)"
    if ev.message_index >= ev.messages:
        return f"message {ev.message_index} (gone: {ev.messages} messages where the previous prompt had " \
               f"{ev.previous_messages})"
    return f"message {ev.message_index} ({PART_WORDS[ev.part]})"


def cost(ev: RequestPrefixCompared) -> str:
    return f"{ev.reprocessed_tokens:,} tokens prefilled again, {fmt_prefill(ev.prefill_ms)}"


def prefix_text(ev: RequestPrefixCompared) -> str:
    """The step's line: the comparison with this client's previous request."""
    previous = f"this client's previous request {where(ev)} ({ev.previous_trace_id})"
    changed = changed_at(ev)
    reused = f"reused {ev.reused_tokens:,} of {ev.prompt_tokens:,} prompt tokens"
    if not ev.missed:
        tail = f"; it first differed at {changed}" if changed is not None else ""
        return f"prefix cache: {reused} from {previous}{tail}"
    if changed is not None:
        return f"prefix cache missed: the prompt first differed at {changed} from {previous}; {cost(ev)} ({reused})"
    return (f"prefix cache missed: the prompt extended {previous} unchanged, but the engine had lost that prefix "
            f"(the slot served another prompt, or the engine restarted); {cost(ev)} ({reused})")


def prefix_verdict(ev: RequestPrefixCompared | None) -> str | None:
    """The verdict's part: only a miss is worth it."""
    if ev is None or not ev.missed:
        return None
    changed = changed_at(ev)
    if changed is None:
        return f"prefix cache lost {where(ev)}: {cost(ev)}"
    return f"the prompt first differed at {changed} from the previous request {where(ev)}: {cost(ev)}"
