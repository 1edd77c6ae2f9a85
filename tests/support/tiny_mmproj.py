"""A tiny vision projector GGUF written at test time: llama.cpp's gemma3-style CLIP projector (`clip.projector_type`
gemma3: a SigLIP vision tower, an average pool, an RMS norm and one projection into the text model's embedding
width), as llama.cpp's converter writes it for Gemma 3 (tools/mtmd/clip.cpp reads these keys and tensors).

Random weights from a fixed seed: what it "sees" means nothing, but the real llama-server loads it beside Gemma 3
270M (`--mmproj`) and runs the whole image path with it: decoding, the vision encoder, the pool, the projection, and
the image's tokens counted in `prompt_tokens`. A 112x112 image in 14-pixel patches is an 8x8 grid; pooled by 2 it
is 16 embeddings per image (plus the `<start_of_image>` / `<end_of_image>` text tokens around them)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from blazar.adapters.engines.tiny_model import gguf_file

SEED = 20261205
IMAGE_SIZE = 112
PATCH_SIZE = 14
SCALE_FACTOR = 2  # the pool's kernel per side (llama.cpp's default for gemma3 is 4: written because it differs)
N_EMBD = 64  # the vision tower's width
N_HEAD = 1  # head_dim 64: a size every attention kernel supports
N_FF = 128  # differs from N_EMBD, so llama.cpp never takes ffn_up/ffn_down for a legacy swapped pair
N_BLOCK = 1
IMAGE_TOKENS = (IMAGE_SIZE // PATCH_SIZE // SCALE_FACTOR) ** 2


def write_tiny_mmproj(path: Path, n_embd: int = 640) -> Path:
    """Write the projector to `path` (atomically) and return the path; `n_embd` is the text model's embedding
    width, which llama.cpp requires the projection's output to match (640 for Gemma 3 270M). The bytes are the same
    on every call with the same `n_embd`."""
    rng = np.random.default_rng(SEED)
    n_pos = (IMAGE_SIZE // PATCH_SIZE) ** 2

    def mat(*shape: int, scale: float = 0.05) -> np.ndarray:
        # numpy shape is ggml's ne reversed: a (rows, cols) matrix has ne = [cols, rows], cols the input width.
        return (rng.standard_normal(shape) * scale).astype(np.float16)

    def vec(n: int, value: float = 0.0) -> np.ndarray:
        return np.full(n, value, dtype=np.float32)

    with gguf_file(path, "clip") as w:
        w.add_name("blazar-tiny-mmproj")
        w.add_bool("clip.has_vision_encoder", True)
        w.add_string("clip.projector_type", "gemma3")
        w.add_bool("clip.use_gelu", True)
        w.add_uint32("clip.vision.image_size", IMAGE_SIZE)
        w.add_uint32("clip.vision.patch_size", PATCH_SIZE)
        w.add_uint32("clip.vision.embedding_length", N_EMBD)
        w.add_uint32("clip.vision.feed_forward_length", N_FF)
        w.add_uint32("clip.vision.block_count", N_BLOCK)
        w.add_uint32("clip.vision.projection_dim", n_embd)
        w.add_uint32("clip.vision.attention.head_count", N_HEAD)
        w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
        w.add_uint32("clip.vision.projector.scale_factor", SCALE_FACTOR)
        w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
        w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])

        # The patch embedding is a convolution: ne = [patch, patch, channels, width].
        w.add_tensor("v.patch_embd.weight", mat(N_EMBD, 3, PATCH_SIZE, PATCH_SIZE))
        w.add_tensor("v.patch_embd.bias", vec(N_EMBD))
        w.add_tensor("v.position_embd.weight", (rng.standard_normal((n_pos, N_EMBD)) * 0.02).astype(np.float32))
        for i in range(N_BLOCK):
            blk = f"v.blk.{i}"
            for proj in ("attn_q", "attn_k", "attn_v", "attn_out"):
                w.add_tensor(f"{blk}.{proj}.weight", mat(N_EMBD, N_EMBD))
                w.add_tensor(f"{blk}.{proj}.bias", vec(N_EMBD))
            for norm in ("ln1", "ln2"):
                w.add_tensor(f"{blk}.{norm}.weight", vec(N_EMBD, 1.0))
                w.add_tensor(f"{blk}.{norm}.bias", vec(N_EMBD))
            w.add_tensor(f"{blk}.ffn_up.weight", mat(N_FF, N_EMBD))
            w.add_tensor(f"{blk}.ffn_up.bias", vec(N_FF))
            w.add_tensor(f"{blk}.ffn_down.weight", mat(N_EMBD, N_FF))
            w.add_tensor(f"{blk}.ffn_down.bias", vec(N_EMBD))
        w.add_tensor("v.post_ln.weight", vec(N_EMBD, 1.0))
        w.add_tensor("v.post_ln.bias", vec(N_EMBD))
        # gemma3's projector: an RMS norm, then [vision width] -> [text width] (ne = [text width, vision width]).
        w.add_tensor("mm.soft_emb_norm.weight", vec(N_EMBD, 1.0))
        w.add_tensor("mm.input_projection.weight", mat(N_EMBD, n_embd))

    return path
