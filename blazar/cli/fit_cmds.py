"""`blazar fit` (will a model fit, and how) and `blazar coreside` (which models can stay loaded together)."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from blazar.cli.common import JSON_OPTION, opened, out, print_json, run
from blazar.fit import FitRequest
from blazar.fit.ggml_types import CACHE_TYPES
from blazar.instances.planning import coreside_models, fit_model, fit_with_workers

_MIB = 1024 * 1024


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / _MIB:,.0f} MiB"


def _request(ctx: int | None, slots: int | None, cache_type: str | None, gpu_layers: int | None) -> FitRequest:
    if cache_type is not None and cache_type not in CACHE_TYPES:
        raise typer.BadParameter(f"{cache_type!r}: choose one of {', '.join(CACHE_TYPES)}", param_hint="--cache-type")
    return FitRequest(ctx=ctx, slots=slots, cache_type_k=cache_type, cache_type_v=cache_type, gpu_layers=gpu_layers)


CTX = typer.Option(None, "--ctx", min=1, help="Tokens per slot (default: the largest that fits, up to the trained).")
SLOTS = typer.Option(1, "--slots", min=1, max=256, help="Parallel sequences (llama-server -np).")
CACHE = typer.Option(None, "--cache-type", help="KV cache type (f16, q8_0, q4_0, ...); default: walk f16→q8_0→q4_0.")
NGL = typer.Option(None, "--gpu-layers", min=0, help="Layers to offload (default: all that fit).")


def fit(
    model: Annotated[str, typer.Argument(help="A model in the store, or a hub target owner/repo[:QUANT] "
                                              "(only its header is read, with range requests)")],
    ctx: int | None = CTX,
    slots: int = SLOTS,
    cache_type: str | None = CACHE,
    gpu_layers: int | None = NGL,
    workers: Annotated[bool, typer.Option(
        "--workers", help="Plan as the daemon does when a model does not fit here: within memory_limit_mib, with "
        "the idle RPC workers (`blazar worker`) taking the fewest layers that make it fit.")] = False,
    as_json: bool = JSON_OPTION,
) -> None:
    """Plan a model on this machine's devices: per-device bytes, the largest ctx and slots, or why it cannot fit."""
    request = _request(ctx, slots, cache_type, gpu_layers)

    async def go() -> Any:
        async with opened() as app:
            if workers:
                return await fit_with_workers(app, model, request)
            return await fit_model(app, model, request)

    p = run(go())
    if as_json:
        print_json(p.model_dump(mode="json"))
    else:
        out.print(p.summary)
        table = Table("device", "layers", "weights", "kv", "compute", "output", "fixed", "total", "budget",
                      box=None, header_style="bold")
        for u in p.devices:
            device = u.key + (f" {u.name}" if u.kind == "rpc" else "")
            table.add_row(device, str(u.layers), _mib(u.weights_bytes), _mib(u.kv_bytes), _mib(u.compute_bytes),
                          _mib(u.output_bytes), _mib(u.fixed_bytes), _mib(u.total_bytes), _mib(u.budget_bytes))
        out.print(table)
        out.print(f"largest ctx at {p.slots} slot(s): {p.max_ctx_at_slots or '-'}; "
                  f"most slots at ctx {p.ctx_per_slot}: {p.max_slots_at_ctx or '-'}")
        for note in p.notes:
            out.print(f"note: {note}")
    if not p.fits:
        raise typer.Exit(6)


def coreside(
    models: Annotated[list[str], typer.Argument(help="Models in priority order (first = most important).")],
    ctx: int | None = CTX,
    slots: int = SLOTS,
    cache_type: str | None = CACHE,
    as_json: bool = JSON_OPTION,
) -> None:
    """Which of these models can stay resident together, each at its planned context, with the numbers."""
    request = _request(ctx, slots, cache_type, None)

    async def go() -> Any:
        async with opened() as app:
            return await coreside_models(app, models, request)

    cp, plans = run(go())
    if as_json:
        print_json({"coreside": cp.model_dump(mode="json"),
                    "plans": {name: p.model_dump(mode="json") for name, p in plans}})
        return
    out.print(cp.summary)
    table = Table("model", "status", "ctx x slots", "bytes", "why", box=None, header_style="bold")
    for r in cp.resident:
        table.add_row(r.name, "resident", f"{r.ctx_per_slot} x {r.slots}", _mib(sum(r.bytes_by_device.values())), "")
    for d in cp.deferred:
        table.add_row(d.name, "deferred", "", _mib(d.need_bytes), d.reason)
    out.print(table)
    for t in cp.devices:
        out.print(f"{t.key}: {_mib(t.used_bytes)} used of {_mib(t.budget_bytes)}, {_mib(t.left_bytes)} left")
