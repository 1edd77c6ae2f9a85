"""The GPU checks: what NVML sees (driver, CUDA, each GPU), whether the active engine has the backend those GPUs
need, and whether the models that must stay loaded (engine.preload, and the pinned ones loaded now) fit in the
VRAM that is free for them. A machine without NVIDIA is a CPU-only machine, not a failure."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from blazar.adapters.engines.process import child_env
from blazar.adapters.gpu import host_device
from blazar.adapters.nvml import NvmlGpu, NvmlSnapshot, read_nvml
from blazar.context import Blazar
from blazar.errors import BlazarError
from blazar.fit import Device, FitPlan, FitRequest
from blazar.fit.devices import reserve_bytes
from blazar.fit.planner import MIN_AUTO_CTX
from blazar.instances.planning import fit_model
from blazar.operations.doctor.gpu_backend import Backend, from_build_options, from_device_list, list_devices, runs_on
from blazar.operations.doctor.report import Check, ok
from blazar.projections.engines import InstalledEngine, active
from blazar.projections.residency import instances

GIB = 1 << 30
BUILD_CUDA = "blazar engine build --cuda"


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def _gpu_line(g: NvmlGpu) -> str:
    cc = f"sm {g.compute_capability[0]}.{g.compute_capability[1]}" if g.compute_capability else "sm unknown"
    return f"cuda:{g.index} {g.name} ({cc}, {_gib(g.free_bytes)} free of {_gib(g.total_bytes)})"


def nvml_check(snap: NvmlSnapshot) -> Check:
    """machine.gpu: the driver, the CUDA it supports and each GPU, or why there are none (CPU only: ok)."""
    if not snap.available:
        return ok("machine", "gpu", f"no NVIDIA GPU / NVML not present: CPU only ({snap.why})")
    if not snap.gpus:
        return ok("machine", "gpu", f"NVIDIA driver {snap.driver or 'unknown'} answers but lists no GPU: CPU only")
    return ok("machine", "gpu", f"NVIDIA driver {snap.driver or 'unknown'}, CUDA {snap.cuda or 'unknown'}; "
              + "; ".join(_gpu_line(g) for g in snap.gpus))


def backend_fit(tag: str, backend: Backend, snap: NvmlSnapshot) -> Check:
    """engine.backend: a CUDA GPU wants a CUDA build (one that has code for its architecture)."""
    gpus = snap.gpus if snap.available else ()
    if not gpus:
        if backend.cuda:
            return ok("engine", "backend", f"{tag} has the CUDA backend ({backend.evidence}) but no NVIDIA GPU is "
                      "seen: it runs on the CPU")
        return ok("engine", "backend", f"{tag} is a CPU build ({backend.evidence}); no NVIDIA GPU to use")
    if not backend.cuda:
        names = ", ".join(f"cuda:{g.index} {g.name}" for g in gpus)
        return Check("engine", "backend", "warn", f"{tag} is CPU-only ({backend.evidence}) but this machine has "
                     f"{names}: every layer runs on the CPU", fix=f"{BUILD_CUDA} (with the CUDA toolkit's nvcc on "
                     "PATH; --cuda-arch native builds for these GPUs only)")
    if backend.archs:
        missed = [g for g in gpus if g.compute_capability and not runs_on(backend.archs, g.compute_capability)]
        if missed:
            need = ", ".join(sorted({g.arch or "?" for g in missed}))
            return Check("engine", "backend", "warn", f"{tag} was built for CUDA architecture(s) "
                         f"{', '.join(backend.archs)}, which cannot run on "
                         + ", ".join(f"cuda:{g.index} {g.name}" for g in missed),
                         fix=f"{BUILD_CUDA} --cuda-arch {need}")
    return ok("engine", "backend", f"{tag} has the CUDA backend ({backend.evidence}) for "
              + ", ".join(f"cuda:{g.index} {g.name}" for g in gpus))


async def backend(app: Blazar, snap: NvmlSnapshot, entry: InstalledEngine | None) -> Check | None:
    if entry is None:
        return None  # engine.active already says there is none
    found = from_build_options(entry.build_options)
    if found is None and not (snap.available and snap.gpus):  # nothing to offload to: not worth running it
        return ok("engine", "backend", f"{entry.tag}: no NVIDIA GPU here, so it runs on the CPU whatever its "
                  "backends (installed, not built here: its build options are not recorded)")
    if found is None:
        binary = app.paths.engines / entry.tag / entry.binary
        if not binary.is_file():
            return None  # engine.smoke says it is missing
        found = from_device_list(await list_devices(binary, child_env(app.env)))
    return backend_fit(entry.tag, found, snap)


@dataclass(frozen=True)
class Need:
    """A model that must stay loaded: its plan on the GPUs as if they were empty, or why there is none."""

    model: str
    plan: FitPlan | None
    why: str = ""

    def on(self, index: int) -> int:
        return sum(u.total_bytes for u in self.plan.devices if u.key == f"cuda:{index}") if self.plan else 0


def vram_fit(needs: Sequence[Need], snap: NvmlSnapshot, held: dict[int, int], shape: str) -> Check:
    """machine.vram: per GPU, the sum of the must-stay models' plans against what is free for them (NVML's free,
    plus what their own running instances hold there, less the reserve the fit keeps)."""
    names = ", ".join(n.model for n in needs)
    notes = [f"{n.model}: {n.why}" for n in needs if n.plan is None]
    notes += [f"{n.model} does not fit whole on the GPUs even alone ({n.plan.gpu_layers} of "
              f"{n.plan.offloadable_layers} layers)" for n in needs if n.plan and n.plan.gpu_layers <
              n.plan.offloadable_layers]
    over, seen = [], []
    for g in snap.gpus:
        need = sum(n.on(g.index) for n in needs)
        room = g.free_bytes + held.get(g.index, 0) - reserve_bytes(_device(g))
        seen.append(f"cuda:{g.index} needs {_gib(need)} of {_gib(max(room, 0))} free for them")
        if need > room:
            parts = ", ".join(f"{n.model} {_gib(n.on(g.index))}" for n in needs if n.on(g.index))
            over.append(f"cuda:{g.index} {g.name}: {_gib(need)} planned ({parts}) but {_gib(max(room, 0))} free")
    text = f"pinned/preloaded {names} at {shape}: " + "; ".join(over or seen)
    if notes:
        text += "; " + "; ".join(notes)
    if over or notes:
        return Check("machine", "vram", "warn", text, fix="take a model out of engine.preload (`blazar config set "
                     "engine.preload ...`) or unpin it, a smaller fit.ctx, or free VRAM (nvidia-smi shows who holds "
                     "it)")
    return ok("machine", "vram", text)


def _device(g: NvmlGpu, *, empty: bool = False) -> Device:
    return Device(kind="cuda", index=g.index, name=g.name, total_bytes=g.total_bytes,
                  free_bytes=g.total_bytes if empty else g.free_bytes)


def must_stay(app: Blazar) -> list[str]:
    """engine.preload in order, then the pinned models loaded on this node."""
    pinned = [i.model for i in instances(app.runner.state("residency"), node=app.node or None) if i.pinned]
    return list(dict.fromkeys([*app.settings().engine.preload, *pinned]))


async def vram(app: Blazar, snap: NvmlSnapshot) -> Check | None:
    if not (snap.available and snap.gpus):
        return None  # machine.gpu already says CPU only
    models = must_stay(app)
    if not models:
        return ok("machine", "vram", "no pinned or preloaded model to hold in VRAM; "
                  + "; ".join(f"cuda:{g.index} {_gib(g.free_bytes)} free" for g in snap.gpus))
    s = app.settings().fit
    request = FitRequest(ctx=s.ctx or MIN_AUTO_CTX, slots=s.slots or 1)
    whole = [*(_device(g, empty=True) for g in snap.gpus), await asyncio.to_thread(host_device)]
    needs = []
    for m in models:
        try:
            needs.append(Need(m, await fit_model(app, m, request, whole)))
        except BlazarError as e:
            needs.append(Need(m, None, e.message))
    held: dict[int, int] = {}
    pids = {i.pid for i in instances(app.runner.state("residency"), node=app.node or None)
            if i.model in models and i.pid}
    for g in snap.gpus:
        held[g.index] = sum(b for pid, b in g.process_bytes.items() if pid in pids)
    shape = f"{request.ctx} ctx x {request.slots} slot(s)" + ("" if s.ctx else " (fit.ctx 0: the smallest automatic "
                                                              "context)")
    return vram_fit(needs, snap, held, shape)


async def gpu_checks(app: Blazar, nvml: Callable[[], NvmlSnapshot] = read_nvml) -> list[Check]:
    snap = await asyncio.to_thread(nvml)
    found = [nvml_check(snap), await backend(app, snap, active(app.runner.state("engines"))), await vram(app, snap)]
    return [c for c in found if c is not None]
