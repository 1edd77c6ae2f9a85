"""Events about the model store: imports, pulls, removals; and the metadata summary they carry.

`ModelMetadata` is what Blazar knows of a GGUF from its header alone: enough to describe the model and to plan
its memory (blazar/fit) without reading the file again.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from blazar.errors import PullFailReason
from blazar.events.base import Event, NodeLocal
from blazar.events.bounds import MAX_LAYERS, PATH, Bound, Text, bound_of, entries, items, name_chars
from blazar.events.types import register

# Where a model came from: a file, a hub, a python package, or another tool's store (`blazar import --from`).
SourceKind = Literal["file", "hub", "python-package", "ollama", "lmstudio", "hf-cache", "llama-cpp"]
# How a file entered the store (blazar/store/placement.py): no byte copied, shared extents, or copied.
Placed = Literal["hardlink", "reflink", "copy"]


class ModelMetadata(BaseModel):
    """A GGUF header, summarised. Lengths in elements, sizes in bytes; None where the file does not say."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    architecture: str
    name: str | None = None
    gguf_version: int = 3
    parameter_count: int = 0
    file_type: str | None = None  # e.g. "Q4_K_M" (from general.file_type), or the dominant tensor type
    ctx_train: int | None = None
    block_count: int = 0
    embedding_length: int | None = None
    head_count: int | None = None
    head_count_kv: int | None = None
    # Per-layer KV heads when the file gives an array (some models vary them by layer).
    head_count_kv_per_layer: Annotated[list[int] | None, items(MAX_LAYERS, 20)] = None
    key_length: int | None = None
    value_length: int | None = None
    sliding_window: int | None = None
    # One entry per block: True where the layer uses sliding-window attention.
    swa_layers: Annotated[list[bool] | None, items(MAX_LAYERS, 5)] = None
    vocab_size: int | None = None
    chat_template: bool = False
    embedding_model: bool = False  # a pooling type is set: serves embeddings
    pooling_type: str | None = None
    expert_count: int | None = None
    expert_used_count: int | None = None
    # Weight bytes: every tensor, then split by where llama.cpp places them.
    weights_bytes: int = 0
    layer_bytes: Annotated[list[int], items(MAX_LAYERS, 20)] = Field(default_factory=list)  # blk.N.* summed, index N
    input_bytes: int = 0  # token embeddings and other pre-block tensors (kept on the host by llama.cpp)
    output_bytes: int = 0  # output norm and head (offloaded with the last layer)
    # Tied embeddings (no output.weight): llama.cpp reuses token_embd.weight as the head and, when the output
    # sits on another device than the input, loads a second copy there. Those bytes; 0 with a head of its own.
    tied_output_bytes: int = 0
    tensor_count: int = 0


# What runs a model: llama.cpp's llama-server (GGUF), Blazar's whisper child (a CTranslate2 whisper directory) or
# piper's own HTTP server (an .onnx voice with its .onnx.json). blazar/adapters/engines/kinds.py holds each one's
# argv, readiness probe, memory model and routes.
ModelKind = Literal["llama-server", "whisper", "piper"]


class ShardFile(BaseModel):
    """One part of a split GGUF (`x-00001-of-00003.gguf`), or one file of a directory model (a whisper model's
    model.bin, config.json...; a piper voice's .onnx and .onnx.json), as placed in the store."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: Annotated[str, PATH]  # relative to the models directory
    bytes: int
    sha256: str


@register
class ModelImported(NodeLocal):
    """A model entered the store under `name` (hardlinked, or copied when a link was impossible): a GGUF (kind
    llama-server), or the files of a whisper model or a piper voice in a directory of their own (`shards`; `path` is
    the first of them, `sha256` the directory digest: blazar/store/kinds.py)."""

    TYPE = "model.imported"
    AUDIT = True

    name: str
    path: Annotated[str, PATH]  # relative to the models directory
    source: Annotated[str, PATH]  # where it came from: a local path, a hub target, a python package
    source_kind: SourceKind = "file"  # another tool's store (`blazar import --from`): that tool
    bytes: int
    sha256: str
    linked: bool  # True: hardlink; False: reflinked or copied
    metadata: ModelMetadata  # for a whisper or piper model: its architecture (the kind's name) alone, no GGUF facts
    # For a split model: every part in order (`path` is then the first part, `bytes` the total). For a directory
    # model (whisper, piper): every file of it. Else empty.
    shards: Annotated[list[ShardFile], Bound(16 << 10)] = Field(default_factory=list)
    kind: ModelKind = "llama-server"  # what runs it (events written before kinds existed: llama-server)
    placed: Placed | None = None  # how its bytes entered the store (events before reflinks: see `linked`)

    def stream_key(self) -> str:
        return f"model:{self.name}"

    def audit_details(self) -> dict[str, object]:
        return {"name": self.name, "source": self.source, "source_kind": self.source_kind, "bytes": self.bytes,
                "sha256": self.sha256}


class TemplateTrial(BaseModel):
    """One template's result in a template probe (blazar/instances/template_probe.py), over its prompts."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    template: str  # a template Blazar ships (blazar/store/turn_formats.py), by name
    ended: int  # prompts whose answer ended (an end-of-turn token, or a marker of this template) within max_tokens
    answered: int  # of those, the ones with some text before the end
    tokens: int  # tokens generated over all its prompts


@register
class ModelTemplateProbed(NodeLocal):
    """The GGUF `sha256` (served as `name` when probed) carries no chat template: of the templates Blazar ships, its
    model ends its turn best in `chosen`, measured by `trials` (the same `prompts` fixed prompts in each, greedy, at
    most `max_tokens` each) on `engine_tag`. Every model with that file is served with `chosen` from then on, unless
    a template is set for it (`blazar model set --template`)."""

    TYPE = "model.template_probed"

    name: str
    sha256: str
    engine_tag: str
    prompts: int
    max_tokens: int
    trials: Annotated[list[TemplateTrial], items(16, bound_of(TemplateTrial))]
    chosen: str

    def stream_key(self) -> str:
        return f"model:{self.name}"


@register
class ModelRemoved(NodeLocal):
    """`name` left the store; its file was deleted unless another entry still links the same file."""

    TYPE = "model.removed"
    AUDIT = True

    name: str
    path: Annotated[str, PATH]
    file_deleted: bool  # False when another store entry still links the same file

    def stream_key(self) -> str:
        return f"model:{self.name}"


@register
class ModelAliased(Event):
    """`alias` now names `target` (a model in the store): requests and commands may use either."""

    TYPE = "model.aliased"
    AUDIT = True

    alias: str
    target: str

    def stream_key(self) -> str:
        return f"model:{self.target}"


@register
class ModelAliasRemoved(Event):
    """`alias` no longer names `target`; the model itself stays."""

    TYPE = "model.alias_removed"
    AUDIT = True

    alias: str
    target: str

    def stream_key(self) -> str:
        return f"model:{self.target}"


@register
class ModelPullStarted(NodeLocal):
    """The intent of a download (`blazar pull`): its files, their total size and what a resume starts from. The pull's
    completed or failed event follows with this one's seq as cause."""

    TYPE = "model.pull_started"
    AUDIT = True

    target: str
    name: str
    source_kind: Literal["hub", "python-package"]
    repo: str | None = None
    revision: str | None = None
    files: Annotated[list[str], Bound(16 << 10)] = Field(default_factory=list)  # a pull's files (shards)
    total_bytes: int | None = None
    resumed_from_bytes: int = 0

    def stream_key(self) -> str:
        return f"model:{self.name}"


@register
class ModelPullCompleted(NodeLocal):
    """A pull ended with the model in the store (its `model.imported` came just before); `downloaded_bytes` is what
    came over the network this time (0 from a python package, or when the file was already present)."""

    TYPE = "model.pull_completed"
    AUDIT = True

    target: str
    name: str
    bytes: int
    sha256: str
    duration_ms: int
    downloaded_bytes: int  # 0 when the file was already present

    def stream_key(self) -> str:
        return f"model:{self.name}"


@register
class ModelPullFailed(NodeLocal):
    """A pull ended without a model: why, and how many downloaded bytes are kept for a resume."""

    TYPE = "model.pull_failed"
    AUDIT = True

    target: str
    name: str
    reason: PullFailReason
    detail: Text
    partial_bytes: int = 0  # what is kept for a resume

    def stream_key(self) -> str:
        return f"model:{self.name}"

    def audit_outcome(self) -> str:
        return "cancelled" if self.reason == "cancelled" else "failed"


@register
class InstanceMemoryMeasured(NodeLocal):
    """After a load: what the engine reported it allocated, beside what the planner estimated."""

    TYPE = "instance.memory_measured"
    AUDIT = False

    model: str
    instance_id: str | None = None
    ctx_tokens: int
    slots: int
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    planned_bytes: int
    measured_bytes: int
    # The engine's own lines, by buffer: {"CPU model buffer": bytes, "CPU KV buffer": bytes, ...}
    buffers: Annotated[dict[str, int], entries(32, name_chars(64), 20)] = Field(default_factory=dict)
    rss_bytes: int | None = None

    def stream_key(self) -> str:
        return f"model:{self.model}"
