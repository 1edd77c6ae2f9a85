"""A LoRA adapter GGUF (llama.cpp's `--lora` file: `general.type` adapter, `adapter.type` lora) summarised as
`LoraMetadata`: the architecture it adapts, its rank and alpha, its tensors' bytes.

The keys are the ones llama.cpp's adapter loader reads (src/llama-adapter.cpp: `general.type`, `adapter.type`,
`adapter.lora.alpha`, `<weight>.lora_a` / `.lora_b` pairs). Read once at `blazar lora add`; the store records the
summary in `lora.added` and the fit prices the adapter's bytes from it alone.
"""

from __future__ import annotations

from pathlib import Path

from blazar.adapters.gguf_header import GGUFHeader
from blazar.adapters.gguf_inspect import _file_type, _read_file
from blazar.errors import ModelFileError
from blazar.events.lora import LoraMetadata

__all__ = ["inspect_lora", "summarise_lora"]


def inspect_lora(path: Path) -> LoraMetadata:
    """Summarise a local adapter file. Raises ModelFileError naming the file for anything unreadable, and for a
    GGUF that is not a LoRA adapter (a model, a projector, a control vector)."""
    return summarise_lora(_read_file(path), str(path))


def summarise_lora(header: GGUFHeader, source: str) -> LoraMetadata:
    """The adapter summary of a parsed header (pure: no I/O)."""
    kv = header.kv
    kind, adapter = kv.get("general.type"), kv.get("adapter.type")
    if kind != "adapter" or adapter != "lora":
        raise ModelFileError(f"{source}: not a LoRA adapter (general.type is {kind!r} and adapter.type "
                             f"{adapter!r}; an adapter's are 'adapter' and 'lora'): convert it with llama.cpp's "
                             "convert_lora_to_gguf.py")
    arch = kv.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise ModelFileError(f"{source}: no general.architecture: which model it adapts is unknown")
    alpha = kv.get("adapter.lora.alpha")
    if alpha is not None and (isinstance(alpha, bool) or not isinstance(alpha, int | float)):
        raise ModelFileError(f"{source}: metadata key 'adapter.lora.alpha' is {alpha!r}, expected a number")
    # lora_a of a weight with ne [in, out] has ne [in, rank]: its second dimension is the rank.
    ranks = {t.dims[1] for t in header.tensors if t.name.endswith(".lora_a") and len(t.dims) >= 2}
    if not any(t.name.endswith(".lora_a") for t in header.tensors):
        raise ModelFileError(f"{source}: a LoRA adapter without any lora_a/lora_b tensor: it changes nothing")
    name = kv.get("general.name")
    return LoraMetadata(architecture=arch, rank=ranks.pop() if len(ranks) == 1 else None,
                        alpha=None if alpha is None else float(alpha),
                        file_type=_file_type(None, header), tensor_bytes=sum(t.n_bytes for t in header.tensors),
                        tensor_count=len(header.tensors), name=name if isinstance(name, str) and name else None)
