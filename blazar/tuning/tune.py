"""`blazar tune MODEL`: measure the defaults, then each candidate posture (blazar/tuning/candidates.py) within a
budget, pruning the clear losers after a short first pass; guard the survivors (blazar/tuning/guards.py), apply the
rule (blazar/tuning/rule.py) and, with `apply`, record `profile.adopted` (or `profile.reset` when the defaults win
over an adopted profile). Every measurement is a `bench.recorded` of purpose "tune" (blazar/tuning/measure.py); the
daemon's loads apply the adopted profile (blazar/projections/profiles.py)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx2

from blazar.adapters.engines.posture import ngram_types
from blazar.adapters.machine import usable_cores
from blazar.context import Blazar
from blazar.errors import BlazarError
from blazar.events.base import Recorded
from blazar.events.tuning import BenchRecorded, CandidateVerdict, Machine, Posture, ProfileAdopted, ProfileReset
from blazar.projections.profiles import profile
from blazar.store.engines import ActiveEngine, active_engine
from blazar.tuning import guards
from blazar.tuning.candidates import TUNE_CTX, candidate_postures, parse_only, slots_that_fit
from blazar.tuning.child import engine_child, resolve_model
from blazar.tuning.drafts import drafts_for
from blazar.tuning.measure import measure
from blazar.tuning.rule import FLOOR, Standing, decide, decode_by_workload, prune, ratios
from blazar.tuning.workloads import WORKLOADS, workload

FIRST_PASS_TOKENS = 32  # tokens per request in the pruning pass (one request per workload)
GUARD_PROMPTS = 3
GUARD_TIMEOUT_S = 120.0

Progress = Callable[[str, int, int], None]  # (what now, steps done, steps planned)


@dataclass
class TuneResult:
    model: str
    engine_tag: str
    machine: Machine | None
    verdicts: list[CandidateVerdict]  # the baseline first, then every candidate in the order tried
    winner: Posture | None  # None: the defaults stay
    rule: str  # the rule with its numbers
    bench_id: str | None = None  # the winner's full measurement
    recorded: str | None = None  # "profile.adopted" / "profile.reset" when applied, else None
    seq: int | None = None
    notes: list[str] = field(default_factory=list)  # drafts not offered and why, budget notes

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "engine_tag": self.engine_tag,
                "machine": self.machine.model_dump(mode="json") if self.machine else None,
                "winner": self.winner.model_dump(mode="json", exclude_none=True) if self.winner else None,
                "winner_label": self.winner.label() if self.winner else "defaults", "rule": self.rule,
                "bench_id": self.bench_id, "recorded": self.recorded, "seq": self.seq, "notes": self.notes,
                "candidates": [v.model_dump(mode="json") for v in self.verdicts]}


def guard_prompts(names: Sequence[str]) -> list[str]:
    """Fixed texts for the guards: the first request of each workload (a chat's turns joined as plain text)."""
    texts = []
    for name in names:
        req = workload(name).requests[0]
        texts.append(req.prompt if req.prompt is not None else "\n".join(c for _, c in req.messages))
    return texts[:GUARD_PROMPTS]


async def candidates_for(app: Blazar, model: str, engine: ActiveEngine,
                         families: Sequence[str]) -> tuple[list[Posture], list[str]]:
    """The postures to try and notes on what was left out (drafts that do not qualify)."""
    notes: list[str] = []
    drafts: list[str] = []
    if "spec" in families:
        for name, why in await drafts_for(app, model):
            if why:
                notes.append(f"{name} is not a draft: {why}")
            else:
                drafts.append(name)
    slots = await slots_that_fit(app, model) if "slots" in families else []
    postures = candidate_postures(families=families, ngram_types=ngram_types(engine.caps), drafts=drafts,
                                  cores=usable_cores(), slots=slots)
    return postures, notes


class _Guard:
    """The defaults' reference outputs, computed once, and each candidate's guard against them."""

    def __init__(self, app: Blazar, model: str, engine: ActiveEngine, prompts: list[str]) -> None:
        self.app, self.model, self.engine, self.prompts = app, model, engine, prompts
        self.ids: list[list[int]] = []
        self.reference: list[list[int]] = []
        self.base_scored: list[list[guards.Scored]] | None = None

    async def _reference(self, drift: bool) -> None:
        if self.reference and (self.base_scored is not None or not drift):
            return
        async with engine_child(self.app, self.model, Posture(), engine=self.engine, ctx=TUNE_CTX) as child, \
                httpx2.AsyncClient(trust_env=False, timeout=GUARD_TIMEOUT_S) as client:
            if not self.reference:
                self.ids = [await guards.tokenize(client, child.base_url, child.api_key, p) for p in self.prompts]
                self.reference = [await guards.greedy_tokens(client, child.base_url, child.api_key, ids)
                                  for ids in self.ids]
            if drift and self.base_scored is None:
                self.base_scored = [await guards.score_along(client, child.base_url, child.api_key, ids, ref)
                                    for ids, ref in zip(self.ids, self.reference, strict=True)]

    async def check(self, posture: Posture) -> guards.GuardResult:
        kind = guards.guard_kind(posture)
        await self._reference(kind == "drift")
        async with engine_child(self.app, self.model, posture, engine=self.engine, ctx=TUNE_CTX) as child, \
                httpx2.AsyncClient(trust_env=False, timeout=GUARD_TIMEOUT_S) as client:
            if kind == "identity":
                got = [await guards.greedy_tokens(client, child.base_url, child.api_key, ids) for ids in self.ids]
                return guards.identity_verdict(self.reference, got)
            assert self.base_scored is not None
            cand = [await guards.score_along(client, child.base_url, child.api_key, ids, ref)
                    for ids, ref in zip(self.ids, self.reference, strict=True)]
        flat_ref = [t for ref in self.reference for t in ref]
        return guards.drift_verdict(flat_ref, [s for b in self.base_scored for s in b], [s for c in cand for s in c])


@dataclass
class _Run:
    """One tuning run's state between its phases."""

    app: Blazar
    model: str
    engine: ActiveEngine
    workloads: tuple[str, ...]
    budget_s: float
    max_tokens: int | None
    requests: int | None
    progress: Progress | None
    t0: float = field(default_factory=time.monotonic)
    done: int = 0
    planned: int = 1
    verdicts: dict[Posture, CandidateVerdict] = field(default_factory=dict)

    def step(self, what: str) -> None:
        if self.progress is not None:
            self.progress(what, self.done, self.planned)
        self.done += 1

    def spent(self) -> bool:
        return time.monotonic() - self.t0 > self.budget_s

    async def bench(self, p: Posture, *, first: bool) -> BenchRecorded:
        tokens = (min(FIRST_PASS_TOKENS, self.max_tokens or FIRST_PASS_TOKENS)) if first else self.max_tokens
        return await measure(self.app, self.model, p, engine=self.engine, workloads=self.workloads, ctx=TUNE_CTX,
                             purpose="tune", max_tokens=tokens, requests=1 if first else self.requests)

    async def first_pass(self, cands: list[Posture]) -> tuple[dict[str, float], dict[Posture, dict[str, float]]]:
        """The defaults and every candidate, one short request per workload; the clear losers pruned."""
        self.planned = 2 + 2 * len(cands)
        self.step("defaults: first pass")
        base = decode_by_workload(await self.bench(Posture(), first=True))
        first: dict[Posture, dict[str, float]] = {}
        for p in cands:
            self.step(f"{p.label()}: first pass")
            if self.spent():
                self.verdicts[p] = CandidateVerdict(
                    posture=p, outcome="pruned", reason=f"the budget ({self.budget_s:.0f} s) was spent before it was "
                                                        "measured")
                continue
            try:
                first[p] = decode_by_workload(await self.bench(p, first=True))
            except BlazarError as e:
                self.verdicts[p] = CandidateVerdict(posture=p, outcome="rejected", reason=f"could not run: {e}")
                continue
            why = prune(base, first[p])
            if why is not None:
                self.verdicts[p] = CandidateVerdict(posture=p, decode_tps=first[p], ratio=ratios(base, first[p]),
                                                    outcome="pruned", reason=why)
        return base, first

    async def full_pass(self, survivors: list[Posture], base_first: dict[str, float],
                        first: dict[Posture, dict[str, float]]) -> tuple[BenchRecorded, dict[Posture, BenchRecorded]]:
        self.planned = self.done + 1 + 2 * len(survivors) + 1
        self.step("defaults: full measurement")
        base = await self.bench(Posture(), first=False)
        full: dict[Posture, BenchRecorded] = {}
        for p in survivors:
            self.step(f"{p.label()}: full measurement")
            if self.spent():
                self.verdicts[p] = CandidateVerdict(
                    posture=p, decode_tps=first[p], ratio=ratios(base_first, first[p]), outcome="pruned",
                    reason=f"the budget ({self.budget_s:.0f} s) was spent before its full measurement")
                continue
            try:
                full[p] = await self.bench(p, first=False)
            except BlazarError as e:
                self.verdicts[p] = CandidateVerdict(posture=p, outcome="rejected", reason=f"could not run: {e}")
        return base, full

    async def guard_all(self, base: dict[str, float],
                        full: dict[Posture, BenchRecorded]) -> dict[Posture, guards.GuardResult]:
        guard = _Guard(self.app, self.model, self.engine, guard_prompts(self.workloads))
        results: dict[Posture, guards.GuardResult] = {}
        for p, b in full.items():
            self.step(f"{p.label()}: guard")
            if min(ratios(base, decode_by_workload(b)).values(), default=0.0) < FLOOR:
                continue  # the rule refuses it whatever its guard says: no need to spend the time
            try:
                results[p] = await guard.check(p)
            except (BlazarError, httpx2.HTTPError, ValueError, KeyError) as e:
                results[p] = guards.GuardResult(False, f"the guard could not run: {e}")
        return results


async def tune(app: Blazar, model: str, *, budget_s: float, apply: bool, only: str | Sequence[str] | None = None,
               workloads: Sequence[str] = WORKLOADS, progress: Progress | None = None,
               max_tokens: int | None = None, requests: int | None = None,
               postures: Sequence[Posture] | None = None) -> TuneResult:
    """Tune `model` on the active engine. `postures` replaces the candidates (a caller that knows what to try);
    `max_tokens` caps every workload request of the full measurement, `requests` takes the first N of each workload
    (the first pass always takes one)."""
    families = parse_only(only)
    for w in workloads:
        workload(w)  # ValueError names the shipped ones
    got = resolve_model(app, model)
    engine = active_engine(app)
    notes: list[str] = []
    if postures is None:
        cands, notes = await candidates_for(app, got.name, engine, families)
    else:
        cands = list(dict.fromkeys(p for p in postures if not p.is_default()))
    run = _Run(app, got.name, engine, tuple(workloads), budget_s, max_tokens, requests, progress)
    base_first, first = await run.first_pass(cands)
    base_bench, full = await run.full_pass([p for p in cands if p not in run.verdicts], base_first, first)
    base = decode_by_workload(base_bench)
    results = await run.guard_all(base, full)
    decision = decide(base, [Standing(p.label(), decode_by_workload(b), p not in results or results[p].passed)
                             for p, b in full.items()])
    winner = next((p for p in full if p.label() == decision.winner), None)
    for p, b in full.items():
        run.verdicts[p] = _verdict(p, b, base, results.get(p), decision.reasons.get(p.label(), ""), p == winner)
    baseline = CandidateVerdict(posture=Posture(), bench_id=base_bench.bench_id, decode_tps=base,
                                ratio=dict.fromkeys(base, 1.0), outcome="baseline")
    result = TuneResult(model=got.name, engine_tag=engine.tag, machine=base_bench.machine,
                        verdicts=[baseline, *(run.verdicts[p] for p in cands)], winner=winner, rule=decision.summary,
                        notes=notes, bench_id=full[winner].bench_id if winner is not None else None)
    if apply:
        rec = await _record(app, result)
        if rec is not None:
            result.recorded, result.seq = rec.event.TYPE, rec.seq
    run.step("done")
    return result


def _verdict(p: Posture, b: BenchRecorded, base: dict[str, float], g: guards.GuardResult | None, reason: str,
             won: bool) -> CandidateVerdict:
    tps = decode_by_workload(b)
    guard: Literal["passed", "failed", "not_run"] = "not_run" if g is None else ("passed" if g.passed else "failed")
    if g is not None and not g.passed:
        reason = f"failed its guard: {g.detail}"
    return CandidateVerdict(posture=p, bench_id=b.bench_id, decode_tps=tps, ratio=ratios(base, tps), guard=guard,
                            guard_detail=None if g is None else g.detail, outcome="adopted" if won else "rejected",
                            reason=None if won else reason)


async def _record(app: Blazar, result: TuneResult) -> Recorded | None:
    """profile.adopted for a winner; profile.reset when the defaults won over an adopted profile; else nothing."""
    if result.winner is not None:
        assert result.machine is not None
        ev: ProfileAdopted | ProfileReset = ProfileAdopted(
            model=result.model, posture=result.winner, engine_tag=result.engine_tag, machine=result.machine,
            rule=result.rule, bench_id=result.bench_id, candidates=result.verdicts)
    elif profile(app.runner.state("profiles"), result.model) is not None:
        ev = ProfileReset(model=result.model, reason=f"blazar tune: the defaults won ({result.rule})")
    else:
        return None
    return (await app.record(ev))[0]


async def reset(app: Blazar, model: str, reason: str = "blazar tune --reset") -> Recorded:
    """`blazar tune MODEL --reset`: back to the defaults from the next load (recorded even with no profile, so the
    log says the operator asked)."""
    got = resolve_model(app, model)
    return (await app.record(ProfileReset(model=got.name, reason=reason)))[0]
