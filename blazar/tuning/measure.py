"""A benchmark of one model at one posture: the shipped workloads (blazar/tuning/workloads.py) at each concurrency,
streamed through a private engine child (blazar/tuning/child.py), recorded as one `bench.recorded`.

Per round (one workload at one concurrency): TTFT as the client saw it (the first chunk with text), prefill and
per-stream decode rates from the engine's own `timings` in each final chunk, system decode = every generated token
over the round's wall time, the speculative drafted/accepted counters as /metrics deltas, and energy where the
machine reports it (blazar/adapters/energy.py). `blazar bench`, `blazar tune` and the engine gate all measure here.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx2
import orjson

from blazar.adapters.energy import EnergyMeter
from blazar.adapters.machine import this_machine
from blazar.context import Blazar
from blazar.errors import EngineError
from blazar.events.tuning import BenchRecorded, Posture, Purpose, WorkloadResult, is_workload
from blazar.ids import new_trace_id
from blazar.store.engines import ActiveEngine, active_engine
from blazar.tuning.child import EngineChild, engine_child, resolve_model
from blazar.tuning.stats import mean, percentile, rate
from blazar.tuning.workloads import WORKLOADS, BenchRequest, workload

Progress = Callable[[int, int, str], None]  # (requests done, requests in all, what runs now)

DRAFTED = "llamacpp:spec_decode_num_draft_tokens_total"
ACCEPTED = "llamacpp:spec_decode_num_accepted_tokens_total"
REQUEST_TIMEOUT_S = 600.0  # one request on a slow CPU with a long prompt; a hung engine still ends the bench
MAX_CONCURRENCY = 64


@dataclass(frozen=True)
class Outcome:
    """One request as measured: the client's TTFT, the engine's counts and timings."""

    ttft_ms: float
    prompt_tokens: int
    completion_tokens: int
    prompt_n: int  # tokens the engine prefilled (all of them: the workloads turn prompt caching off)
    prompt_ms: float
    predicted_n: int
    predicted_ms: float


def check_concurrency(levels: Sequence[int]) -> tuple[int, ...]:
    """Distinct levels in the order given, each 1..MAX_CONCURRENCY; ValueError says which is wrong."""
    if not levels:
        raise ValueError("no concurrency level given")
    out: list[int] = []
    for c in levels:
        if not 1 <= c <= MAX_CONCURRENCY:
            raise ValueError(f"concurrency {c} outside 1..{MAX_CONCURRENCY}")
        if c not in out:
            out.append(c)
    return tuple(out)


def plan_rounds(workloads: Sequence[str], concurrency: Sequence[int], *,
                requests: int | None = None) -> list[tuple[str, int, list[BenchRequest]]]:
    """(workload, concurrency, the round's requests): the workload's requests (the first `requests` of them),
    cycled until every stream has one."""
    rounds = []
    for name in workloads:
        reqs = list(workload(name).requests[:requests] if requests else workload(name).requests)
        for c in concurrency:
            n = max(len(reqs), c)
            rounds.append((name, c, [reqs[i % len(reqs)] for i in range(n)]))
    return rounds


async def measure(app: Blazar, model: str, posture: Posture, *, engine: ActiveEngine | None = None,
                  workloads: Sequence[str] = WORKLOADS, concurrency: Sequence[int] = (1,), ctx: int | None = None,
                  purpose: Purpose = "bench", max_tokens: int | None = None, requests: int | None = None,
                  progress: Progress | None = None) -> BenchRecorded:
    """Measure `model` at `posture` on `engine` (the active one by default) and record one `bench.recorded`.
    `max_tokens` caps each workload's own; `requests` takes only the first N requests of each workload."""
    for name in workloads:
        workload(name)  # ValueError for an unknown one, before anything starts
    levels = check_concurrency(concurrency)
    got = resolve_model(app, model)
    engine = engine or active_engine(app)
    machine = await asyncio.to_thread(this_machine)
    meter = await asyncio.to_thread(EnergyMeter)
    rounds = plan_rounds(workloads, levels, requests=requests)
    total, done = sum(len(r) for _, _, r in rounds), 0
    started = time.monotonic()
    results: list[WorkloadResult] = []
    async with engine_child(app, got.name, posture, engine=engine, ctx=ctx, slots=max(levels)) as child:
        async with httpx2.AsyncClient(base_url=child.base_url, headers=child.headers, trust_env=False,
                                      timeout=REQUEST_TIMEOUT_S) as client:
            for name, c, reqs in rounds:
                label = f"{name} x{c}"

                def tick(label: str = label) -> None:
                    nonlocal done
                    done += 1
                    if progress is not None:
                        progress(done, total, label)

                if progress is not None:
                    progress(done, total, label)
                results.append(await _round(child, client, meter, name, c, reqs, max_tokens=max_tokens, tick=tick))
        peak = child.peak_rss_bytes()
        ctx_tokens = child.plan.ctx_per_slot
    event = BenchRecorded(
        bench_id=new_trace_id()[:16], model=got.name, model_sha256=got.sha256 or None, posture=posture,
        engine_tag=engine.tag, engine_version=_version(engine), machine=machine, ctx=ctx_tokens, results=results,
        peak_rss_bytes=peak, duration_s=round(time.monotonic() - started, 3), purpose=purpose)
    await app.record(event)
    return event


def _version(engine: ActiveEngine) -> str:
    v = engine.version
    commit = f" {v.commit}" if v.commit and v.commit != "unknown" else ""
    return v.version + (f" (build {v.build})" if v.build else "") + commit


async def _round(child: EngineChild, client: httpx2.AsyncClient, meter: EnergyMeter, name: str, concurrency: int,
                 reqs: list[BenchRequest], *, max_tokens: int | None, tick: Callable[[], None]) -> WorkloadResult:
    """`concurrency` streams draining `reqs` together; the round's numbers."""
    queue = list(reqs)
    outcomes: list[Outcome] = []

    async def stream() -> None:
        while queue:
            req = queue.pop(0)
            outcomes.append(await one_request(client, req, model=child.model, max_tokens=max_tokens))
            tick()

    before, e0 = await child.metrics(), meter.read()
    start = time.monotonic()
    await asyncio.gather(*(stream() for _ in range(concurrency)))
    wall = time.monotonic() - start
    after, e1 = await child.metrics(), meter.read()
    energy = meter.joules(e0, e1)
    return summarise(name, concurrency, outcomes, wall_s=wall, before=before, after=after, energy_j=energy,
                     speculative=child.posture.speculative)


def summarise(name: str, concurrency: int, outcomes: list[Outcome], *, wall_s: float, before: dict[str, float],
              after: dict[str, float], energy_j: float | None, speculative: bool) -> WorkloadResult:
    """A round's WorkloadResult. Per-stream decode is the mean of each request's engine rate (requests that
    generated under two tokens have no decode phase to time); prefill pools every request's tokens and time."""
    completion = sum(o.completion_tokens for o in outcomes)
    per_stream = [o.predicted_n / (o.predicted_ms / 1000) for o in outcomes if o.predicted_n >= 2 and o.predicted_ms]
    ttfts = [o.ttft_ms for o in outcomes]

    def delta(series: str) -> int | None:
        if not speculative or series not in after:
            return None
        return int(after[series] - before.get(series, 0.0))

    if not is_workload(name):
        raise ValueError(f"no workload {name!r}")  # the caller checked it against WORKLOADS
    return WorkloadResult(
        workload=name,
        concurrency=concurrency, requests=len(outcomes),
        prompt_tokens=sum(o.prompt_tokens for o in outcomes), completion_tokens=completion,
        prefill_tps=_round2(rate(sum(o.prompt_n for o in outcomes), sum(o.prompt_ms for o in outcomes) / 1000)),
        decode_tps_stream=_round2(mean(per_stream)) or 0.0,
        decode_tps_system=_round2(rate(completion, wall_s)) or 0.0,
        ttft_ms_p50=round(percentile(ttfts, 50), 1), ttft_ms_p95=round(percentile(ttfts, 95), 1),
        draft_tokens=delta(DRAFTED), accepted_tokens=delta(ACCEPTED),
        energy_j=None if energy_j is None else round(energy_j, 3),
        tokens_per_joule=None if not energy_j else round(completion / energy_j, 3))


def _round2(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


async def one_request(client: httpx2.AsyncClient, req: BenchRequest, *, model: str,
                      max_tokens: int | None) -> Outcome:
    """Stream one request; TTFT at the first chunk that carries text, the rest from the final chunk's `timings`
    and `usage`. An engine error is an EngineError with its status and body."""
    start = time.monotonic()
    ttft: float | None = None
    final: dict[str, Any] = {}
    async with client.stream("POST", req.path, json=req.body(model=model, max_tokens=max_tokens)) as resp:
        if resp.status_code != 200:
            body = (await resp.aread()).decode(errors="replace")[:300]
            raise EngineError(f"the bench child answered {req.path} with {resp.status_code}: {body}")
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = orjson.loads(data)
            if ttft is None and _has_text(chunk):
                ttft = (time.monotonic() - start) * 1000
            if "timings" in chunk:
                final["timings"] = chunk["timings"]
            if chunk.get("usage"):
                final["usage"] = chunk["usage"]
    timings, usage = final.get("timings") or {}, final.get("usage") or {}
    if not timings:
        raise EngineError(f"the bench child's stream for {req.path} ended without its timings")
    elapsed = (time.monotonic() - start) * 1000
    prompt = timings.get("prompt_n", 0) + timings.get("cache_n", 0)
    return Outcome(ttft_ms=ttft if ttft is not None else elapsed,
                   prompt_tokens=int(usage.get("prompt_tokens", prompt)),
                   completion_tokens=int(usage.get("completion_tokens", timings.get("predicted_n", 0))),
                   prompt_n=int(timings.get("prompt_n", 0)), prompt_ms=float(timings.get("prompt_ms", 0.0)),
                   predicted_n=int(timings.get("predicted_n", 0)), predicted_ms=float(timings.get("predicted_ms", 0.0)))


def _has_text(chunk: dict[str, Any]) -> bool:
    for choice in chunk.get("choices") or ():
        if choice.get("text") or (choice.get("delta") or {}).get("content"):
            return True
    return False
