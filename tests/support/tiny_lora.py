"""A tiny LoRA adapter GGUF for Gemma 3 270M, written at test time: rank-4 `lora_a`/`lora_b` pairs for some of the
model's weights (read from the model's own header with gguf's reader), with the keys llama.cpp's adapter loader
reads (`general.type` adapter, `adapter.type` lora, `adapter.lora.alpha`, the architecture).

Random weights from a fixed seed, large enough that applying the adapter (scale 1) surely changes the greedy text,
while scale 0 leaves the model as it is: what the tests of per-request scales compare. The shapes follow ggml's
convention (numpy's shape is ggml's `ne` reversed): for a weight of ne [in, out], `lora_a` has ne [in, rank]
(numpy [rank, in]) and `lora_b` ne [rank, out] (numpy [out, rank])."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFReader

from blazar.adapters.engines.tiny_model import gguf_file

SEED = 20261205
RANK = 4
ALPHA = 8.0
# Which of each block's weights it adapts; the output projections move the residual stream the most.
TARGETS = ("attn_q", "attn_output", "ffn_down")


def write_tiny_lora(path: Path, model: Path, *, arch: str | None = None, seed: int = SEED,
                    std: float = 0.15) -> Path:
    """Write the adapter for `model` (a GGUF whose tensor names and shapes it reads) to `path`, atomically, and
    return the path. `arch` overrides the architecture written (a mismatch for the refusal tests); another `seed`
    gives other bytes."""
    reader = GGUFReader(model)
    field = reader.fields["general.architecture"]
    model_arch = bytes(field.parts[field.data[0]]).decode()
    rng = np.random.default_rng(seed)
    with gguf_file(path, arch or model_arch) as w:
        w.add_name("blazar-tiny-lora")
        w.add_string("general.type", "adapter")
        w.add_string("adapter.type", "lora")
        w.add_float32("adapter.lora.alpha", ALPHA)
        for t in reader.tensors:
            parts = t.name.split(".")
            if len(parts) != 4 or parts[0] != "blk" or parts[2] not in TARGETS or parts[3] != "weight":
                continue
            n_in, n_out = int(t.shape[0]), int(t.shape[1])
            a = (rng.standard_normal((RANK, n_in)) * std).astype(np.float32)
            b = (rng.standard_normal((n_out, RANK)) * std).astype(np.float32)
            w.add_tensor(f"{t.name}.lora_a", a)
            w.add_tensor(f"{t.name}.lora_b", b)
    return path
