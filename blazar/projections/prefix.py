"""The `prefix` projection: per client (its key, and its program where its User-Agent named one), how its chat turns
found the engine's prefix cache (`request.prefix_compared`): how many were compared, how many broke the prefix
(changed the prompt before the end of the previous one, and the engine prefilled it again), and how many of the last
ones in a row did. A client whose last FLAG_STREAK turns all broke it is flagged: `blazar why --clients` and the
console list it. Keyed by the event's actor first: one key's clients are never merged with another's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from blazar.events.base import Recorded
from blazar.events.requests import HOP_ACTOR, RequestPrefixCompared
from blazar.projections.base import Projection

# A client whose last this many turns in a row broke the prefix is flagged.
FLAG_STREAK = 3
# Clients remembered at once (the agent is the client's own word): the one seen longest ago is forgotten first.
MAX_CLIENTS = 1024


@dataclass(slots=True)
class ClientPrefix:
    """One client's turns as the prefix cache found them."""

    actor: str  # "key:<name>" where keys are on, else the daemon's actor
    agent: str | None  # its program ("claude-cli"), where its User-Agent said
    turns: int = 0  # turns compared with the one before them
    breaks: int = 0  # of them, turns that broke the prefix
    streak: int = 0  # breaks in a row, up to its last turn
    reprocessed_tokens: int = 0  # prefilled again by its breaks
    prefill_ms: float = 0.0  # ... and the engine's time for those prompts
    last_ts: float = 0.0
    last_trace_id: str = ""
    # Its last break: the trace, and where its prompt first differed.
    break_trace_id: str | None = None
    break_part: str | None = None
    break_message_index: int | None = None

    @property
    def flagged(self) -> bool:
        return self.streak >= FLAG_STREAK


@dataclass(slots=True)
class PrefixState:
    clients: dict[str, ClientPrefix] = field(default_factory=dict)  # client_key(actor, agent) -> its turns


def client_key(actor: str, agent: str | None) -> str:
    return f"{actor} {agent}" if agent else actor


class PrefixProjection(Projection[PrefixState]):
    name = "prefix"
    state_type = PrefixState
    version = 1
    types = frozenset({RequestPrefixCompared.TYPE})

    def initial(self) -> PrefixState:
        return PrefixState()

    def apply(self, state: PrefixState, rec: Recorded) -> PrefixState:
        ev = rec.event
        if not isinstance(ev, RequestPrefixCompared) or rec.actor.startswith(HOP_ACTOR):
            return state  # a forwarded hop's turn is its first node's client's, who is not known here
        key = client_key(rec.actor, ev.agent)
        client = state.clients.get(key)
        if client is None:
            if len(state.clients) >= MAX_CLIENTS:
                del state.clients[min(state.clients, key=lambda k: (state.clients[k].last_ts, k))]
            client = state.clients[key] = ClientPrefix(actor=rec.actor, agent=ev.agent)
        client.turns += 1
        client.last_ts, client.last_trace_id = rec.ts, ev.trace_id
        if not ev.broke:
            client.streak = 0
            return state
        client.breaks += 1
        client.streak += 1
        client.reprocessed_tokens += ev.reprocessed_tokens
        client.prefill_ms = round(client.prefill_ms + (ev.prefill_ms or 0.0), 3)
        client.break_trace_id, client.break_part, client.break_message_index = ev.trace_id, ev.part, ev.message_index
        return state


def clients(state: PrefixState) -> list[ClientPrefix]:
    """Every client remembered: flagged first, then the longest streak, then the most recent."""
    return sorted(state.clients.values(), key=lambda c: (not c.flagged, -c.streak, -c.last_ts, c.actor))


def flagged(state: PrefixState) -> list[ClientPrefix]:
    """The clients whose last FLAG_STREAK turns or more all broke the prefix."""
    return [c for c in clients(state) if c.flagged]
