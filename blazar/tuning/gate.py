"""The engine gate: before `engine use|install|build` makes a build active (after verify and the smoke test,
blazar/store/engines.py `_activate`), the pinned or most requested models are measured briefly on the active build
and on the candidate, back to back, and a candidate decoding more than `engine_gate_threshold` slower is refused
unless forced. Each check is an `engine.gate_checked`; the decisions are blazar/tuning/gate_rules.py's.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from blazar.context import Blazar
from blazar.errors import BlazarError, EngineRefused
from blazar.events.tuning import BenchRecorded, EngineGateChecked, GateModel, Posture
from blazar.projections import catalog, metrics, residency
from blazar.store.engines import ActiveEngine, Gate, Progress, active_engine, engine_of
from blazar.tuning.gate_rules import MAX_MODELS, Run, Selection, compare, decide, schedule, select_models, table
from blazar.tuning.measure import measure as bench_measure

# Measurements per build and model, in the order A B B A (gate_rules.schedule): a machine getting busier or quieter
# at a steady pace weighs on both builds alike, and the median of two is their mean.
RUNS = 2
MAX_TOKENS = 32  # tokens per request: enough for a steady decode rate, short enough to keep the gate brief
REQUESTS = 2  # of the chat workload's, per run


# blazar.tuning.measure.measure's shape (a fake in unit tests of the decisions).
MeasureFn = Callable[..., Awaitable[BenchRecorded]]


def engine_gate(*, force: bool = False, progress: Progress | None = None, measure: MeasureFn | None = None,
                runs: int = RUNS) -> Gate:
    """The check `_activate` runs for `engine use|install|build`; `force` activates a failing build anyway (the
    event says so)."""

    async def check(app: Blazar, tag: str, cause: int) -> int | None:
        return await check_engine(app, tag, cause=cause, force=force, progress=progress, measure=measure, runs=runs)

    return check


def gate_selection(app: Blazar) -> Selection:
    """The models the gate would measure now, from the setting, the loaded instances and the request counts."""
    servable = {m.name for m in catalog.models(app.runner.state("catalog")) if m.kind == "llama-server"}
    loaded = residency.instances(app.runner.state("residency"), node=app.node)
    pinned = [i.model for i in loaded if i.pinned or i.keep_alive_s is None]
    completed: dict[str, int] = {}
    for (status, _dialect, model), n in metrics.counter(app.runner.state("metrics"), "requests"):
        if status.startswith("2") and model:  # request.completed (a refusal or failure has its error status)
            completed[model] = completed.get(model, 0) + n
    return select_models(configured=app.settings().engine.engine_gate_models, pinned=pinned, requests=completed,
                         servable=servable, limit=MAX_MODELS)


def describe_gate(app: Blazar) -> str:
    """What the engine gate would do for a candidate now, in one line (`engine update --check`): measures nothing."""
    settings = app.settings().engine
    try:
        current = active_engine(app).tag
    except BlazarError:
        return "engine gate: no engine is active, so nothing to compare with"
    if not settings.engine_gate:
        return "engine gate: off (engine.engine_gate = false)"
    selection = gate_selection(app)
    if not selection.models:
        return f"engine gate: {selection.note}"
    return (f"engine gate: {', '.join(selection.models)} ({selection.source}) measured on {current} and the new build; "
            f"refused if more than {settings.engine_gate_threshold:.0%} slower")


def _decode_tps(bench: BenchRecorded) -> float:
    rates = [r.decode_tps_stream for r in bench.results if r.workload == "chat" and r.concurrency == 1]
    return rates[0] if rates else 0.0


async def _measure_model(app: Blazar, model: str, builds: dict[str, ActiveEngine], *, measure: MeasureFn,
                         runs: int, say: Progress) -> GateModel:
    got: dict[str, list[Run]] = {"active": [], "candidate": []}
    for i, side in enumerate(schedule(runs)):
        bench = await measure(app, model, Posture(), engine=builds[side], workloads=("chat",), concurrency=(1,),
                              purpose="gate", max_tokens=MAX_TOKENS, requests=REQUESTS)
        got[side].append(Run(_decode_tps(bench), bench.bench_id))
        say(f"gate: {model} on {side} build {builds[side].tag}: {got[side][-1].decode_tps:.1f} t/s "
            f"({i + 1}/{2 * runs})")
    return compare(model, got["active"], got["candidate"])


async def check_engine(app: Blazar, tag: str, *, cause: int | None = None, force: bool = False,
                       progress: Progress | None = None, measure: MeasureFn | None = None,
                       runs: int = RUNS) -> int | None:
    """Measure `tag` against the active build and record `engine.gate_checked`; returns its seq (None: the gate is
    off, or there is nothing to compare with). A failure raises EngineRefused unless `force`."""
    say = progress or (lambda _line: None)
    settings = app.settings()
    if not settings.engine.engine_gate:
        say("the engine gate is off (engine.engine_gate = false): not measured against the active build")
        return None
    try:
        active = active_engine(app)
    except BlazarError:
        return None  # no engine active (the first activation), or one that cannot run: nothing to compare with
    if active.tag == tag:
        return None
    measure = measure or bench_measure
    selection = gate_selection(app)
    threshold = settings.engine.engine_gate_threshold
    models: list[GateModel] = []
    passed, detail = True, selection.note
    if selection.models:
        say(f"engine gate: {', '.join(selection.models)} ({selection.source}) on {active.tag} and {tag}, "
            f"{runs} run(s) each")
        builds = {"active": active, "candidate": engine_of(app, tag)}
        try:
            for model in selection.models:
                models.append(await _measure_model(app, model, builds, measure=measure, runs=runs, say=say))
            passed, verdict = decide(models, threshold)
            detail = "; ".join(x for x in (verdict, selection.note) if x)
        except BlazarError as e:  # a build that cannot serve a model it must is not measured as fast enough
            passed, detail = False, f"measurement failed: {e.message}"
    else:
        say(f"engine gate: {selection.note}")
    (rec,) = await app.record(EngineGateChecked(
        candidate_tag=tag, active_tag=active.tag, models=models, threshold=threshold, passed=passed,
        forced=force and not passed, detail=detail), cause=cause)
    lines = table(models) if models else []
    if lines:
        say(f"engine gate: active {active.tag}, candidate {tag} (decode tokens/s per stream, median of {runs}):")
    for line in lines:
        say(line)
    if passed:
        return rec.seq
    if force:
        say(f"engine gate failed ({detail}); activating {tag} anyway (--force)")
        return rec.seq
    raise EngineRefused(_refusal(tag, active.tag, detail, lines), tag=tag, reason="gate_failed", seq=rec.seq)


def _refusal(tag: str, active_tag: str, detail: str, lines: Sequence[str]) -> str:
    numbers = ("\n" + "\n".join(lines)) if lines else ""
    return (f"engine {tag} failed the engine gate, so it was not activated (the active engine stays {active_tag}): "
            f"{detail}.{numbers}\nActivate it anyway with --force; set engine.engine_gate_threshold or "
            "engine.engine_gate = false to change the gate.")
