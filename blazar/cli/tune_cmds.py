"""`blazar tune MODEL`: measure candidate postures against the defaults and (with --apply) adopt the winner
(blazar/tuning/tune.py); `--reset` returns the model to the defaults. A progress bar on stderr, then the table."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from blazar.cli.common import JSON_OPTION, err, opened, out, print_json, run, run_stoppable
from blazar.cli.daemon_client import tell_daemon
from blazar.durations import parse_duration
from blazar.events.tuning import CandidateVerdict, ProfileReset
from blazar.paths import Paths
from blazar.tuning.candidates import FAMILIES, parse_only
from blazar.tuning.tune import TuneResult, reset, tune
from blazar.tuning.workloads import WORKLOADS, workload

_VERBATIM: dict[str, Any] = {"markup": False, "emoji": False}


def _ratio(v: CandidateVerdict) -> str:
    return " ".join(f"{w} {r:.2f}x" for w, r in v.ratio.items()) or "-"


def _tps(v: CandidateVerdict) -> str:
    return " ".join(f"{w} {t:.1f}" for w, t in v.decode_tps.items()) or "-"


def render(result: TuneResult) -> None:
    table = Table(title=f"blazar tune {result.model} (engine {result.engine_tag})", title_justify="left")
    for col in ("posture", "decode t/s", "vs defaults", "guard", "verdict"):
        table.add_column(col)
    for v in result.verdicts:
        guard = v.guard if v.guard_detail is None else f"{v.guard}: {v.guard_detail}"
        verdict = v.outcome + (f": {v.reason}" if v.reason else "")
        table.add_row(v.posture.label(), _tps(v), _ratio(v), guard, verdict)
    out.print(table)
    for note in result.notes:
        out.print(f"note: {note}", **_VERBATIM)
    out.print(f"rule: {result.rule}", **_VERBATIM)
    if result.recorded == "profile.adopted":
        out.print(f"adopted {result.winner.label() if result.winner else 'defaults'} (profile.adopted, seq "
                  f"{result.seq}): the next load of {result.model} runs at it", **_VERBATIM)
    elif result.recorded == "profile.reset":
        out.print(f"the defaults won: profile.reset (seq {result.seq})", **_VERBATIM)
    elif result.winner is not None:
        out.print(f"winner {result.winner.label()}: not adopted (run again with --apply)", **_VERBATIM)
    else:
        out.print("the defaults won: nothing to adopt", **_VERBATIM)


def tune_command(
    model: Annotated[str, typer.Argument(help="A model name from `blazar list`.")],
    budget: Annotated[str, typer.Option("--budget", help="How long to measure (5m, 600): candidates not reached are "
                                        "reported as pruned.")] = "10m",
    apply: Annotated[bool, typer.Option("--apply", help="Record the winner as the model's profile (profile.adopted): "
                                        "its next load runs at it.")] = False,
    reset_: Annotated[bool, typer.Option("--reset", help="Return the model to the default posture (profile.reset) "
                                         "and measure nothing.")] = False,
    only: Annotated[str | None, typer.Option("--only", help=f"Families to try, comma-separated: "
                                             f"{','.join(FAMILIES)}.")] = None,
    workload_: Annotated[list[str] | None, typer.Option("--workload", help=f"A workload to measure (repeat): "
                                                        f"{', '.join(WORKLOADS)}. Default: all.")] = None,
    max_tokens: Annotated[int | None, typer.Option("--max-tokens", min=1, help="Cap the tokens of every measured "
                                                   "request (faster, noisier).")] = None,
    requests: Annotated[int | None, typer.Option("--requests", min=1, help="Measure only the first N requests of "
                                                 "each workload (faster, noisier).")] = None,
    as_json: bool = JSON_OPTION,
) -> None:
    """Measure postures of MODEL (speculation, KV-cache types, threads, batch sizes, slots) against the defaults on
    this machine and engine build; guard each against the defaults' output; adopt the rule's winner with --apply."""
    try:
        budget_s = parse_duration(budget)
        families = parse_only(only)
        names = tuple(workload_ or WORKLOADS)
        for w in names:
            workload(w)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    if budget_s <= 0:
        raise typer.BadParameter("--budget must be positive")

    if reset_:
        async def go_reset() -> tuple[int, str, Paths]:
            async with opened() as app:
                rec = await reset(app, model)
                assert isinstance(rec.event, ProfileReset)
                return rec.seq, rec.event.model, app.paths

        seq, name, paths = run(go_reset())
        tell_daemon(paths)
        if as_json:
            print_json({"model": name, "recorded": "profile.reset", "seq": seq})
        else:
            out.print(f"{name}: profile.reset (seq {seq}): its next load runs at the defaults", **_VERBATIM)
        return

    async def go() -> tuple[TuneResult, Paths]:
        async with opened() as app:
            with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                          TimeElapsedColumn(), console=err, transient=True, disable=as_json) as bar:
                task = bar.add_task("tuning", total=1)

                def progress(what: str, done: int, planned: int) -> None:
                    bar.update(task, description=what, completed=done, total=planned)

                result = await tune(app, model, budget_s=budget_s, apply=apply, only=families, workloads=names,
                                    progress=progress, max_tokens=max_tokens,
                                    requests=requests)
            return result, app.paths

    result, paths = run_stoppable(go(), "the tune's engine children were stopped; nothing adopted")
    if result.recorded:
        tell_daemon(paths)
    if as_json:
        print_json(result.to_json())
    else:
        render(result)
