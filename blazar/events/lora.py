"""Events about a model's LoRA adapters (llama.cpp's `--lora` GGUFs): added beside a model in the store, or removed
from it; and the summary of the adapter's header they carry.

An adapter is a low-rank change to some of the model's weights. It is not a model of its own: it is stored
content-addressed (`lora/<sha256>.gguf` under the models directory, shared by every model that names the same bytes),
loaded beside the model that names it (`--lora`, unapplied) and applied per request at the scale the request asks.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict

from blazar.events.base import NodeLocal
from blazar.events.bounds import PATH
from blazar.events.types import register


class LoraMetadata(BaseModel):
    """An adapter GGUF's header, summarised (sizes in bytes)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    architecture: str  # `general.architecture`: the model's it adapts (gemma3, llama, ...)
    rank: int | None = None  # the lora_a tensors' inner size, where they agree
    alpha: float | None = None  # `adapter.lora.alpha`: the engine scales by alpha / rank
    file_type: str | None = None
    tensor_bytes: int = 0  # every tensor: what the engine loads beside the model's weights
    tensor_count: int = 0
    name: str | None = None  # `general.name`


@register
class LoraAdded(NodeLocal):
    """Model `model` now has the adapter `name` (stored at `path`, relative to the models directory): loaded with
    it from its next load, applied only where a request asks. `blazar lora add MODEL FILE --name N`."""

    TYPE = "lora.added"
    AUDIT = True

    model: str
    name: str
    path: Annotated[str, PATH]  # lora/<sha256>.gguf
    source: Annotated[str, PATH]  # the local path it came from
    sha256: str
    bytes: int
    linked: bool  # True: hardlink; False: copied
    metadata: LoraMetadata

    def stream_key(self) -> str:
        return f"model:{self.model}"

    def audit_details(self) -> dict[str, object]:
        return {"model": self.model, "name": self.name, "source": self.source, "bytes": self.bytes,
                "sha256": self.sha256}


@register
class LoraRemoved(NodeLocal):
    """Model `model` no longer has the adapter `name`; its file was deleted unless another model still names it."""

    TYPE = "lora.removed"
    AUDIT = True

    model: str
    name: str
    path: Annotated[str, PATH]
    file_deleted: bool

    def stream_key(self) -> str:
        return f"model:{self.model}"
