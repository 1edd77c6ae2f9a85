"""Which GPU backend an installed llama-server has, and whether its CUDA code runs on the GPUs NVML sees.

A build Blazar made records its cmake options (-DGGML_CUDA=ON, -DCMAKE_CUDA_ARCHITECTURES=...); an engine installed
from a package or a path records none, so its own `--list-devices` is asked (it lists "CUDA0: ..." for a CUDA
build that finds a GPU). Parsing and the rules are pure; `list_devices` is the one place that runs the binary."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from blazar.adapters.engines.build import CUDA_ARCH_OPTION as ARCH_OPTION
from blazar.adapters.engines.build import CUDA_OPTIONS

CUDA_ON = CUDA_OPTIONS[0]
LIST_DEVICES_TIMEOUT_S = 30.0
_DEVICE_LINE = re.compile(r"^\s+([A-Za-z]+)(\d+):\s")


@dataclass(frozen=True)
class Backend:
    cuda: bool
    evidence: str  # what told us, said in the check
    archs: tuple[str, ...] = ()  # the recorded CUDA architectures; () for llama.cpp's default list or unknown


def from_build_options(options: Sequence[str]) -> Backend | None:
    """The backend a build Blazar made records; None when it records nothing (installed, not built here)."""
    if not options:
        return None
    if CUDA_ON not in options:
        return Backend(False, "its recorded build options have no -DGGML_CUDA=ON")
    archs = next((o.removeprefix(ARCH_OPTION).split(";") for o in options if o.startswith(ARCH_OPTION)), [])
    where = f" for CUDA architecture(s) {', '.join(archs)}" if archs else " (llama.cpp's default architectures)"
    return Backend(True, f"built with -DGGML_CUDA=ON{where}", tuple(archs))


def from_device_list(text: str) -> Backend:
    """`llama-server --list-devices`: "Available devices:" then "  CUDA0: NVIDIA H100 (81079 MiB, ...)" lines, or
    "  (none)" for a CPU-only build (the CPU is never listed)."""
    kinds = sorted({m.group(1) for line in text.splitlines() if (m := _DEVICE_LINE.match(line))})
    if "CUDA" in kinds:
        return Backend(True, "its --list-devices lists CUDA devices")
    listed = f" (it lists {', '.join(kinds)})" if kinds else ""
    return Backend(False, f"its --list-devices lists no CUDA device{listed}")


async def list_devices(binary: Path, env: Mapping[str, str], timeout_s: float = LIST_DEVICES_TIMEOUT_S) -> str:
    """The binary's `--list-devices` output (stdout and stderr); "" when it did not answer in time."""
    proc = await asyncio.create_subprocess_exec(str(binary), "--list-devices", stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT, stdin=asyncio.subprocess.DEVNULL,
                                                env=dict(env), start_new_session=True)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return ""
    return out.decode(errors="replace")


def _split(arch: str) -> tuple[int, int, str] | None:
    """"90" -> (9, 0, ""), "86-real" -> (8, 6, "-real"), "120a-real" -> (12, 0, "a-real"); None: not an arch."""
    m = re.fullmatch(r"(\d+)(\d)([af]?(?:-real|-virtual)?)", arch)
    return (int(m.group(1)), int(m.group(2)), m.group(3)) if m else None


def runs_on(archs: Sequence[str], cc: tuple[int, int]) -> bool:
    """Whether code compiled for `archs` runs on a GPU of compute capability `cc`: a real binary (SASS) on the same
    major at an equal or later minor, PTX (a plain or -virtual arch) on any later GPU (the driver JIT-compiles it);
    an "a" (architecture-specific) arch only on exactly that GPU."""
    for arch in archs:
        got = _split(arch)
        if got is None:
            continue
        major, minor, suffix = got
        if suffix.startswith("a"):
            if (major, minor) == cc:
                return True
            continue
        if not suffix.endswith("-virtual") and major == cc[0] and minor <= cc[1]:
            return True
        if not suffix.endswith("-real") and (major, minor) <= cc:
            return True
    return False
