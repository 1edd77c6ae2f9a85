"""Co-residency: which planned models can stay loaded together, greedy in the order given (first = highest priority).

Each model costs what its own plan says per device (its engine's fixed footprint included, since every model is
its own process); the reserve is kept back once per device for the whole set, not once per model.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from blazar.fit.devices import Device, budget_bytes
from blazar.fit.planner import FitPlan
from blazar.fit.refusal import fmt_bytes


class Resident(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    ctx_per_slot: int
    slots: int
    bytes_by_device: dict[str, int]


class Deferred(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    reason: str
    device: str | None = None
    need_bytes: int = 0
    left_bytes: int = 0


class DeviceTally(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str
    budget_bytes: int
    used_bytes: int
    left_bytes: int


class CoresidePlan(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    resident: list[Resident] = Field(default_factory=list)
    deferred: list[Deferred] = Field(default_factory=list)
    devices: list[DeviceTally] = Field(default_factory=list)
    summary: str = ""


def coreside(plans: Sequence[tuple[str, FitPlan]], devices: list[Device]) -> CoresidePlan:
    """First-fit in the given order: a model joins when every device it uses still has room for it; one that does
    not fit is deferred and later (lower-priority) models are still tried.

    `devices` should report free memory as if none of these models were loaded (the caller adds back what
    Blazar's own instances hold), so that the set is judged on the capacity it would really share.
    """
    budget = {d.key: budget_bytes(d) for d in devices}
    used = dict.fromkeys(budget, 0)
    resident: list[Resident] = []
    deferred: list[Deferred] = []
    for name, p in plans:
        need = {u.key: u.total_bytes for u in p.devices if u.total_bytes}
        if not p.fits:
            reason = p.refusal.detail if p.refusal else "its plan does not fit"
            deferred.append(Deferred(name=name, reason=f"does not fit on its own: {reason}"))
            continue
        missing = [k for k in need if k not in budget]
        if missing:
            deferred.append(Deferred(name=name, reason=f"planned for {', '.join(missing)}, which is not present",
                                     device=missing[0], need_bytes=need[missing[0]]))
            continue
        short = [k for k in need if used[k] + need[k] > budget[k]]
        if short:
            k = max(short, key=lambda k: used[k] + need[k] - budget[k])
            left = budget[k] - used[k]
            deferred.append(Deferred(
                name=name, device=k, need_bytes=need[k], left_bytes=left,
                reason=f"{k} has {fmt_bytes(left)} left of {fmt_bytes(budget[k])}; {name} needs {fmt_bytes(need[k])}",
            ))
            continue
        for k, n in need.items():
            used[k] += n
        resident.append(Resident(name=name, ctx_per_slot=p.ctx_per_slot, slots=p.slots, bytes_by_device=need))
    tallies = [DeviceTally(key=k, budget_bytes=b, used_bytes=used[k], left_bytes=b - used[k])
               for k, b in budget.items()]
    text = "resident: " + (", ".join(r.name for r in resident) or "none")
    if deferred:
        text += "; deferred: " + "; ".join(f"{d.name} ({d.reason})" for d in deferred)
    return CoresidePlan(resident=resident, deferred=deferred, devices=tallies, summary=text)
