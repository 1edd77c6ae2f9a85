"""The `profiles` projection: per model, the benchmarks measured on this machine (`bench.recorded`) and the posture
adopted from them (`profile.adopted`, undone by `profile.reset`). Loads read `profile` to run a model at its adopted
posture; `blazar show` reads it and `benches` to say which measurement chose it.

Whether a profile applies (its engine build is the active one) is the reader's question, not the fold's: the fold
keeps what was adopted, and a new engine build makes it stale without any event."""

from __future__ import annotations

from dataclasses import dataclass

from blazar.events.base import Recorded
from blazar.events.tuning import BenchRecorded, Machine, Posture, ProfileAdopted, ProfileReset
from blazar.projections.base import Projection, State, TypedState


class ProfilesState(TypedState):
    """The `profiles` projection's state, read through `profile`, `benches`, `bench` and `last_reset`."""

    __slots__ = ()


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


class ProfilesProjection(Projection[State]):
    node_local = True
    name = "profiles"
    state_type = ProfilesState
    version = 1
    types = frozenset({BenchRecorded.TYPE, ProfileAdopted.TYPE, ProfileReset.TYPE})

    def initial(self) -> State:
        return {"models": {}}

    def apply(self, state: State, rec: Recorded) -> State:
        ev = rec.event
        assert isinstance(ev, BenchRecorded | ProfileAdopted | ProfileReset)
        entry = state["models"].setdefault(ev.model, {"benches": [], "profile": None, "reset": None})
        if isinstance(ev, BenchRecorded):
            entry["benches"].append({"seq": rec.seq, "ts": rec.ts, "bench": ev.model_dump(mode="json")})
        elif isinstance(ev, ProfileAdopted):
            entry["profile"] = {
                "seq": rec.seq, "ts": rec.ts, "posture": ev.posture.model_dump(mode="json"),
                "engine_tag": ev.engine_tag, "machine": ev.machine.model_dump(mode="json"), "rule": ev.rule,
                "bench_id": ev.bench_id, "candidates": len(ev.candidates),
            }
        else:
            entry["profile"] = None
            entry["reset"] = {"seq": rec.seq, "ts": rec.ts, "reason": ev.reason}
        return state


def profile(state: ProfilesState, model: str) -> Profile | None:
    """`model`'s adopted profile (None: never adopted, or reset since), stale or not: see `applies`."""
    p = state._raw["models"].get(model, {}).get("profile")
    if p is None:
        return None
    return Profile(model=model, posture=Posture.model_validate(p["posture"]), engine_tag=p["engine_tag"],
                   machine=Machine.model_validate(p["machine"]), rule=p["rule"], bench_id=p["bench_id"],
                   candidates=int(p["candidates"]), seq=int(p["seq"]), ts=float(p["ts"]))


def benches(state: ProfilesState, model: str) -> list[BenchEntry]:
    """Every benchmark of `model` on this machine, in log order."""
    return [BenchEntry(seq=int(b["seq"]), ts=float(b["ts"]), bench=BenchRecorded.model_validate(b["bench"]))
            for b in state._raw["models"].get(model, {}).get("benches", [])]


def bench(state: ProfilesState, model: str, bench_id: str) -> BenchEntry | None:
    """The benchmark `bench_id` of `model` (a profile's winner), if it is in the log."""
    return next((b for b in benches(state, model) if b.bench.bench_id == bench_id), None)


def last_reset(state: ProfilesState, model: str) -> Reset | None:
    """The latest profile.reset of `model`, if any (whether a profile was adopted after it: see `profile`)."""
    r = state._raw["models"].get(model, {}).get("reset")
    return None if r is None else Reset(seq=int(r["seq"]), ts=float(r["ts"]), reason=str(r["reason"]))


def stale_reason(p: Profile, engine_tag: str | None, machine_fingerprint: str | None = None) -> str | None:
    """Why `p` does not apply on the active engine `engine_tag` (and this machine, when its fingerprint is known):
    None when it applies."""
    if engine_tag is None or p.engine_tag != engine_tag:
        return f"measured on engine {p.engine_tag}, active is {engine_tag or 'none'}"
    if machine_fingerprint is not None and p.machine.fingerprint != machine_fingerprint:
        return f"measured on machine {p.machine.fingerprint}, this is {machine_fingerprint}"
    return None
