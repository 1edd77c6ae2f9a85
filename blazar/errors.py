"""The exception tree. Every error Blazar raises on purpose is a `BlazarError` with a stable `code`.

    BlazarError
    ├── LogError                    the event log
    │   ├── UnknownEventType        a stored type no registry entry knows (names the seq)
    │   ├── MalformedEvent          a stored payload that does not validate (names the seq)
    │   ├── AppendOnlyViolation     UPDATE/DELETE refused by the log's triggers
    │   └── SchemaOutOfDate         the database needs `blazar db upgrade` (or is newer than this code)
    ├── ProjectionError             a projection halted at a seq
    ├── ConfigError                 unknown key / invalid value / unreadable config.toml
    ├── SnapshotError               a snapshot that cannot be written or restored (damaged, foreign)
    ├── DaemonRunning               an operation that must not run under a live daemon
    └── AuditChainBroken            `audit verify` found the first bad line
API dialects map `code` to their own error shapes; the CLI prints `message` and exits non-zero.
"""

from __future__ import annotations


class BlazarError(Exception):
    code: str = "blazar_error"
    exit_code: int = 1

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class LogError(BlazarError):
    code = "log_error"


class UnknownEventType(LogError):
    code = "unknown_event_type"

    def __init__(self, seq: int | None, type_name: str) -> None:
        where = f"seq {seq}" if seq is not None else "a new event"
        super().__init__(f"{where}: unknown event type {type_name!r}")
        self.seq = seq
        self.type_name = type_name


class MalformedEvent(LogError):
    code = "malformed_event"

    def __init__(self, seq: int | None, type_name: str, detail: str) -> None:
        where = f"seq {seq}" if seq is not None else "a new event"
        super().__init__(f"{where}: malformed {type_name!r} payload: {detail}")
        self.seq = seq
        self.type_name = type_name


class AppendOnlyViolation(LogError):
    code = "append_only"


class SchemaOutOfDate(LogError):
    code = "schema_out_of_date"


class ProjectionError(BlazarError):
    code = "projection_halted"

    def __init__(self, name: str, seq: int, detail: str) -> None:
        super().__init__(f"projection {name!r} halted at seq {seq}: {detail}")
        self.name = name
        self.seq = seq


class ConfigError(BlazarError):
    code = "invalid_config"
    exit_code = 2


class SnapshotError(BlazarError):
    code = "snapshot_refused"
    exit_code = 3


class DaemonRunning(BlazarError):
    code = "daemon_running"
    exit_code = 4


class AuditChainBroken(BlazarError):
    code = "audit_chain_broken"
    exit_code = 5

    def __init__(self, line: int, detail: str) -> None:
        super().__init__(f"line {line}: {detail}")
        self.line = line
