"""The `realtime` projection: the realtime profiles by name (`realtime.profile_set`, `realtime.profile_removed`),
each the three models that serve a `/v1/realtime` session asking for it. Whether those models are still in the store
is the reader's question (blazar/queries/realtime.py), not the fold's: a profile outlives a model removed under it
and says so when a session asks for it."""

from __future__ import annotations

from dataclasses import dataclass, field

from blazar.events.base import Recorded
from blazar.events.realtime import RealtimeProfileRemoved, RealtimeProfileSet
from blazar.projections.base import Projection


@dataclass(frozen=True, slots=True)
class RealtimeProfile:
    name: str
    stt: str  # a whisper model's own name
    llm: str  # a llama-server model's own name
    tts: str  # a piper voice's own name
    speaker: str | None  # the voice's speaker; None: its default
    seq: int  # the realtime.profile_set
    ts: float


@dataclass(slots=True)
class RealtimeState:
    """The `realtime` projection's state, read through `profiles` and `profile`."""

    profiles: dict[str, RealtimeProfile] = field(default_factory=dict)


class RealtimeProjection(Projection[RealtimeState]):
    name = "realtime"
    state_type = RealtimeState
    version = 1
    types = frozenset({RealtimeProfileSet.TYPE, RealtimeProfileRemoved.TYPE})

    def initial(self) -> RealtimeState:
        return RealtimeState()

    def apply(self, state: RealtimeState, rec: Recorded) -> RealtimeState:
        ev = rec.event
        if isinstance(ev, RealtimeProfileSet):
            state.profiles[ev.name] = RealtimeProfile(name=ev.name, stt=ev.stt, llm=ev.llm, tts=ev.tts,
                                                      speaker=ev.speaker, seq=rec.seq, ts=rec.ts)
        elif isinstance(ev, RealtimeProfileRemoved):
            state.profiles.pop(ev.name, None)
        return state


def profiles(state: RealtimeState) -> list[RealtimeProfile]:
    """Every realtime profile, by name."""
    return [state.profiles[n] for n in sorted(state.profiles)]


def profile(state: RealtimeState, name: str) -> RealtimeProfile | None:
    return state.profiles.get(name)
