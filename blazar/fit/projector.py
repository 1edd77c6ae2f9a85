"""A multimodal projector (llama.cpp's --mmproj) in the fit: its weights and its compute buffer, priced from the
header summary alone, and where it runs when a GPU is there (on the device, or on the host with
--no-mmproj-offload when VRAM is tight).

llama.cpp loads the projector on one backend (tools/mtmd/clip.cpp: the first GPU, or the CPU with
--no-mmproj-offload) and reserves its compute buffer there with a warm-up image of the projector's own size. The
formula (docs/10.SCIENTIFIC.md §13), per vision encoder, with S the image side, p the patch, P = (S/p)^2 patches, E
the tower's width, F its feed-forward width, H its heads, T = P / scale^2 output tokens, D the projection width:

    weights  = every tensor's bytes (the header's)
    compute  = 4 * (3 S^2            the decoded image, f32
                    + 3 p^2 P        the patch convolution's im2col (f32: an upper bound; f16 kernels halve it)
                    + P (4 E + F)    the activations alive at the peak of one block (residual, norm, q/k/v, ffn)
                    + P^2 H          KQ, only without flash attention
                    + T D)           the projected embeddings

Checked against the engine on the tiny gemma3 projector (tests/support/tiny_mmproj.py: S 112, p 14, E 64, F 128,
flash attention on): weights 0.23 MiB (the engine's "model size: 0.23 MiB"), compute 0.42 MiB estimated against
0.22 MiB reserved ("CLIP compute buffer size"): the fixed terms dominate at that size and the estimate stays on the
safe side. The calibration measured after each load (instance.memory_measured) reads the projector's compute
line with the model's, so a model that runs under its estimate is corrected from its own measurement.
"""

from __future__ import annotations

from dataclasses import dataclass

from blazar.events.projectors import EncoderShape, ProjectorMetadata

# Live activations of one patch at the peak of a vision block, in floats per unit of the tower's width: the
# residual, the normed input, and q, k, v (the ffn's hidden width F is added on its own).
ACT_FLOATS_PER_EMBD = 4
# An audio encoder sizes its graph by frames, not pixels: whisper-style encoders take 30 s chunks, 1500 frames
# after their convolution (llama.cpp's audio projectors: ultravox, qwen2a, voxtral).
AUDIO_FRAMES = 1500


@dataclass(frozen=True, slots=True)
class ProjectorCost:
    """What the projector costs the device it runs on, in bytes."""

    weights_bytes: int
    compute_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.compute_bytes


# Projector types that resize every image to one side (`clip.vision.image_size`), so each image becomes the same
# number of embeddings; others (qwen2vl, pixtral, ...) tile or keep an image's own size: known only to the engine.
FIXED_SIZE_TYPES = frozenset({"gemma3"})
# Patches merged per side when the header gives no scale factor: llama.cpp's default for gemma3 (every Gemma 3 size
# pools 64x64 patches to 16x16; only its test models write `clip.vision.projector.scale_factor`).
DEFAULT_MERGE = {"gemma3": 4}


def tokens_per_image(meta: ProjectorMetadata) -> int | None:
    """The embeddings one image becomes in the prompt (P / scale^2; gemma3: 896 px / 14 = 64^2 patches pooled by 4
    = 256), or None where that depends on the image. The model's own marker tokens around it are not counted."""
    enc = meta.vision
    kind = (enc.projector_type if enc is not None else None) or meta.projector_type
    if enc is None or kind not in FIXED_SIZE_TYPES or not enc.image_size or not enc.patch_size:
        return None
    scale = enc.scale_factor or DEFAULT_MERGE.get(kind, 1)
    return max(1, (enc.image_size // enc.patch_size) ** 2 // (scale * scale))


def _vision_compute(enc: EncoderShape, *, flash_attn: bool) -> int:
    side, patch = enc.image_size or 0, enc.patch_size or 1
    n_patches = (side // patch) ** 2
    width, ff, heads = enc.embedding_length or 0, enc.feed_forward_length or 0, enc.head_count or 1
    scale = enc.scale_factor or 1
    out_tokens = max(1, n_patches // (scale * scale))
    floats = (3 * side * side + 3 * patch * patch * n_patches + n_patches * (ACT_FLOATS_PER_EMBD * width + ff)
              + (0 if flash_attn else n_patches * n_patches * heads) + out_tokens * (enc.projection_dim or width))
    return 4 * floats


def _audio_compute(enc: EncoderShape, *, flash_attn: bool) -> int:
    frames = AUDIO_FRAMES
    width, ff, heads = enc.embedding_length or 0, enc.feed_forward_length or 0, enc.head_count or 1
    floats = (frames * 2 * (enc.mel_bins or 128) + frames * (ACT_FLOATS_PER_EMBD * width + ff)
              + (0 if flash_attn else frames * frames * heads) + frames * (enc.projection_dim or width))
    return 4 * floats


def projector_cost(meta: ProjectorMetadata, *, flash_attn: bool) -> ProjectorCost:
    """Weights and compute buffer of `meta`; one compute buffer per encoder (a file with both keeps two graphs)."""
    compute = 0
    if meta.vision is not None:
        compute += _vision_compute(meta.vision, flash_attn=flash_attn)
    if meta.audio is not None:
        compute += _audio_compute(meta.audio, flash_attn=flash_attn)
    return ProjectorCost(meta.weights_bytes, compute)


@dataclass(frozen=True, slots=True)
class Placement:
    """Where the projector runs, and why (a note for the plan)."""

    on_gpu: bool
    why: str


def decide_placement(cost: ProjectorCost, *, gpu: str, layers_total: int, on_gpu: tuple[bool, int],
                     on_host: tuple[bool, int] | None) -> Placement:
    """The projector on the GPU unless that costs the text model: `on_gpu` and `on_host` are (fits, layers
    offloaded) of the best plan with the projector on `gpu` and on the host (None: not priced, since the GPU plan
    already holds every layer). The text model's layers on the GPU matter for every token; the projector on the
    host (--no-mmproj-offload) slows only the encoding of each image."""
    mib = cost.total_bytes / (1 << 20)
    fits_gpu, g_gpu = on_gpu
    if on_host is None or (fits_gpu and g_gpu >= layers_total):
        return Placement(True, f"projector on {gpu} ({mib:.1f} MiB: weights and compute buffer)")
    fits_host, g_host = on_host
    if (fits_host and not fits_gpu) or (fits_host and g_host > g_gpu):
        held = f"{g_gpu} of {layers_total} layers" if fits_gpu else "no plan that fits"
        return Placement(False, f"projector on the host (--no-mmproj-offload): VRAM is tight; its {mib:.1f} MiB "
                                f"on {gpu} would leave {held} there against {g_host} with it on the host "
                                "(images encode on the CPU, slower; text keeps its layers on the GPU)")
    return Placement(True, f"projector on {gpu} ({mib:.1f} MiB): moving it to the host would not put more of "
                           "the model's layers on the GPU")
