"""`blazar tune MODEL`: measure the defaults, then each candidate posture (blazar/tuning/candidates.py) within a
budget, pruning the clear losers after a short first pass; guard the survivors (blazar/tuning/guards.py), apply the
rule (blazar/tuning/rule.py) and, with `apply`, record `profile.adopted` (or `profile.reset` when the defaults win
over an adopted profile). Every measurement is a `bench.recorded` of purpose "tune" (blazar/tuning/measure.py); the
daemon's loads apply the adopted profile (blazar/projections/profiles.py)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx2

from blazar.adapters.engines.posture import ngram_types
from blazar.context import Blazar
from blazar.errors import BlazarError
from blazar.events.base import Recorded
from blazar.events.tuning import BenchRecorded, CandidateVerdict, Machine, Posture, ProfileAdopted, ProfileReset
from blazar.projections.profiles import profile
from blazar.store.engines import ActiveEngine, active_engine
from blazar.tuning import guards
from blazar.tuning.candidates import (TUNE_CTX, candidate_postures, drafts_for, parse_only, slots_that_fit,
                                      usable_cores)
from blazar.tuning.child import engine_child, resolve_model
from blazar.tuning.measure import measure
from blazar.tuning.rule import Standing, decide, prune, ratios
from blazar.tuning.workloads import WORKLOADS, workload

FIRST_PASS_TOKENS = 32  # tokens per request in the pruning pass
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


def decode_by_workload(bench: BenchRecorded) -> dict[str, float]:
    """Decode t/s per stream at concurrency 1, by workload (what the rule compares)."""
    return {r.workload: r.decode_tps_stream for r in bench.results if r.concurrency == 1}


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


async def tune(app: Blazar, model: str, *, budget_s: float, apply: bool, only: str | Sequence[str] | None = None,
               workloads: Sequence[str] = WORKLOADS, progress: Progress | None = None,
               max_tokens: int | None = None, postures: Sequence[Posture] | None = None) -> TuneResult:
    """Tune `model` on the active engine. `postures` replaces the candidates (tests, and a caller that knows what to
    try); `max_tokens` caps every workload request of the full measurement."""
    t0 = time.monotonic()
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
    first_tokens = min(FIRST_PASS_TOKENS, max_tokens) if max_tokens else FIRST_PASS_TOKENS
    planned = 2 + 2 * len(cands)  # baseline twice, each candidate up to twice; guards counted with the full pass
    done = 0

    def step(what: str) -> None:
        nonlocal done
        if progress is not None:
            progress(what, done, planned)
        done += 1

    async def bench(p: Posture, tokens: int | None) -> BenchRecorded:
        return await measure(app, got.name, p, engine=engine, workloads=tuple(workloads), ctx=TUNE_CTX,
                             purpose="tune", max_tokens=tokens)

    def spent() -> bool:
        return time.monotonic() - t0 > budget_s

    step("defaults: first pass")
    base_first = decode_by_workload(await bench(Posture(), first_tokens))
    verdicts: dict[Posture, CandidateVerdict] = {}
    first: dict[Posture, dict[str, float]] = {}
    for p in cands:
        step(f"{p.label()}: first pass")
        if spent():
            verdicts[p] = CandidateVerdict(posture=p, outcome="pruned",
                                           reason=f"the budget ({budget_s:.0f} s) was spent before it was measured")
            continue
        try:
            first[p] = decode_by_workload(await bench(p, first_tokens))
        except BlazarError as e:
            verdicts[p] = CandidateVerdict(posture=p, outcome="rejected", reason=f"could not run: {e}")
            continue
        why = prune(base_first, first[p])
        if why is not None:
            verdicts[p] = CandidateVerdict(posture=p, decode_tps=first[p], ratio=ratios(base_first, first[p]),
                                           outcome="pruned", reason=why)
    survivors = [p for p in cands if p not in verdicts]
    planned = done + 1 + 2 * len(survivors)
    step("defaults: full measurement")
    base_bench = await bench(Posture(), max_tokens)
    base = decode_by_workload(base_bench)
    full: dict[Posture, BenchRecorded] = {}
    for p in survivors:
        step(f"{p.label()}: full measurement")
        if spent():
            verdicts[p] = CandidateVerdict(posture=p, decode_tps=first[p], ratio=ratios(base_first, first[p]),
                                           outcome="pruned", reason=f"the budget ({budget_s:.0f} s) was spent "
                                                                    "before its full measurement")
            continue
        try:
            full[p] = await bench(p, max_tokens)
        except BlazarError as e:
            verdicts[p] = CandidateVerdict(posture=p, outcome="rejected", reason=f"could not run: {e}")
    guard = _Guard(app, got.name, engine, guard_prompts(workloads))
    results: dict[Posture, guards.GuardResult] = {}
    for p in full:
        step(f"{p.label()}: guard")
        if min(ratios(base, decode_by_workload(full[p])).values(), default=0.0) <= 0:
            continue  # measured nothing on a workload: the rule refuses it, no guard needed
        try:
            results[p] = await guard.check(p)
        except (BlazarError, httpx2.HTTPError, ValueError, KeyError) as e:
            results[p] = guards.GuardResult(False, f"the guard could not run: {e}")
    standings = [Standing(p.label(), decode_by_workload(b), results.get(p, guards.GuardResult(False, "")).passed)
                 for p, b in full.items()]
    decision = decide(base, standings)
    winner: Posture | None = None
    for p, b in full.items():
        tps = decode_by_workload(b)
        g = results.get(p)
        common = {"posture": p, "bench_id": b.bench_id, "decode_tps": tps, "ratio": ratios(base, tps),
                  "guard": "not_run" if g is None else ("passed" if g.passed else "failed"),
                  "guard_detail": None if g is None else g.detail}
        if decision.winner == p.label():
            winner = p
            verdicts[p] = CandidateVerdict(**common, outcome="adopted")
        else:
            reason = decision.reasons.get(p.label(), "")
            if g is not None and not g.passed:
                reason = f"failed its guard: {g.detail}"
            verdicts[p] = CandidateVerdict(**common, outcome="rejected", reason=reason)
    baseline = CandidateVerdict(posture=Posture(), bench_id=base_bench.bench_id, decode_tps=base,
                                ratio=dict.fromkeys(base, 1.0), outcome="baseline")
    ordered = [baseline, *(verdicts[p] for p in cands)]
    result = TuneResult(model=got.name, engine_tag=engine.tag, machine=base_bench.machine, verdicts=ordered,
                        winner=winner, rule=decision.summary, notes=notes,
                        bench_id=full[winner].bench_id if winner is not None else None)
    if apply:
        rec = await _record(app, result)
        if rec is not None:
            result.recorded, result.seq = rec.event.TYPE, rec.seq
    step("done")
    return result


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
