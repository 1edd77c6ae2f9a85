"""The gateway's memory of each conversation's last prompt, to say why a turn's prefix cache missed: when a chat turn
ends, its prompt's fingerprint (blazar/serving/prefix.py) is compared with the previous turn's on the same session
(or, without one, the same engine slot and client program) of the same tenant, where it has more messages than that
one (a conversation's next turn), and `request.prefix_compared` records how much the engine reused and, where that
was little, where the prompt first changed and what the prefill cost.

In memory only, bounded (the least recently used conversation forgotten first), and keyed by tenant first: one
tenant's prompt is never compared with another's. A restart forgets it all: a conversation's first turn after one
is compared with nothing.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from blazar.events.requests import RequestPrefixCompared
from blazar.serving.prefix import Fingerprint, fingerprint, first_difference, missed

if TYPE_CHECKING:
    from blazar.serving.call import Call, Completed

log = logging.getLogger("blazar.prefix")

CHAT_PATH = "/v1/chat/completions"

# Conversations remembered at once (each a fingerprint: 9 bytes a message, at most MAX_MESSAGES of them).
MAX_CONVERSATIONS = 1024

# (tenant, "session", name) or (tenant, "slot", instance id, slot id, agent)
Conversation = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Turn:
    """What a finished chat turn leaves for the next one to be compared with."""

    trace_id: str
    fingerprint: Fingerprint
    prompt_tokens: int


@dataclass(frozen=True, slots=True)
class Finished:
    """A chat turn as it ended: where it ran, whose it was, what the engine was asked and what it said it did."""

    trace_id: str
    tenant: str | None
    session: str | None
    model: str
    instance_id: str
    slot_id: int | None
    agent: str | None
    body: dict[str, Any]  # the engine's body, every Patch applied
    usage: dict[str, Any]  # the engine's usage: prompt_tokens, cached_tokens, timings


def finished_turn(call: Call, done: Completed) -> Finished | None:
    """The turn a completed call was, where it can be compared: a chat its own engine child prefilled (not another
    node's or a remote's, not a generation shared from another request, not a fan-out's sum of several)."""
    request, inst, ticket = call.request, call.instance, call.ticket
    if (request.engine_path != CHAT_PATH or inst is None or inst.remote or done.status != 200
            or (done.shared or call.shared_role) == "follower" or request.cascade or (request.best_of or 1) > 1):
        return None
    return Finished(trace_id=call.trace_id, tenant=request.tenant, session=request.session,
                    model=call.name or call.model, instance_id=inst.instance_id,
                    slot_id=ticket.slot_id if ticket is not None else None, agent=request.agent,
                    body=call.ask.engine_body(), usage=done.usage)


class PrefixWatch:
    def __init__(self, capacity: int = MAX_CONVERSATIONS) -> None:
        self._capacity = capacity
        self._last: OrderedDict[Conversation, Turn] = OrderedDict()

    def __len__(self) -> int:
        return len(self._last)

    def observe(self, call: Call, done: Completed) -> None:
        """A completed call's turn compared and, where it was a next turn, its `request.prefix_compared` recorded."""
        try:
            turn = finished_turn(call, done)
            compared = self.turn(turn) if turn is not None else None
        except Exception:  # NOTE: a diagnosis never stands between a request and its end (its slot, its event)
            log.exception("the prefix cache comparison of %s failed", call.trace_id)
            return
        if compared is not None:
            call.emit(compared)

    def turn(self, done: Finished) -> RequestPrefixCompared | None:
        """Remember this turn's prompt for its conversation, and compare it with the previous one there: the
        event to record, or None where there is no previous turn to compare it with (a first turn, a body that is
        no chat, usage the engine did not give) or the prompt has no more messages than the previous one (it is
        no next turn of that conversation: a retry, or an unrelated prompt that took the same slot)."""
        prompt_tokens = done.usage.get("prompt_tokens")
        if not isinstance(prompt_tokens, int):
            return None
        current = fingerprint(done.body)
        if current is None:
            return None
        where = conversation_of(done)
        if where is None:
            return None
        previous = self._last.pop(where, None)
        self._last[where] = Turn(done.trace_id, current, prompt_tokens)
        while len(self._last) > self._capacity:
            self._last.popitem(last=False)
        if previous is None or current.count <= previous.fingerprint.count:
            return None  # no next turn of that conversation: a first one, a retry, or another prompt on the slot
        return compared(done, previous, current, prompt_tokens)


def conversation_of(done: Finished) -> Conversation | None:
    """Whose conversation a turn continues: its session's, else its slot's as one client program used it (None:
    neither is known)."""
    if done.session is not None:
        return (done.tenant, "session", done.session)
    if done.slot_id is None:
        return None
    return (done.tenant, "slot", done.instance_id, done.slot_id, done.agent)


def compared(done: Finished, previous: Turn, current: Fingerprint, prompt_tokens: int) -> RequestPrefixCompared:
    """The comparison of a turn with its conversation's previous one, as the event that records it."""
    cached = done.usage.get("cached_tokens")
    # An engine that does not say what it reused is never said to have missed.
    known = isinstance(cached, int | float)
    reused = min(int(cached), prompt_tokens) if isinstance(cached, int | float) else 0
    diff = first_difference(previous.fingerprint, current)
    timings = done.usage.get("timings")
    prompt_ms = timings.get("prompt_ms") if isinstance(timings, dict) else None
    return RequestPrefixCompared(
        trace_id=done.trace_id, model=done.model, instance_id=done.instance_id, slot_id=done.slot_id,
        session=done.session, agent=done.agent, previous_trace_id=previous.trace_id,
        previous_prompt_tokens=previous.prompt_tokens, previous_messages=previous.fingerprint.count,
        messages=current.count, prompt_tokens=prompt_tokens, reused_tokens=reused,
        missed=known and missed(previous.prompt_tokens, prompt_tokens, reused),
        part=diff.part if diff is not None else None, message_index=diff.message_index if diff is not None else None,
        reprocessed_tokens=prompt_tokens - reused,
        prefill_ms=round(float(prompt_ms), 3) if isinstance(prompt_ms, int | float) else None)
