"""Energy counters, read around a benchmark round (blazar/tuning/measure.py) and around each request
(blazar/serving/energy.py): RAPL's cumulative `energy_uj` under /sys/class/powercap (one per CPU package; it wraps at
`max_energy_range_uj`) and NVML's total energy per GPU (mJ since the driver loaded). A machine that reports neither
(a VM, a container without /sys/class/powercap, an unreadable energy_uj: recent kernels make it root-only) measures
no energy: None, and `describe()` says why.
"""

from __future__ import annotations

import logging
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

POWERCAP = Path("/sys/class/powercap")
# Top-level RAPL zones are packages ("intel-rapl:0"; AMD's driver uses the same names); their sub-zones (core,
# uncore, dram: "intel-rapl:0:0") are parts of the package's count, so summing them too would count twice.
_PACKAGE = re.compile(r"^intel-rapl:\d+$")


@dataclass(frozen=True)
class Reading:
    """Counters at one instant: RAPL zone -> µJ, GPU index -> mJ."""

    rapl_uj: dict[str, int] = field(default_factory=dict)
    nvml_mj: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class _Zone:
    name: str
    energy: Path
    max_range_uj: int


class Rapl:
    """The readable RAPL package zones under `root`."""

    def __init__(self, root: Path = POWERCAP) -> None:
        self.zones: list[_Zone] = []
        self.why_not: str | None = None
        try:
            dirs = sorted(p for p in root.iterdir() if _PACKAGE.match(p.name))
        except OSError:
            self.why_not = f"no {root}"
            return
        for d in dirs:
            try:
                int((d / "energy_uj").read_text())
                max_range = int((d / "max_energy_range_uj").read_text())
            except (OSError, ValueError) as e:
                self.why_not = f"{d / 'energy_uj'} unreadable ({getattr(e, 'strerror', None) or e})"
                continue
            self.zones.append(_Zone(d.name, d / "energy_uj", max_range))
        if not dirs:
            self.why_not = f"no RAPL zone under {root}"

    def read(self) -> dict[str, int]:
        out = {}
        for z in self.zones:
            try:
                out[z.name] = int(z.energy.read_text())
            except (OSError, ValueError):
                continue
        return out

    def joules(self, before: dict[str, int], after: dict[str, int]) -> float | None:
        """Energy between two readings, each zone's wrap undone (a round shorter than one wrap period: at most one
        wrap, which at 100s of W is minutes to hours away). None when no zone was read both times."""
        total, seen = 0, False
        for z in self.zones:
            if z.name not in before or z.name not in after:
                continue
            delta = after[z.name] - before[z.name]
            if delta < 0:
                delta += z.max_range_uj
            total += delta
            seen = True
        return total / 1e6 if seen else None


class Nvml:
    """NVML's total energy per GPU (Volta and later); `nvml` is pynvml (injectable for tests)."""

    def __init__(self, nvml: Any | None = None) -> None:
        self.nvml = nvml
        self.gpus: list[Any] = []
        self.why_not: str | None = None
        try:
            if self.nvml is None:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", FutureWarning)
                    import pynvml
                self.nvml = pynvml
            self.nvml.nvmlInit()
            handles = [self.nvml.nvmlDeviceGetHandleByIndex(i) for i in range(self.nvml.nvmlDeviceGetCount())]
            for h in handles:
                self.nvml.nvmlDeviceGetTotalEnergyConsumption(h)
            self.gpus = handles
            if not handles:
                self.why_not = "no NVIDIA GPU"
        except ImportError:
            self.why_not = "no NVML module"
        except Exception as e:  # NVMLError (no driver, no GPU, a GPU without the counter): no energy, said
            self.why_not = f"NVML: {e}"
            self.gpus = []

    def read(self) -> dict[int, int]:
        out: dict[int, int] = {}
        if self.nvml is None:
            return out
        for i, h in enumerate(self.gpus):
            try:
                out[i] = int(self.nvml.nvmlDeviceGetTotalEnergyConsumption(h))
            except Exception as e:  # a GPU that stops answering mid-bench: its energy is not counted
                log.debug("NVML energy of GPU %d: %s", i, e)
        return out

    @staticmethod
    def joules(before: dict[int, int], after: dict[int, int]) -> float | None:
        common = [i for i in before if i in after]
        return sum(after[i] - before[i] for i in common) / 1e3 if common else None


class EnergyMeter:
    """RAPL and NVML together: what this machine reports, read as one."""

    def __init__(self, rapl: Rapl | None = None, nvml: Nvml | None = None) -> None:
        self.rapl = rapl if rapl is not None else Rapl()
        self.nvml = nvml if nvml is not None else Nvml()

    def read(self) -> Reading:
        return Reading(rapl_uj=self.rapl.read() if self.rapl.zones else {},
                       nvml_mj=self.nvml.read() if self.nvml.gpus else {})

    def joules(self, before: Reading, after: Reading) -> float | None:
        """CPU packages plus GPUs between two readings; None when neither was measured."""
        parts = [j for j in (self.rapl.joules(before.rapl_uj, after.rapl_uj),
                             self.nvml.joules(before.nvml_mj, after.nvml_mj)) if j is not None]
        return sum(parts) if parts else None

    def describe(self) -> str:
        """'RAPL (1 package) + NVML (1 GPU)', or why energy is not measured here."""
        have = []
        if self.rapl.zones:
            have.append(f"RAPL ({len(self.rapl.zones)} package{'s' if len(self.rapl.zones) != 1 else ''})")
        if self.nvml.gpus:
            have.append(f"NVML ({len(self.nvml.gpus)} GPU{'s' if len(self.nvml.gpus) != 1 else ''})")
        if have:
            return " + ".join(have)
        return f"not reported here ({self.rapl.why_not or 'no RAPL'}; {self.nvml.why_not or 'no NVML'})"
