"""A store model as a fake supervisor resolves it (the gateway resolves a request's model once, into this)."""

from __future__ import annotations

from pathlib import Path

from blazar.events.models import ModelMetadata
from blazar.instances.supervisor import ResolvedModel


def resolved(name: str) -> ResolvedModel:
    return ResolvedModel(name=name, path=Path("/nonexistent/models") / f"{name}.gguf",
                         metadata=ModelMetadata(architecture="llama", name=name))
