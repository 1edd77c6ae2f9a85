"""Events about Blazar itself: configuration changes and snapshot restores."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from blazar.events.base import Event
from blazar.events.bounds import PATH, SETTING
from blazar.events.types import register

JsonValue = Any


@register
class ConfigChanged(Event):
    """One configuration key (`section.key`) changed. `new` is None when the key was unset (back to its default).
    Events from before keys had sections name a flat key (`port`): the `config` projection reads it under its new
    name (`server.port`)."""

    TYPE = "config.changed"
    AUDIT = True

    key: str
    old: Annotated[JsonValue, SETTING] = None
    new: Annotated[JsonValue, SETTING] = None
    # "cli": `blazar config set/unset`; "file": a hand edit of config.toml noticed at start-up.
    source: Literal["cli", "file"] = "cli"

    def stream_key(self) -> str:
        return f"config:{self.key}"


@register
class SnapshotTaken(Event):
    """A consistent copy of the log was written (the copy itself ends at `seq_last`)."""

    TYPE = "snapshot.taken"
    AUDIT = True

    path: Annotated[str, PATH]
    seq_last: int
    event_count: int
    db_sha256: str
    model_files: int = 0

    def stream_key(self) -> str:
        return "snapshot"


@register
class SnapshotRestored(Event):
    """The log was replaced by a verified snapshot; the replaced log was kept at `previous_kept_at`."""

    TYPE = "snapshot.restored"
    AUDIT = True

    path: Annotated[str, PATH]
    manifest_sha256: str
    seq_last: int
    previous_seq_last: int
    previous_kept_at: Annotated[str | None, PATH] = None
    # True when it ran over a live daemon (only with --force).
    forced: bool = False
    # True when config.toml was rewritten to the restored overrides (the old file kept as config.toml.bak).
    config_rewritten: bool = False

    def stream_key(self) -> str:
        return "snapshot"
