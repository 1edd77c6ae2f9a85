"""A model's tuned profile as `blazar show` (and the console) read it: the posture adopted, the rule and the
measurement that chose it, and whether it applies on the active engine build and this machine or is stale
(measured on another build or machine: loads pass it by until the model is measured again)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from blazar.adapters.machine import this_machine
from blazar.context import Blazar
from blazar.projections.profiles import BenchEntry, Profile, Reset, bench, benches, last_reset, profile, stale_reason

__all__ = ["ProfileStatus", "profile_status"]


@dataclass(frozen=True)
class ProfileStatus:
    """What a model's next load runs at, and why."""

    model: str
    status: Literal["applied", "stale", "none"]  # applied: its next load takes the posture
    profile: Profile | None
    active_engine_tag: str | None
    stale: str | None  # why it does not apply ("measured on engine X, active is Y")
    winner: BenchEntry | None  # the bench.recorded the profile names, when it is in the log
    benches: int  # bench.recorded of the model on this machine
    reset: Reset | None  # the latest profile.reset

    def summary(self) -> str:
        """One line for `blazar show`."""
        p = self.profile
        if p is None:
            since = f" (reset at seq {self.reset.seq}: {self.reset.reason})" if self.reset is not None else ""
            return f"defaults: no profile adopted{since}; blazar tune {self.model} measures one"
        chose = f"profile.adopted seq {p.seq}, {p.candidates} candidates on engine {p.engine_tag}"
        if self.stale is not None:
            return (f"defaults: profile {p.posture.label()} is stale: {self.stale}; run blazar tune {self.model} "
                    f"again ({chose})")
        return f"{p.posture.label()} ({chose}; rule: {p.rule})"

    def to_json(self) -> dict[str, Any]:
        p = self.profile
        return {
            "status": self.status, "active_engine_tag": self.active_engine_tag, "stale": self.stale,
            "summary": self.summary(), "benches": self.benches,
            "profile": None if p is None else {
                "seq": p.seq, "ts": p.ts, "posture": p.posture.label(),
                "posture_fields": p.posture.model_dump(exclude_none=True), "engine_tag": p.engine_tag,
                "machine": p.machine.model_dump(mode="json"), "rule": p.rule, "bench_id": p.bench_id,
                "candidates": p.candidates},
            "winner": None if self.winner is None else {
                "seq": self.winner.seq, "bench_id": self.winner.bench.bench_id,
                "decode_tps": {f"{r.workload}@{r.concurrency}": r.decode_tps_stream
                               for r in self.winner.bench.results}},
            "reset": None if self.reset is None else {"seq": self.reset.seq, "reason": self.reset.reason},
        }


def profile_status(app: Blazar, model: str) -> ProfileStatus:
    """`model`'s profile against the active engine build and this machine, as the supervisor judges it at a load."""
    state = app.runner.state("profiles")
    tag = app.runner.state("engines").active
    p = profile(state, model)
    why = None if p is None else stale_reason(p, tag, this_machine().fingerprint)
    winner = None if p is None or p.bench_id is None else bench(state, model, p.bench_id)
    status: Literal["applied", "stale", "none"] = "none" if p is None else "stale" if why else "applied"
    return ProfileStatus(model=model, status=status, profile=p, active_engine_tag=tag, stale=why, winner=winner,
                         benches=len(benches(state, model)), reset=last_reset(state, model))
