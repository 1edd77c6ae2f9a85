"""The KV bank's surroundings in unit tests: an instance whose slots can be saved and restored (its KV identity), and
a fake engine that answers llama-server's slot actions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from blazar.events.sessions import KvIdentity
from blazar.instances.supervisor import Instance

IDENT = KvIdentity(engine="b1", model_sha256="aa", ctx_tokens=4096, cache_type_k="f16", cache_type_v="f16",
                   swa_full=True)


class FakeSlotsEngine:
    """llama-server's slot actions: a save writes a file of `size` bytes into the model's slot directory."""

    def __init__(self, directory: Path, *, size: int = 4096, tokens: int = 800) -> None:
        self.directory, self.size, self.tokens = directory, size, tokens
        self.calls: list[tuple[int, str, str]] = []
        self.fail: Exception | None = None
        self.status = 200

    async def slot_action(self, base_url: str, slot_id: int, action: str, filename: str, *,
                          api_key: str | None = None, timeout_s: float = 30.0) -> tuple[int, Any]:
        self.calls.append((slot_id, action, filename))
        if self.fail is not None:
            raise self.fail
        if self.status != 200:
            return self.status, {"error": {"message": "slot busy"}}
        if action == "save":
            self.directory.mkdir(parents=True, exist_ok=True)
            (self.directory / filename).write_bytes(b"k" * self.size)
            return 200, {"id_slot": slot_id, "filename": filename, "n_saved": self.tokens, "n_written": self.size}
        return 200, {"id_slot": slot_id, "filename": filename, "n_restored": self.tokens, "n_read": self.size}


def instance(iid: str = "i1", identity: KvIdentity | None = IDENT, restorable: bool = True) -> Instance:
    return Instance(instance_id=iid, model="gemma", port=1, slots=2, ctx_tokens=4096, engine_tag="b1",
                    kv_identity=identity, kv_restorable=restorable)
