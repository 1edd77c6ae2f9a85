"""The piper voices in the store, as GET /v1/audio/voices lists them: each model of the piper kind with what its
.onnx.json says (language, sample rate, speakers: the `voice` a speech request may name)."""

from __future__ import annotations

import json
from typing import Any

from blazar.confine import inside
from blazar.context import Blazar
from blazar.errors import OutsideHome
from blazar.projections import catalog


def voices(app: Blazar) -> list[dict[str, Any]]:
    """Every piper model, by name; a voice whose config cannot be read is listed without its details."""
    out: list[dict[str, Any]] = []
    for m in catalog.models(app.runner.state("catalog")):
        if getattr(m, "kind", "llama-server") != "piper":
            continue
        entry: dict[str, Any] = {"id": m.name, "object": "voice", "model": m.name, "speakers": []}
        config = next((f for f in m.files if f.endswith(".onnx.json")), None)
        if config is not None:
            try:
                data = json.loads(inside(app.paths.models, config, what=f"voice {m.name}").read_text("utf-8"))
            except (OSError, ValueError, OutsideHome):
                data = {}
            speakers = data.get("speaker_id_map") or {}
            entry["speakers"] = sorted(speakers, key=lambda s: speakers[s]) if isinstance(speakers, dict) else []
            entry["language"] = (data.get("language") or {}).get("code") or (data.get("espeak") or {}).get("voice")
            entry["sample_rate"] = (data.get("audio") or {}).get("sample_rate")
        out.append(entry)
    return out
