"""Benchmark: the daemon's memory with open batches of a big input file (issue 38: each open batch kept its whole
parsed input, about 10x the file; 31 MiB x 6 batches took a daemon from 218 MiB to 1,964 MiB).

A real `blazar serve` in a temporary home (keys off), bench/fake_engine.py as its engine and the tiny model: the
limits and storage are the gateway's, the engine only answers. One JSONL input of --file-mib MiB (--lines chat
lines of equal size, each by default a conversation of many short turns: the parser's worst case per byte) is
uploaded once and --batches batches are made from it. The first line of the file holds in
the fake engine until the bench releases it (`fake_hold_until`), so with `batch_concurrency` 1 one line is in flight
and every batch stays open, validated, with its lines waiting. The daemon's resident memory (VmRSS of its process,
which serves the HTTP app and runs the batches; the engine is a child of its own, not counted) is read:

    started    the daemon up, the model loaded (one chat)
    uploaded   the file stored
    open       every batch validated (in_progress), the first line in flight
    peak       VmHWM: the most it held at any time, validations included

Run: `.venv/bin/python bench/batch_memory.py [--file-mib 100] [--lines 50000] [--batches 10] [--shape many|long]
[--out FILE]`. The table
goes to stdout, the numbers to FILE as JSON. The exit status is 1 when `open` - `started` is over --bound-mib
(default 64).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx2

from blazar.adapters.engines.tiny_model import write_tiny_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fake_engine  # a sibling script, not a package
from overhead import Home

MODEL = "fake"
WAIT_S = 1800.0  # validation of 10 x 100 MiB on a busy 2-core machine; a bound, not a measure
POLL_S = 0.5


def memory_kib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of the process, in KiB (/proc/PID/status)."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            out[name] = int(value.split()[0])
    return out


def messages(room: int, shape: str) -> list[dict[str, str]]:
    """A conversation of about `room` bytes as JSON: one long message, or many short turns (what costs a parser most
    per byte: each turn a dict and two strings)."""
    filler = "The harbour wakes before the sun; boats creak and gulls argue over the nets. "
    if shape == "long":
        return [{"role": "user", "content": (filler * (room // len(filler) + 1))[:room]}]
    turns = [{"role": "user" if k % 2 == 0 else "assistant", "content": f"turn {k}"}
             for k in range(max(1, room // 42))]
    if turns[-1]["role"] != "user":
        turns.append({"role": "user", "content": "and?"})
    return turns


def write_input(path: Path, mib: int, lines: int, hold: Path, shape: str) -> int:
    """`lines` chat lines of about equal size, `mib` MiB in all (just under); the first holds until `hold` exists."""
    target = (mib << 20) - 4096
    with path.open("wb") as f:
        for i in range(lines):
            body: dict[str, Any] = {"model": MODEL, "max_tokens": 4, "messages": []}
            if i == 0:
                body["fake_hold_until"] = str(hold)
            line = {"custom_id": f"r{i:06d}", "method": "POST", "url": "/v1/chat/completions", "body": body}
            empty = len(json.dumps(line)) + 1
            body["messages"] = messages(max(1, (target - f.tell()) // (lines - i) - empty), shape)
            f.write(json.dumps(line).encode() + b"\n")
        return f.tell()


def wait(what: str, check: Any) -> Any:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(POLL_S)
    raise RuntimeError(f"timed out after {WAIT_S:.0f} s waiting for {what}")


def run(root: Path, file_mib: int, lines: int, batches: int, shape: str) -> dict[str, Any]:
    engine = fake_engine.write_executable(root / "files" / "fake-engine" / "llama-server")
    model = write_tiny_model(root / "files" / "tiny.gguf")
    home = Home(root, "home")
    home.cli("engine", "install", "--path", str(engine))
    home.cli("import", str(model), "--name", MODEL)
    for key, value in (("files_max_bytes", str(file_mib << 20)), ("batch_concurrency", "1"),
                       ("body_timeout_s", "600")):
        home.cli("config", "set", key, value)
    hold = root / "release"
    data = root / "input.jsonl"
    size = write_input(data, file_mib, lines, hold, shape)
    home.serve()
    assert home.daemon is not None
    pid = home.daemon.pid
    out: dict[str, Any] = {"file_bytes": size, "lines": lines, "batches": batches, "shape": shape}
    try:
        with httpx2.Client(base_url=home.url, trust_env=False, timeout=600) as http:
            http.post("/v1/chat/completions", json={"model": MODEL, "max_tokens": 1,
                                                    "messages": [{"role": "user", "content": "hi"}]}).raise_for_status()
            out["started"] = memory_kib(pid)
            with data.open("rb") as f:
                up = http.post("/v1/files", files={"file": ("input.jsonl", f, "application/jsonl")},
                               data={"purpose": "batch"})
            up.raise_for_status()
            out["uploaded"] = memory_kib(pid)
            file_id = up.json()["id"]
            t0 = time.perf_counter()
            ids = []
            for _ in range(batches):
                made = http.post("/v1/batches", json={"input_file_id": file_id, "endpoint": "/v1/chat/completions",
                                                      "completion_window": "24h"})
                made.raise_for_status()
                ids.append(made.json()["id"])

            def all_open() -> bool:
                statuses = [http.get(f"/v1/batches/{i}").json()["status"] for i in ids]
                if any(s not in ("validating", "in_progress") for s in statuses):
                    raise RuntimeError(f"a batch ended before the bench released it: {statuses}")
                return all(s == "in_progress" for s in statuses)

            wait("every batch validated", all_open)
            out["validated_s"] = round(time.perf_counter() - t0, 1)
            out["open"] = memory_kib(pid)
            out["statuses"] = {i: http.get(f"/v1/batches/{i}").json()["request_counts"] for i in ids}
            for i in ids:
                http.post(f"/v1/batches/{i}/cancel").raise_for_status()
            hold.touch()
    finally:
        hold.touch()
        home.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--file-mib", type=int, default=100)
    parser.add_argument("--lines", type=int, default=50_000)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--shape", choices=("many", "long"), default="many",
                        help="each line many short turns (the parser's worst case, the default) or one long one")
    parser.add_argument("--bound-mib", type=int, default=64, help="the most `open` may be over `started`")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="blazar-bench-batches-") as tmp:
        got = run(Path(tmp), args.file_mib, args.lines, args.batches, args.shape)
    mib = {k: {m: round(v / 1024, 1) for m, v in got[k].items()} for k in ("started", "uploaded", "open")}
    grew = mib["open"]["VmRSS"] - mib["started"]["VmRSS"]
    peak = round(got["open"]["VmHWM"] / 1024, 1)
    print(f"{args.batches} batches of one {got['file_bytes'] / 2**20:.1f} MiB file ({args.lines} lines, "
          f"{args.shape}), validated in {got['validated_s']} s")
    print("| the daemon | VmRSS (MiB) |\n|---|---:|")
    for k in ("started", "uploaded", "open"):
        print(f"| {k} | {mib[k]['VmRSS']} |")
    print(f"| peak (VmHWM) | {peak} |\n| open - started | {grew:.1f} (bound {args.bound_mib}) |")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({**got, "mib": mib, "grew_mib": grew, "peak_mib": peak,
                                        "machine": platform.platform()}, indent=2))
    return 0 if grew <= args.bound_mib else 1


if __name__ == "__main__":
    sys.exit(main())
