"""Benchmark of what explaining the prefix cache costs a request (blazar/serving/prefix_watch.py): each completed chat
turn's prompt is fingerprinted (one hash per message and one of the tools) and compared with its conversation's
previous one. Measured in process, per turn, on agent-shaped bodies (a long system prompt, a tool list, a growing
history, as Claude Code and Codex send them), beside what the gateway already does with the same body on every
request: parse the client's bytes (orjson.loads) and encode the engine's body (orjson.dumps). Before this issue the
gateway did neither hash nor comparison, so "before" is the parse and encode alone, "after" adds the turn.

Each figure is the median of --repeat timed runs of --turns consecutive turns (a conversation, so every turn after
the first is compared); the watch starts empty for each run.

Run: `.venv/bin/python bench/prefix.py [--turns 20] [--repeat 15] [--out FILE]`.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import orjson

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from blazar.serving.prefix_watch import Finished, PrefixWatch  # noqa: E402

# Shapes: (name, system prompt characters, tools, history turns before the measured ones, characters per message)
SHAPES = [
    ("short chat, no tools", 200, 0, 0, 200),
    ("Claude Code-like (2,950-token start)", 11_000, 16, 0, 600),
    ("agent, 100 messages in", 11_000, 16, 50, 1_200),
    ("agent, 400 messages in", 11_000, 16, 200, 1_200),
]


def tool(i: int) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": f"tool_{i}", "description": "Reads, edits or runs something in the workspace. " * 6,
        "parameters": {"type": "object", "properties": {f"arg{j}": {"type": "string", "description": "a path"}
                                                        for j in range(4)}, "required": ["arg0"]}}}


def body(shape: tuple[str, int, int, int, int], turn: int, *, fresh_time: bool) -> dict[str, Any]:
    _, system_chars, tools, history, message_chars = shape
    stamp = f"Now: 06:{turn % 60:02d}. " if fresh_time else ""
    messages: list[dict[str, Any]] = [{"role": "system", "content": stamp + "x" * system_chars}]
    for i in range(history + turn + 1):
        messages.append({"role": "user", "content": f"question {i} " + "q" * message_chars})
        if i < history + turn:
            messages.append({"role": "assistant", "content": f"answer {i} " + "a" * message_chars})
    out: dict[str, Any] = {"model": "m", "messages": messages, "stream": True}
    if tools:
        out["tools"] = [tool(i) for i in range(tools)]
    return out


def per_turn_us(fn: Any, turns: int, repeat: int) -> float:
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        runs.append((time.perf_counter() - start) / turns * 1e6)
    return statistics.median(runs)


def measure(shape: tuple[str, int, int, int, int], turns: int, repeat: int) -> dict[str, Any]:
    bodies = [body(shape, t, fresh_time=True) for t in range(turns)]
    raws = [orjson.dumps(b) for b in bodies]
    usage = {"prompt_tokens": 3000, "cached_tokens": 12, "timings": {"prompt_ms": 4100.0}}

    def parse_encode() -> None:
        for raw in raws:
            orjson.dumps(orjson.loads(raw))

    def watched() -> None:
        watch = PrefixWatch()
        for i, b in enumerate(bodies):
            watch.turn(Finished(trace_id=f"t{i}", tenant="key:a", session="key:a/s", model="m", instance_id="i1",
                                slot_id=0, agent="claude-cli", body=b, usage=usage))

    base = per_turn_us(parse_encode, turns, repeat)
    added = per_turn_us(watched, turns, repeat)
    last = bodies[-1]
    return {"shape": shape[0], "messages": len(last["messages"]), "body_kib": round(len(raws[-1]) / 1024, 1),
            "parse_encode_us": round(base, 1), "prefix_turn_us": round(added, 1),
            "added_share": round(added / base, 3)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--turns", type=int, default=20)
    p.add_argument("--repeat", type=int, default=15)
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    rows = [measure(s, a.turns, a.repeat) for s in SHAPES]
    print(f"{'shape':40} {'msgs':>5} {'KiB':>7} {'parse+encode µs':>16} {'+ prefix turn µs':>17} {'added':>7}")
    for r in rows:
        print(f"{r['shape']:40} {r['messages']:>5} {r['body_kib']:>7} {r['parse_encode_us']:>16} "
              f"{r['prefix_turn_us']:>17} {r['added_share']:>7.0%}")
    if a.out is not None:
        a.out.write_text(json.dumps({"machine": platform.processor() or platform.machine(), "turns": a.turns,
                                     "repeat": a.repeat, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
