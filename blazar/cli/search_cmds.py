"""`blazar search` (GGUF models on the hub, and whether each fits this machine, before any download) and
`blazar drafts` (the models in the store that could draft for a model, and what `tune` measured of them)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table
from rich.text import Text

from blazar.cli.common import JSON_OPTION, opened, out, print_json, run
from blazar.fit.refusal import fmt_bytes

if TYPE_CHECKING:
    from blazar.queries.hub_search import SearchResult, Verdict
    from blazar.tuning.drafts import DraftGain


def search(
    query: Annotated[str, typer.Argument(help="Words of the repo id (as the hub's own search takes them).")],
    limit: Annotated[int, typer.Option("--limit", min=1, max=100, help="Repos listed, at most.")] = 10,
    quant: Annotated[str | None, typer.Option("--quant", help="Only this quantization (Q4_K_M, Q8_0, ...).")] = None,
    as_json: bool = JSON_OPTION,
) -> None:
    """Search the hub (HF_ENDPOINT) for GGUF repos: each quantization's size and whether it fits this machine,
    planned from its GGUF header alone (range requests; nothing is downloaded)."""
    from blazar.instances.planning import devices_now
    from blazar.queries.hub_search import SearchBudget, search_hub

    async def go() -> SearchResult:
        async with opened() as app:
            hub = app.hub()
            devices = await asyncio.to_thread(devices_now)
            return await asyncio.to_thread(search_hub, hub, devices, query, SearchBudget(repos=limit), quant=quant)

    result = run(go())
    if as_json:
        print_json(result.model_dump(mode="json"))
        return
    if not result.repos:
        out.print(Text(f"no GGUF repos on {result.endpoint} match {query!r}"))
        return
    # NOTE: cells as Text, never markup: repo ids and reasons come from the hub ("[red]" in one is not a style).
    table = Table("model", "size", "fits", box=None, header_style="bold")
    for r in result.repos:
        if r.error is not None:
            table.add_row(Text(r.repo), "", Text(r.error))
        elif not r.models:
            table.add_row(Text(r.repo), "", Text("no GGUF model" + (f" in {quant}" if quant else "")))
        for m in r.models:
            table.add_row(Text(m.target), fmt_bytes(m.size_bytes), Text(_said(m.verdict)))
    out.print(table)
    out.print(Text(f"{len(result.repos)} repo(s) on {result.endpoint}; {fmt_bytes(result.header_bytes_read)} of "
                   "headers read; `blazar pull MODEL` fetches one"))


def _said(v: Verdict) -> str:
    if v.fits:
        return f"yes: {v.where}, ctx {v.ctx}"
    return f"no: {v.detail}" if v.fits is False else v.detail


def drafts(
    model: Annotated[str, typer.Argument(help="A model in the store.")],
    as_json: bool = JSON_OPTION,
) -> None:
    """The models in the store that could draft for MODEL in speculative decoding (the same tokenizer, smaller):
    whether each fits beside it, and the decode speed-up `blazar tune` last measured with it."""
    from blazar.tuning.drafts import DraftReport, draft_report

    async def go() -> DraftReport:
        async with opened() as app:
            return await draft_report(app, model)

    report = run(go())
    if as_json:
        print_json(report.model_dump(mode="json"))
        return
    if not report.drafts:
        out.print(Text(f"no model in the store could draft for {report.model}"))
    else:
        table = Table("draft", "size", "fits beside", "last measured gain", box=None, header_style="bold")
        for d in report.drafts:
            table.add_row(Text(d.name), fmt_bytes(d.bytes), Text("yes" if d.fits_beside else f"no: {d.fit_detail}"),
                          _gain(d.gain))
        out.print(table)
    for name, why in sorted(report.others.items()):
        out.print(Text(f"not a draft: {name} ({why})"))


def _gain(g: DraftGain | None) -> str:
    if g is None:
        return "not measured"
    each = ", ".join(f"{w} {x:.2f}x" for w, x in sorted(g.by_workload.items()))
    return f"{g.ratio:.2f}x decode ({each}; engine {g.engine_tag})"
