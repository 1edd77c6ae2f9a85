"""`blazar engine build --cuda-arch`: the CUDA architectures to compile llama.cpp's kernels for, as
CMAKE_CUDA_ARCHITECTURES spells them ("90", "86-real", "120a"), or "native": those of the GPUs NVML sees here,
resolved to numbers so that the build's cache key and its record say what it was compiled for."""

from __future__ import annotations

import re
from collections.abc import Callable

from blazar.adapters.nvml import NvmlSnapshot, read_nvml
from blazar.errors import EngineBuildFailed

_ARCH = re.compile(r"^\d{2,3}[af]?(?:-real|-virtual)?$")
NATIVE = "native"


def parse_cuda_archs(text: str) -> list[str]:
    """`90` or `89,90`: the architectures, checked, deduplicated in order. ValueError names a bad one."""
    archs = list(dict.fromkeys(a.strip() for a in text.split(",") if a.strip()))
    bad = [a for a in archs if not _ARCH.match(a)]
    if not archs or bad:
        raise ValueError(f"{', '.join(bad) or repr(text)}: not a CUDA architecture (the compute capability without "
                         "its dot: 90 for an H100, 89 for an L4, 86 for an RTX 3090; or native)")
    return archs


def native_archs(snap: NvmlSnapshot) -> list[str]:
    """The distinct architectures of the GPUs in `snap`, oldest first; EngineBuildFailed when there are none."""
    archs = sorted({g.arch for g in snap.gpus if g.arch}, key=lambda a: (len(a), a))
    if not archs:
        why = snap.why if not snap.available else "NVML reports no GPU with a compute capability"
        raise EngineBuildFailed(f"--cuda-arch native: no NVIDIA GPU to build for ({why}); name the architecture, "
                                "e.g. --cuda-arch 90 for an H100")
    return archs


def cuda_archs_for(text: str, nvml: Callable[[], NvmlSnapshot] = read_nvml) -> list[str]:
    """`--cuda-arch`'s value as architectures (EngineBuildFailed for one that is not)."""
    if text.strip() == NATIVE:
        return native_archs(nvml())
    try:
        return parse_cuda_archs(text)
    except ValueError as e:
        raise EngineBuildFailed(f"--cuda-arch {e}") from None
