"""The plan of a model that is not a GGUF (a whisper model, a piper voice): its kind's memory model gives one figure
(its files' bytes times a factor plus the runtime's overhead, blazar/adapters/engines/kinds.py), charged on the host;
there is no context, slot count or offload to choose. It fits when the host's budget holds it."""

from __future__ import annotations

from blazar.fit.devices import Device, budget_bytes, host_of
from blazar.fit.layout import DeviceUse
from blazar.fit.planner import FitPlan
from blazar.fit.refusal import Refusal, fmt_bytes


def fixed_plan(model: str, kind: str, need_bytes: int, devices: list[Device], *, slots: int = 1) -> FitPlan:
    """One child of `kind` holding `need_bytes` on the host (the CPU runtimes of whisper and piper)."""
    host = host_of(devices)
    budget = budget_bytes(host)
    fits = need_bytes <= budget
    use = DeviceUse(key="host", kind="host", name=host.name, fixed_bytes=need_bytes, total_bytes=need_bytes,
                    budget_bytes=budget, free_bytes=budget - need_bytes)
    said = (f"{model} ({kind}, charged by its memory model) {'fits' if fits else 'does not fit'}: "
            f"host {fmt_bytes(need_bytes)} of {fmt_bytes(budget)}.")
    refusal = None if fits else Refusal(
        reason="over_budget", device=host.name, need_bytes=need_bytes, budget_bytes=budget,
        detail=f"{model} ({kind}) needs {fmt_bytes(need_bytes)} on the host and {fmt_bytes(budget)} is available")
    return FitPlan(fits=fits, model=model, architecture=kind, ctx_per_slot=0, ctx_total=0, engine_ctx=0, slots=slots,
                   kv_unified=False, cache_type_k="f16", cache_type_v="f16", gpu_layers=0, offloadable_layers=0,
                   n_ubatch=0, n_batch=0, flash_attn=False, swa_full=False, kv_bytes=0, total_bytes=need_bytes,
                   estimate_bytes=need_bytes, correction_bytes=0, devices=[use], max_ctx_at_slots=None,
                   max_slots_at_ctx=slots if fits else None, refusal=refusal,
                   notes=[f"a {kind} model is charged its memory model, not planned from a GGUF"],
                   summary=said)
