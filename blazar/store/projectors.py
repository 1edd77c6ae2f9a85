"""Projectors in the model store (llama.cpp's `--mmproj` files): set beside a model, replaced, removed; each as an
event (`model.projector_set`, `model.projector_removed`), the file verified by sha256 like a model's.

A projector file is stored content-addressed, `mmproj/<sha256>.gguf` under the models directory: two models (or a
model and its variants) that name the same bytes share one file, which goes when the last model naming it does.
"""

from __future__ import annotations

from typing import Any

from blazar.events.projectors import ProjectorMetadata


def projector_info(meta: ProjectorMetadata) -> dict[str, Any]:
    """Ollama's `projector_info` for /api/show: the projector's header keys, as Ollama lists a vision model's."""
    info: dict[str, Any] = {"general.architecture": "clip", "clip.has_vision_encoder": "vision" in meta.modalities,
                            "clip.has_audio_encoder": "audio" in meta.modalities}
    if meta.projector_type:
        info["clip.projector_type"] = meta.projector_type
    for prefix, enc in (("vision", meta.vision), ("audio", meta.audio)):
        if enc is None:
            continue
        for key, value in (("embedding_length", enc.embedding_length), ("block_count", enc.block_count),
                           ("feed_forward_length", enc.feed_forward_length),
                           ("attention.head_count", enc.head_count), ("projection_dim", enc.projection_dim),
                           ("image_size", enc.image_size), ("patch_size", enc.patch_size),
                           ("num_mel_bins", enc.mel_bins)):
            if value is not None:
                info[f"clip.{prefix}.{key}"] = value
    return info
