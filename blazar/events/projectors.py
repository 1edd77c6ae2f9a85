"""Events about a model's multimodal projector (llama.cpp's `--mmproj` GGUF): set beside a model in the store, or
removed from it; and the summary of its header they carry.

A projector is the vision (or audio) encoder that turns an image into embeddings in the text model's width. It is
not a model of its own: it is stored content-addressed (`mmproj/<sha256>.gguf` under the models directory, shared by
every model that names the same bytes) and loaded only beside the model that names it.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict

from blazar.events.base import NodeLocal
from blazar.events.bounds import PATH, items
from blazar.events.types import register

Modality = Literal["vision", "audio"]


class EncoderShape(BaseModel):
    """One encoder's geometry (`clip.vision.*` or `clip.audio.*`), what the fit needs to size its compute buffer.
    None where the file does not say."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    projector_type: str | None = None  # its own type in a mixed file (`clip.vision.projector_type`)
    embedding_length: int | None = None
    feed_forward_length: int | None = None
    block_count: int | None = None
    head_count: int | None = None
    projection_dim: int | None = None
    image_size: int | None = None  # vision: the side, in pixels, every image is resized to
    patch_size: int | None = None
    scale_factor: int | None = None  # vision: patches merged per side after the tower (gemma3 pools by it)
    mel_bins: int | None = None  # audio


class ProjectorMetadata(BaseModel):
    """A projector GGUF's header, summarised (sizes in bytes)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str | None = None
    projector_type: str | None = None  # `clip.projector_type`: gemma3, qwen2vl, ultravox, ...
    modalities: Annotated[list[Modality], items(2, 8)]
    vision: EncoderShape | None = None
    audio: EncoderShape | None = None
    file_type: str | None = None
    weights_bytes: int = 0  # every tensor: what the engine loads onto the projector's device
    tensor_count: int = 0


@register
class ModelProjectorSet(NodeLocal):
    """Model `name` is now served with the projector at `path` (relative to the models directory): from an import
    (`--mmproj`), a pull (the hub repo's `mmproj-*.gguf`) or `blazar model set NAME --mmproj`. Replaces any
    projector it had."""

    TYPE = "model.projector_set"
    AUDIT = True

    name: str
    path: Annotated[str, PATH]  # mmproj/<sha256>.gguf
    source: Annotated[str, PATH]  # a local path or a hub file
    source_kind: Literal["file", "hub"] = "file"
    bytes: int
    sha256: str
    linked: bool  # True: hardlink; False: copied
    metadata: ProjectorMetadata

    def stream_key(self) -> str:
        return f"model:{self.name}"

    def audit_details(self) -> dict[str, object]:
        return {"name": self.name, "source": self.source, "bytes": self.bytes, "sha256": self.sha256,
                "modalities": list(self.metadata.modalities)}


@register
class ModelProjectorRemoved(NodeLocal):
    """Model `name` is served without a projector again; the file was deleted unless another model still names it."""

    TYPE = "model.projector_removed"
    AUDIT = True

    name: str
    path: Annotated[str, PATH]
    file_deleted: bool

    def stream_key(self) -> str:
        return f"model:{self.name}"
