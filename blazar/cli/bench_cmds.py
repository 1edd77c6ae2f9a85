"""`blazar bench MODEL`: measure a model in the store at its current posture over the shipped workloads
(blazar/tuning/measure.py), recorded as `bench.recorded`; `blazar bench --history MODEL`: every such measurement of
it side by side, from the profiles projection."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from blazar.adapters.energy import EnergyMeter
from blazar.bootstrap import Blazar
from blazar.cli.common import JSON_OPTION, err, fmt_ts, opened, out, print_json, run, run_stoppable
from blazar.cli.daemon_client import find_daemon, tell_daemon
from blazar.events.tuning import BenchRecorded, Posture, WorkloadResult
from blazar.projections.catalog import stored
from blazar.projections.profiles import BenchEntry, benches
from blazar.queries.profiles import profile_status
from blazar.tuning.measure import MAX_CONCURRENCY, check_concurrency, measure
from blazar.tuning.workloads import WORKLOADS

_VERBATIM: dict[str, Any] = {"markup": False, "emoji": False}
_MIB = 1024 * 1024


def parse_concurrency(text: str) -> tuple[int, ...]:
    """"1,4" -> (1, 4); BadParameter for anything else."""
    try:
        levels = [int(part) for part in text.split(",") if part.strip()]
        return check_concurrency(levels)
    except ValueError as e:
        raise typer.BadParameter(f"{text!r}: give levels 1..{MAX_CONCURRENCY} separated by commas, e.g. 1,4 "
                                 f"({e})", param_hint="--concurrency") from None


def parse_workloads(text: str) -> tuple[str, ...]:
    """"all" or names separated by commas ("chat,code")."""
    if text.strip() == "all":
        return WORKLOADS
    names = tuple(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown or not names:
        raise typer.BadParameter(f"{text!r}: choose from {', '.join(WORKLOADS)} or all", param_hint="--workload")
    return names


def bench(
    model: Annotated[str, typer.Argument(help="A llama-server model in the store.")],
    ctx: Annotated[int | None, typer.Option("--ctx", min=1, help="Tokens per slot (default: what a load would "
                                            "plan: the ctx setting, else the largest that fits).")] = None,
    concurrency: Annotated[str, typer.Option("--concurrency", help="Streams at once, one round per level, e.g. "
                                             "1,4.")] = "1",
    workload: Annotated[str, typer.Option("--workload", help="chat, code, long, several separated by commas, or "
                                          "all.")] = "all",
    max_tokens: Annotated[int | None, typer.Option("--max-tokens", min=1, help="Cap each request's generated "
                                                   "tokens (default: each workload's own).")] = None,
    requests: Annotated[int | None, typer.Option("--requests", min=1, help="Only the first N requests of each "
                                                 "workload (default: all of them).")] = None,
    history: Annotated[bool, typer.Option("--history", help="Show every recorded bench of MODEL side by side "
                                          "instead of measuring.")] = False,
    as_json: bool = JSON_OPTION,
) -> None:
    """Measure MODEL at the posture it would load with (its adopted profile, else the defaults) in a private engine
    child: decode and prefill rates, TTFT, speculation counters, peak memory, energy where reported. Recorded."""
    if history:
        _history(model, as_json)
        return
    levels = parse_concurrency(concurrency)
    names = parse_workloads(workload)

    async def go() -> tuple[BenchRecorded, str, str, bool, Any]:
        async with opened() as app:
            daemon = find_daemon(app.paths) is not None
            posture, source = _posture(app, model)
            with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                          console=err, transient=True, disable=as_json) as bar:
                task = bar.add_task("starting the engine", total=None)

                def progress(done: int, total: int, label: str) -> None:
                    bar.update(task, completed=done, total=total, description=label)

                ev = await measure(app, model, posture, workloads=names, concurrency=levels, ctx=ctx,
                                   max_tokens=max_tokens, requests=requests, progress=progress)
            return ev, source, EnergyMeter().describe(), daemon, app.paths

    ev, source, energy, daemon, paths = run_stoppable(go(), "the bench's engine child was stopped; nothing recorded")
    tell_daemon(paths)
    if as_json:
        print_json(ev.model_dump(mode="json"))
        return
    _render(ev, source=source, energy=energy, daemon=daemon)


def _posture(app: Blazar, model: str) -> tuple[Posture, str]:
    """The posture a load of `model` would run at now (its adopted profile where it applies to the active engine and
    this machine, else the defaults: `profile_status`, as `blazar show` says it), and a line saying which. (An
    unknown model is measure's ModelNotFound.)"""
    got = stored(app.runner.state("catalog"), model)
    status = profile_status(app, got.name) if got is not None else None
    if status is None or status.profile is None:
        return Posture(), "the defaults (no profile adopted)"
    if status.stale is not None:
        return Posture(), f"the defaults (its profile, seq {status.profile.seq}, is stale: {status.stale})"
    return status.profile.posture, f"its adopted profile (seq {status.profile.seq})"


def _render(ev: BenchRecorded, *, source: str, energy: str, daemon: bool) -> None:
    m = ev.machine
    out.print(f"posture: {source}", **_VERBATIM)
    out.print(f"{ev.model} at {ev.posture.label()} on engine {ev.engine_tag} ({ev.engine_version or '?'}), ctx "
              f"{ev.ctx} per slot; {m.cpu}, {m.cores} cores, {m.memory_bytes / 2**30:.1f} GiB"
              + (f", {', '.join(m.gpus)}" if m.gpus else "") + f" (machine {m.fingerprint})", **_VERBATIM)
    if daemon:
        out.print("note: a daemon runs on this home: these numbers share the machine with it (and with whatever "
                  "else runs)", **_VERBATIM)
    table = Table("workload", "streams", "requests", "prompt tok", "gen tok", "prefill t/s", "decode t/s/stream",
                  "decode t/s system", "TTFT p50 ms", "TTFT p95 ms", "drafted/accepted", "J", "tok/J")
    for r in ev.results:
        table.add_row(r.workload, str(r.concurrency), str(r.requests), str(r.prompt_tokens), str(r.completion_tokens),
                      _num(r.prefill_tps), _num(r.decode_tps_stream), _num(r.decode_tps_system),
                      _num(r.ttft_ms_p50, 0), _num(r.ttft_ms_p95, 0), _spec(r), _num(r.energy_j),
                      _num(r.tokens_per_joule))
    out.print(table)
    rss = f"{ev.peak_rss_bytes / _MIB:,.0f} MiB" if ev.peak_rss_bytes is not None else "unknown"
    out.print(f"peak RSS {rss}; energy: {energy}; {ev.duration_s:.1f} s; recorded as bench {ev.bench_id} "
              "(blazar bench --history " + ev.model + ")", **_VERBATIM)


def _num(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def _spec(r: WorkloadResult) -> str:
    if r.draft_tokens is None:
        return "-"
    share = f" ({r.accepted_tokens / r.draft_tokens:.0%})" if r.draft_tokens and r.accepted_tokens is not None else ""
    return f"{r.draft_tokens}/{r.accepted_tokens}{share}"


def _history(model: str, as_json: bool) -> None:
    async def go() -> tuple[str, list[BenchEntry]]:
        async with opened() as app:
            got = stored(app.runner.state("catalog"), model)
            name = got.name if got is not None else model  # a removed model's benches stay readable
            return name, benches(app.runner.state("profiles"), name)

    name, entries = run(go())
    if as_json:
        print_json([{"seq": e.seq, "ts": e.ts, **e.bench.model_dump(mode="json")} for e in entries])
        return
    if not entries:
        err.print(f"no bench recorded for {name} (blazar bench {name} measures it)", **_VERBATIM)
        return
    shown = [w for w in WORKLOADS if any(r.workload == w for e in entries for r in e.bench.results)]
    table = Table("seq", "when", "purpose", "posture", "engine", "streams",
                  *[f"{w}" for w in shown], caption="each workload: decode t/s per stream · prefill t/s · TTFT p50 ms")
    for e in entries:
        for c in sorted({r.concurrency for r in e.bench.results}):
            cells = []
            for w in shown:
                r = next((r for r in e.bench.results if r.workload == w and r.concurrency == c), None)
                cells.append("-" if r is None else
                             f"{_num(r.decode_tps_stream)} · {_num(r.prefill_tps, 0)} · {_num(r.ttft_ms_p50, 0)}")
            table.add_row(str(e.seq), fmt_ts(e.ts), e.bench.purpose, e.bench.posture.label(), e.bench.engine_tag,
                          str(c), *cells)
    out.print(f"benches of {name} on this machine", **_VERBATIM)
    out.print(table)
