"""The `profiles` projection: per model, the benchmarks measured on this machine (`bench.recorded`) and the posture
adopted from them (`profile.adopted`, undone by `profile.reset`). Loads read `profile` to run a model at its adopted
posture; `blazar show` reads it and `benches` to say which measurement chose it.

Whether a profile applies (its engine build is the active one) is the reader's question, not the fold's: the fold
keeps what was adopted, and a new engine build makes it stale without any event."""

from __future__ import annotations

from dataclasses import dataclass, field

from blazar.events.base import Recorded
from blazar.events.tuning import BenchRecorded, Machine, Posture, ProfileAdopted, ProfileReset
from blazar.projections.base import Projection


@dataclass(frozen=True, slots=True)
class Profile:
    """The posture `model` is to run at, and the measurement that chose it (its profile.adopted)."""

    model: str
    posture: Posture
    engine_tag: str  # the engine build it was measured on: another active build makes it stale
    machine: Machine
    rule: str
    bench_id: str | None  # the winner's bench.recorded
    candidates: int  # postures measured against each other
    seq: int  # the profile.adopted
    ts: float


@dataclass(frozen=True, slots=True)
class BenchEntry:
    seq: int
    ts: float
    bench: BenchRecorded


@dataclass(frozen=True, slots=True)
class Reset:
    seq: int
    ts: float
    reason: str


@dataclass(slots=True)
class ModelProfiles:
    """What the log says of tuning one model on this machine."""

    benches: list[BenchEntry] = field(default_factory=list)  # in log order
    profile: Profile | None = None  # None: never adopted, or reset since
    reset: Reset | None = None  # the latest profile.reset


@dataclass(slots=True)
class ProfilesState:
    """The `profiles` projection's state, read through `profile`, `benches`, `bench` and `last_reset`."""

    models: dict[str, ModelProfiles] = field(default_factory=dict)


class ProfilesProjection(Projection[ProfilesState]):
    node_local = True
    name = "profiles"
    state_type = ProfilesState
    version = 2
    types = frozenset({BenchRecorded.TYPE, ProfileAdopted.TYPE, ProfileReset.TYPE})

    def initial(self) -> ProfilesState:
        return ProfilesState()

    def apply(self, state: ProfilesState, rec: Recorded) -> ProfilesState:
        ev = rec.event
        assert isinstance(ev, BenchRecorded | ProfileAdopted | ProfileReset)
        entry = state.models.get(ev.model)
        if entry is None:
            entry = state.models[ev.model] = ModelProfiles()
        if isinstance(ev, BenchRecorded):
            entry.benches.append(BenchEntry(seq=rec.seq, ts=rec.ts, bench=ev))
        elif isinstance(ev, ProfileAdopted):
            entry.profile = Profile(model=ev.model, posture=ev.posture, engine_tag=ev.engine_tag, machine=ev.machine,
                                    rule=ev.rule, bench_id=ev.bench_id, candidates=len(ev.candidates), seq=rec.seq,
                                    ts=rec.ts)
        else:
            entry.profile = None
            entry.reset = Reset(seq=rec.seq, ts=rec.ts, reason=ev.reason)
        return state


def profile(state: ProfilesState, model: str) -> Profile | None:
    """`model`'s adopted profile (None: never adopted, or reset since), stale or not: see `applies`."""
    entry = state.models.get(model)
    return None if entry is None else entry.profile


def benches(state: ProfilesState, model: str) -> list[BenchEntry]:
    """Every benchmark of `model` on this machine, in log order."""
    entry = state.models.get(model)
    return [] if entry is None else list(entry.benches)


def bench(state: ProfilesState, model: str, bench_id: str) -> BenchEntry | None:
    """The benchmark `bench_id` of `model` (a profile's winner), if it is in the log."""
    return next((b for b in benches(state, model) if b.bench.bench_id == bench_id), None)


def last_reset(state: ProfilesState, model: str) -> Reset | None:
    """The latest profile.reset of `model`, if any (whether a profile was adopted after it: see `profile`)."""
    entry = state.models.get(model)
    return None if entry is None else entry.reset


def stale_reason(p: Profile, engine_tag: str | None, machine_fingerprint: str | None = None) -> str | None:
    """Why `p` does not apply on the active engine `engine_tag` (and this machine, when its fingerprint is known):
    None when it applies."""
    if engine_tag is None or p.engine_tag != engine_tag:
        return f"measured on engine {p.engine_tag}, active is {engine_tag or 'none'}"
    if machine_fingerprint is not None and p.machine.fingerprint != machine_fingerprint:
        return f"measured on machine {p.machine.fingerprint}, this is {machine_fingerprint}"
    return None
