"""A projector GGUF (llama.cpp's `--mmproj` file: `general.architecture` clip) summarised as `ProjectorMetadata`:
which modalities it encodes, its projector type, each encoder's geometry and its weights' bytes.

The keys are the ones llama.cpp's tools/mtmd/clip.cpp reads (`clip.has_vision_encoder`, `clip.projector_type`,
`clip.vision.image_size`, ...). Read once at import; the store records the summary in `model.projector_set` and the
fit (blazar/fit/projector.py) sizes the projector from it alone.
"""

from __future__ import annotations

from pathlib import Path

from blazar.adapters.gguf_header import GGUFHeader, KVValue
from blazar.adapters.gguf_inspect import _file_type, _read_file
from blazar.errors import ModelFileError
from blazar.events.projectors import EncoderShape, Modality, ProjectorMetadata

__all__ = ["inspect_projector", "summarise_projector"]


def inspect_projector(path: Path) -> ProjectorMetadata:
    """Summarise a local projector file. Raises ModelFileError naming the file for anything unreadable, and for a
    GGUF that is not a projector (a text model given as --mmproj, say)."""
    return summarise_projector(_read_file(path), str(path))


def summarise_projector(header: GGUFHeader, source: str) -> ProjectorMetadata:
    """The projector summary of a parsed header (pure: no I/O)."""
    kv = header.kv
    arch = kv.get("general.architecture")
    if arch != "clip":
        raise ModelFileError(f"{source}: not a projector (general.architecture is {arch!r}, a projector's is "
                             "'clip'): give the model's mmproj-*.gguf file")
    modalities: list[Modality] = []
    if _bool(kv, "clip.has_vision_encoder", source):
        modalities.append("vision")
    if _bool(kv, "clip.has_audio_encoder", source):
        modalities.append("audio")
    if not modalities:
        raise ModelFileError(f"{source}: a projector with neither clip.has_vision_encoder nor "
                             "clip.has_audio_encoder set: it encodes nothing llama-server can take in")
    projector_type = _str(kv, "clip.projector_type", source)
    vision = _encoder(kv, "vision", source) if "vision" in modalities else None
    audio = _encoder(kv, "audio", source) if "audio" in modalities else None
    if projector_type is None and not any(e is not None and e.projector_type for e in (vision, audio)):
        raise ModelFileError(f"{source}: no clip.projector_type: llama-server cannot tell which projector it is")
    if vision is not None and not (vision.image_size and vision.patch_size):
        raise ModelFileError(f"{source}: a vision encoder without clip.vision.image_size and "
                             "clip.vision.patch_size")
    return ProjectorMetadata(
        name=_str(kv, "general.name", source), projector_type=projector_type, modalities=modalities,
        vision=vision, audio=audio, file_type=_file_type(_int(kv, "general.file_type", source), header),
        weights_bytes=sum(t.n_bytes for t in header.tensors), tensor_count=len(header.tensors),
    )


def _encoder(kv: dict[str, KVValue], prefix: str, source: str) -> EncoderShape:
    def num(key: str) -> int | None:
        return _int(kv, f"clip.{prefix}.{key}", source)

    return EncoderShape(
        projector_type=_str(kv, f"clip.{prefix}.projector_type", source),
        embedding_length=num("embedding_length"), feed_forward_length=num("feed_forward_length"),
        block_count=num("block_count"), head_count=num("attention.head_count"), projection_dim=num("projection_dim"),
        image_size=num("image_size"), patch_size=num("patch_size"), scale_factor=num("projector.scale_factor"),
        mel_bins=num("num_mel_bins"),
    )


def _bool(kv: dict[str, KVValue], key: str, source: str) -> bool:
    value = kv.get(key, False)
    if not isinstance(value, bool):
        raise ModelFileError(f"{source}: metadata key {key!r} is {value!r}, expected a boolean")
    return value


def _str(kv: dict[str, KVValue], key: str, source: str) -> str | None:
    value = kv.get(key)
    if value is None or isinstance(value, str):
        return value or None
    raise ModelFileError(f"{source}: metadata key {key!r} is {value!r}, expected a string")


def _int(kv: dict[str, KVValue], key: str, source: str) -> int | None:
    value = kv.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ModelFileError(f"{source}: metadata key {key!r} is {value!r}, expected a non-negative integer")
    return value
