"""Config commands: set and unset keys (file first, then the event), and notice hand edits at start-up.

NOTE: config.toml is written before the event is appended. If the process dies in between, the next start
sees the file differ from the log and records the change then (as source "file"); nothing is lost.
"""

from __future__ import annotations

from typing import Any

import orjson

from blazar import config as settings
from blazar.context import Blazar
from blazar.errors import ConfigError
from blazar.events.base import Recorded
from blazar.events.bounds import SETTING
from blazar.events.system import ConfigChanged


async def set_value(app: Blazar, key: str, text: str) -> Recorded | None:
    """Set `key` (section.key, or its old flat name) from its text form. Returns the recorded change, or None when
    nothing changed."""
    key = settings.resolve(key, where="config set")
    value = _recordable(key, settings.parse_value(key, text))
    path = app.paths.config_file
    with settings.locked(path):
        values = settings.read_file_raw(path)
        settings.validate_overrides({k: v for k, v in values.items() if k != key}, source=str(path))
        old = app.overrides().get(key)
        if values.get(key) == value and old == value:
            return None
        values[key] = value
        settings.write_file(path, values)
        (rec,) = await app.record(ConfigChanged(key=key, old=old, new=value, source="cli"))
    return rec


async def unset_value(app: Blazar, key: str) -> Recorded | None:
    """Return `key` to its default. An unknown key is removed from the file (a repair), without an event."""
    if key in settings.OLD_KEYS:
        key = settings.resolve(key, where="config unset")
    path = app.paths.config_file
    with settings.locked(path):
        values = settings.read_file_raw(path)
        if key not in settings.FIELDS and key not in values:
            raise settings.unknown_key(key)
        if key in values:
            del values[key]
            settings.write_file(path, values)
        old = app.overrides().get(key)
        if key not in settings.FIELDS or old is None:
            return None
        (rec,) = await app.record(ConfigChanged(key=key, old=old, new=None, source="cli"))
    return rec


async def reconcile_file(app: Blazar) -> list[Recorded]:
    """Record every difference between config.toml and the log (hand edits made while Blazar was not looking)."""
    path = app.paths.config_file
    with settings.locked(path):
        in_file = settings.read_file(path)
        for key, value in in_file.items():
            _recordable(key, value, where=f"{path}: ")
        in_log = app.overrides()
        changes = [
            ConfigChanged(key=k, old=in_log.get(k), new=in_file.get(k), source="file")
            for k in sorted(set(in_file) | set(in_log))
            # NOTE: a local key (where this home's log lives) is the machine's, not the log's history: a log
            # opened from another home, or just moved to PostgreSQL, does not record it as an edit.
            if in_file.get(k) != in_log.get(k) and k not in settings.LOCAL_KEYS
        ]
        return await app.record(changes) if changes else []


def _recordable(key: str, value: Any, where: str = "") -> Any:
    """A value `config.changed` can record (blazar/events/bounds.py SETTING), else a ConfigError naming the key."""
    size = len(orjson.dumps(value))
    if size > SETTING.json:
        raise ConfigError(f"{where}{key}: a value of {size:,} bytes as JSON; a setting holds at most {SETTING.json:,}")
    return value
