"""What a measurement was taken on (blazar/events/tuning.py `Machine`): the CPU's model name, the logical CPUs this
process may use, the host's memory and the GPUs' names, with a fingerprint over them so a profile measured on
another machine (or this one changed: a new GPU, a tighter CPU set) is told apart. Sources injectable for tests."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

from blazar.adapters.gpu import MEMINFO, probe_devices, read_meminfo
from blazar.events.tuning import Machine

CPUINFO = Path("/proc/cpuinfo")


def cpu_model(path: Path = CPUINFO) -> str:
    """/proc/cpuinfo's first "model name" (x86), else its "Hardware" or "CPU part" line (ARM), else "unknown"."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "unknown"
    found: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            found.setdefault(key.strip().lower(), value.strip())
    for key in ("model name", "hardware", "cpu model", "cpu part"):
        if found.get(key):
            return found[key]
    return "unknown"


def usable_cores() -> int:
    """Logical CPUs this process may run on (its affinity mask: a container's cpuset, taskset)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def fingerprint(cpu: str, cores: int, memory_bytes: int, gpus: list[str]) -> str:
    """sha256 over the fields, one per line, first 16 hex."""
    text = "\n".join([cpu, str(cores), str(memory_bytes), *gpus])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def gpu_names() -> list[str]:
    return [d.name for d in probe_devices() if d.kind != "host"]


def this_machine(*, cpuinfo: Path = CPUINFO, meminfo: Path = MEMINFO, cores: Callable[[], int] = usable_cores,
                 gpus: Callable[[], list[str]] = gpu_names) -> Machine:
    cpu, n, mem, names = cpu_model(cpuinfo), cores(), read_meminfo(meminfo).get("MemTotal", 0), gpus()
    return Machine(fingerprint=fingerprint(cpu, n, mem, names), cpu=cpu, cores=n, memory_bytes=mem, gpus=names)
