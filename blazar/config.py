"""Configuration: the keys (`section.key`), parsing values given as text, the old flat names, and config.toml.

The schema is blazar/config_schema.py. The file is the user's; the log records every change to it (`config.changed`).
Writes are atomic (a temporary file renamed over the old one, the previous version kept as `config.toml.bak`),
serialised by a lock file. Keys were flat before they had sections (`port`, now `server.port`): an old name is still
read from config.toml and taken by `blazar config`, each time with one deprecation line, and `config.changed` events
that name one are read under the new name (blazar/projections/config.py).
"""

from __future__ import annotations

import contextlib
import difflib
import fcntl
import logging
import os
import shutil
import tomllib
import typing
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

import tomli_w
from pydantic import ValidationError
from pydantic.fields import FieldInfo

from blazar.config_schema import NODE_NAME, Section, Settings
from blazar.diskspace import disk_full, no_space
from blazar.errors import ConfigError

__all__ = ["FIELDS", "LOCAL_KEYS", "NODE_NAME", "OLD_KEYS", "SECTIONS", "Settings"]

_log = logging.getLogger("blazar.config")

SECTIONS: dict[str, type[Section]] = {
    name: typing.cast(type[Section], info.annotation) for name, info in Settings.model_fields.items()
}
FIELDS: dict[str, FieldInfo] = {
    f"{section}.{name}": info for section, model in SECTIONS.items() for name, info in model.model_fields.items()
}
# The keys there were before sections, by their flat names (each is its name within its section now). Fixed: a key
# added since has no flat name.
_FLAT_NAMES = frozenset({
    "allowed_hosts", "archive_dir", "archive_every_s", "backlog", "batch_concurrency", "body_idle_timeout_s",
    "body_timeout_s", "cascade_min_logprob", "checkpoint_every", "circuit_open_s", "cors_origins", "crash_limit",
    "crash_window_s", "ctx", "database_url", "engine_gate", "engine_gate_models", "engine_gate_threshold",
    "engine_threads", "event_max_kib", "files_max_bytes", "group_commit_ms", "host", "idle_timeout_s", "image_fetch",
    "image_fetch_allow_hosts", "image_fetch_timeout_s", "image_max_count", "image_max_megapixels", "image_max_mib",
    "keep_alive", "key_open_batches_max", "key_storage_max_mib", "load_mode", "load_timeout_s", "log_disk_share",
    "log_level", "max_audio_mib", "max_audio_s", "max_body_mib", "max_concurrent_requests", "max_connections",
    "max_incoming_bodies", "max_loaded_models", "max_speech_chars", "max_tokens_over_context", "memory_limit_mib",
    "node_down_after_s", "node_heartbeat_s", "node_name", "node_url", "otlp_endpoint", "otlp_headers", "pii_scrub",
    "port", "queue_depth", "queue_timeout_s", "remote_circuit_failures", "remote_circuit_s", "remote_health_s",
    "request_retention", "responses_retention_s", "session_bank_mib", "session_keep_s", "session_save_max_mib",
    "session_save_timeout_s", "session_swa_full", "slots", "spec_governor", "spec_min_acceptance", "spec_min_drafted",
    "spec_reprobe_s", "spec_window_s", "stop_grace_s", "stream_heartbeat_s", "tls_cert", "tls_key"
})
OLD_KEYS: dict[str, str] = {key.partition(".")[2]: key for key in FIELDS if key.partition(".")[2] in _FLAT_NAMES}
# Keys about this machine rather than the log's history: a restored snapshot never sets them here.
LOCAL_KEYS = frozenset({"log.database_url", "cluster.node_name", "cluster.node_url", "retention.archive_dir"})


def current_key(key: str) -> str:
    """The sectioned name of `key` (an old flat name's section.key); any other text as it is. Logs nothing: for
    reading history, where an old name is no one's mistake."""
    return OLD_KEYS.get(key, key)


def resolve(key: str, *, where: str) -> str:
    """A key as a user gave it -> its section.key: an old flat name is taken with a deprecation line; an unknown
    key is a ConfigError that lists the valid ones."""
    if key in OLD_KEYS:
        new = OLD_KEYS[key]
        _log.warning("%s: the config key %r is deprecated: it is now %r", where, key, new)
        return new
    _field(key)
    return key


def nest(values: Mapping[str, Any]) -> dict[str, Any]:
    """{"server.port": 1} -> {"server": {"port": 1}} (a key without a section stays at the top)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        section, dot, name = key.partition(".")
        if dot:
            out.setdefault(section, {})[name] = value
        else:
            out[key] = value
    return out


def flatten(tables: Mapping[str, Any], *, source: str | None = None) -> dict[str, Any]:
    """Parsed TOML (sections as tables) -> {"section.key": value}. An old flat key is taken under its new name,
    logging a deprecation line that names `source` (None: silently); anything unknown is kept as it is, for
    validation to refuse or `config unset` to remove."""
    out: dict[str, Any] = {}
    for key, value in tables.items():
        if key in SECTIONS and isinstance(value, dict):
            continue
        if key in OLD_KEYS:
            if source is not None:
                resolve(key, where=source)
            out[OLD_KEYS[key]] = value
        else:
            out[key] = value
    for section in SECTIONS:  # a sectioned key wins over the same key under its old name
        table = tables.get(section)
        if isinstance(table, dict):
            out.update({f"{section}.{name}": value for name, value in table.items()})
    return out


def build(overrides: Mapping[str, Any]) -> Settings:
    """The Settings for these validated overrides ({"section.key": value})."""
    return Settings.model_validate(nest(overrides))


def as_flat(s: Settings) -> dict[str, Any]:
    """Every key's value in `s`, as JSON data: {"section.key": value}."""
    return flatten(s.model_dump(mode="json"))


def defaults() -> dict[str, Any]:
    """Every key's built-in default: {"section.key": value}, in section order."""
    return as_flat(Settings())


def describe(key: str) -> str:
    """One line saying what a key accepts: its choices or range."""
    info = _field(key)
    ann = info.annotation
    if typing.get_origin(ann) is Literal:
        return "one of: " + ", ".join(str(c) for c in typing.get_args(ann))
    if ann is bool:
        return "true or false"
    if ann == list[str]:
        return "a comma-separated list (empty text: none)"
    if ann == dict[str, str]:
        return "comma-separated name=value pairs (empty text: none)"
    if key == "engine.keep_alive":
        return "a duration: seconds like 300, or 45s, 5m, 1h30m; negative: forever"
    bounds = {type(m).__name__: m for m in info.metadata}
    lo = getattr(bounds.get("Ge"), "ge", None)
    hi = getattr(bounds.get("Le"), "le", None)
    kind = "an integer" if ann is int else "a number" if ann is float else "text"
    if lo is not None and hi is not None:
        return f"{kind} from {lo} to {hi}"
    return kind


def unknown_key(key: str, *, source: str = "") -> ConfigError:
    """The error for a key no setting has: the nearest keys, and the keys of its section (all 77 would be a wall)."""
    near = difflib.get_close_matches(key, [*FIELDS, *OLD_KEYS], n=3, cutoff=0.7)
    near = list(dict.fromkeys(OLD_KEYS.get(k, k) for k in near))  # an old flat name suggests its new key
    hint = f" (did you mean {' or '.join(repr(k) for k in near)}?)" if near else ""
    section = key.partition(".")[0]
    if section in SECTIONS:
        valid = f"valid keys in [{section}]: " + ", ".join(k for k in FIELDS if k.startswith(section + "."))
    else:
        valid = f"valid keys: section.key, the sections being {', '.join(SECTIONS)}"
    where = f"{source}: " if source else ""
    return ConfigError(f"{where}unknown config key {key!r}{hint}; {valid} (`blazar config defaults` lists them all)")


def _field(key: str) -> FieldInfo:
    info = FIELDS.get(key)
    if info is None:
        raise unknown_key(key)
    return info


def parse_value(key: str, text: str) -> Any:
    """Text from the command line -> a validated value for `key` (ConfigError says what is valid)."""
    info = _field(key)
    ann = info.annotation
    raw: Any = text
    if ann is bool:
        lowered = text.strip().lower()
        if lowered in ("true", "yes", "on", "1"):
            raw = True
        elif lowered in ("false", "no", "off", "0"):
            raw = False
        else:
            raise ConfigError(f"invalid value {text!r} for {key}: expected {describe(key)}")
    elif ann == list[str]:
        raw = [part.strip() for part in text.split(",") if part.strip()]
    elif ann == dict[str, str]:
        raw = parse_pairs(key, text)
    return validate_value(key, raw)


def parse_pairs(key: str, text: str) -> dict[str, str]:
    """"k=v,k2=v2" -> {"k": "v", "k2": "v2"} (the form of OTEL_EXPORTER_OTLP_HEADERS, without its URL-encoding)."""
    pairs: dict[str, str] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        name, eq, value = part.partition("=")
        if not eq or not name.strip():
            raise ConfigError(f"invalid value {text!r} for {key}: expected {describe(key)}, like "
                              "authorization=Bearer abc,x-team=ml")
        pairs[name.strip()] = value.strip()
    return pairs


def validate_value(key: str, value: Any) -> Any:
    _field(key)
    try:
        checked = build({key: value})
    except ValidationError as exc:
        # A list's own validators say which item is wrong and why (an origin without its scheme, say).
        why = "; ".join(str(e.get("ctx", {}).get("error", "")) for e in exc.errors() if e["type"] == "value_error")
        raise ConfigError(f"invalid value {value!r} for {key}: {why or 'expected ' + describe(key)}") from None
    section, _, name = key.partition(".")
    return getattr(checked, section).model_dump(mode="json")[name]


def validate_overrides(values: dict[str, Any], *, source: str) -> dict[str, Any]:
    """Check a whole set of overrides (as read from a file); returns them normalised."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if key not in FIELDS:
            raise unknown_key(key, source=source)
        try:
            out[key] = validate_value(key, value)
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc.message}") from None
    return out


def effective(overrides: dict[str, Any]) -> dict[str, Any]:
    merged = defaults()
    merged.update(overrides)
    return merged


# -- config.toml ---------------------------------------------------------------------------------------------


def read_file(path: Path) -> dict[str, Any]:
    """The overrides in config.toml, validated: {"section.key": value} ({} when the file does not exist). Each old
    flat key in it logs one deprecation line."""
    return validate_overrides(flatten(_load(path), source=str(path)), source=str(path))


def read_file_raw(path: Path) -> dict[str, Any]:
    """config.toml's keys as written, unvalidated (so `config unset` can repair a bad key): {"section.key": value},
    an old flat key under its new name, an unknown one as it is."""
    return flatten(_load(path))


def _load(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        return {}
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from None


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Serialise writers of config.toml across processes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def write_file(path: Path, values: dict[str, Any]) -> None:
    """Replace config.toml atomically with `values` ({"section.key": value}, written as one table per section),
    keeping the previous file as config.toml.bak."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tables = nest(dict(sorted(values.items())))
    body = "# Blazar configuration: `blazar config defaults` lists every key.\n" + tomli_w.dumps(tables)
    try:
        with tmp.open("w") as fh:
            fh.write(body)
            fh.flush()
            os.fsync(fh.fileno())
        if path.exists():
            bak = path.with_name(path.name + ".bak")
            shutil.copy2(path, bak)
            bak.chmod(0o600)  # copy2 keeps the old file's mode: the copy is the owner's alone, like config.toml
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)  # config.toml is as it was; no half-written file is left beside it
        if no_space(exc, path.parent):
            raise disk_full(path.parent, writing=str(path)) from exc
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
