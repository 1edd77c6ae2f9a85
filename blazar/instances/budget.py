"""Where a new instance fits: the memory budget the residents leave, the plan at that budget, and how many bytes
must be freed when it does not fit. Pure functions over devices, residents and metadata; the supervisor acts on
the answer."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from blazar.events.models import ModelMetadata
from blazar.fit import Device, FitPlan, FitRequest, plan
from blazar.fit.devices import reserve_bytes

MiB = 1 << 20
# A device large enough that no model is refused on it: used to price a shape when asking "how much is missing".
_UNBOUNDED = 1 << 50


@dataclass(frozen=True)
class Resident:
    """What a running instance holds, as the supervisor charges it: the larger of planned and measured."""

    instance_id: str
    bytes: int


def budget_devices(devices: list[Device], residents: Iterable[Resident], *,
                   memory_limit_bytes: int = 0) -> list[Device]:
    """The devices as a new plan may spend them.

    Host: free is the smaller of what the OS offers now and total minus what residents are charged (MemAvailable
    counts mapped model pages as reclaimable cache, so it alone would let a second model plan into the first one's
    weights). With a memory limit, the residents' charge is taken from the limit instead. GPUs: NVML's free already
    excludes every allocation, residents' included.
    """
    charged = sum(r.bytes for r in residents)
    out = []
    for d in devices:
        if d.kind != "host":
            out.append(d)
            continue
        free = min(d.free_bytes, max(0, d.total_bytes - charged))
        if memory_limit_bytes:
            # The limit is what instances may use in all; give the planner a free figure whose budget (free minus
            # the reserve) is exactly what is left of it.
            free = min(free, max(0, memory_limit_bytes - charged) + reserve_bytes(d))
        out.append(d.model_copy(update={"free_bytes": free}))
    return out


def required_bytes(meta: ModelMetadata, devices: list[Device], request: FitRequest) -> int:
    """What `request` costs on an unbounded host (plus the devices' GPUs as they are): the total to make room for."""
    roomy = [d.model_copy(update={"free_bytes": _UNBOUNDED, "total_bytes": _UNBOUNDED}) if d.kind == "host" else d
             for d in devices]
    p = plan(meta, roomy, request)
    return p.total_bytes


def shortfall_bytes(meta: ModelMetadata, budget: list[Device], request: FitRequest) -> int:
    """Bytes to free on the host before `request` fits at `budget`; 0 when it already fits."""
    need = required_bytes(meta, budget, request)
    host = next((d for d in budget if d.kind == "host"), None)
    have = 0 if host is None else max(0, host.free_bytes - reserve_bytes(host))
    have += sum(max(0, d.free_bytes - reserve_bytes(d)) for d in budget if d.kind != "host")
    return max(0, need - have)


def worker_devices(workers: Iterable[tuple[str, int]]) -> list[Device]:
    """Devices for RPC workers given as (address, bytes offered), indexed in the order --rpc will name them."""
    return [Device(kind="rpc", index=i, name=address, total_bytes=mem, free_bytes=mem)
            for i, (address, mem) in enumerate(workers)]


def worker_bytes_needed(meta: ModelMetadata, budget: list[Device], request: FitRequest) -> int | None:
    """What RPC workers would have to offer in all for `request` to fit beside `budget` (the local devices as a plan
    may spend them), offloading as few layers as the host needs; None when workers cannot help (the host is over
    budget even with every layer away)."""
    roomy = [*budget, Device(kind="rpc", index=0, name="workers", total_bytes=_UNBOUNDED, free_bytes=_UNBOUNDED)]
    p = plan(meta, roomy, request.model_copy(update={"offload": "fewest"}))
    if not p.fits:
        return None
    return sum(u.total_bytes for u in p.devices if u.kind == "rpc")


def try_plan(meta: ModelMetadata, budget: list[Device], request: FitRequest) -> FitPlan:
    return plan(meta, budget, request)
