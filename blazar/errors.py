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
    ├── ModelFileError              a model file that cannot be read as GGUF (names the file)
    │   └── HeaderIncomplete        a header prefix too short to parse: fetch `needed_bytes`
    ├── AuditChainBroken            `audit verify` found the first bad line
    ├── ModelError                  the model store
    │   ├── ModelNotFound           no model by that name
    │   ├── ModelExists             the name is taken
    │   ├── ModelInUse              `rm` of a model that is loaded
    │   ├── ModelNotLoaded          `stop` of a model with no running instance
    │   └── InvalidModelName        a name outside [a-z0-9._-] (with an optional :tag)
    ├── HubError                    a pull from a Hugging Face hub endpoint (names the repo and file)
    │   ├── NotFoundOnHub           no such repo, revision, file, or quant (lists the quants there are)
    │   ├── HubAccessDenied         a gated or private repo, and no token or one without access
    │   ├── ChecksumMismatch        the bytes do not hash to what the hub advertised; the bad file is deleted
    │   ├── DownloadCancelled       cancelled on request; the partial file is kept for a resume
    │   └── HubUnavailable          connection refused or dropped, a timeout, a 5xx: try again later
    └── EngineError                 an engine binary that cannot be run or whose output cannot be read
        ├── EngineIncompatible      the binary lacks a flag (or value) the plan needs (names the flag)
        ├── NoEngine                no engine is active (names the command that installs one)
        ├── EngineNotFound          no engine by that tag
        ├── EngineExists            the tag is taken by different files
        ├── EngineRefused           activation refused by verify or the smoke gate (carries the event's seq)
        ├── EngineVerifyFailed      files that no longer match their install record (names each one)
        ├── EngineBuildFailed       a build that could not run or finish (names its log, or the missing tool)
        ├── DoesNotFit              a load no eviction can make room for (the planner's reason)
        │   └── ModelPinned         the model is pinned in another shape (context, embeddings): unpin or stop it
        ├── CircuitOpen             loads of a model refused after repeated crashes (names `ps --reset`)
        └── LoadFailed              the child exited or stayed unhealthy while loading (reason, log tail)

    Exit codes: 1 other, 2 input (config, model, engine tag), 3 snapshot, 4 daemon running, 5 audit chain,
    6 does not fit / no usable engine, 7 engine build, 8 port in use, 9 model not loaded, 10 circuit open,
    11 load failed.
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


class ModelFileError(BlazarError):
    code = "invalid_model_file"
    exit_code = 2


class HeaderIncomplete(ModelFileError):
    """The bytes fetched so far end inside the GGUF header; `needed_bytes` is a lower bound on the prefix to fetch."""

    code = "header_incomplete"

    def __init__(self, needed_bytes: int, have_bytes: int = 0, source: str = "remote GGUF") -> None:
        super().__init__(f"{source}: GGUF header incomplete: have {have_bytes} bytes, need at least {needed_bytes}")
        self.needed_bytes = needed_bytes
        self.have_bytes = have_bytes


class AuditChainBroken(BlazarError):
    code = "audit_chain_broken"
    exit_code = 5

    def __init__(self, line: int, detail: str) -> None:
        super().__init__(f"line {line}: {detail}")
        self.line = line


class ModelError(BlazarError):
    code = "model_error"
    exit_code = 2


class ModelNotFound(ModelError):
    code = "model_not_found"


class ModelExists(ModelError):
    code = "model_exists"


class ModelInUse(ModelError):
    """The model has a running instance: stop it first."""

    code = "model_in_use"


class InvalidModelName(ModelError):
    code = "invalid_model_name"


class HubError(BlazarError):
    """A pull failed. `reason` is the `ModelPullFailed.reason` it maps to; `partial_bytes` what is kept to resume."""

    code = "hub_error"
    reason = "error"

    def __init__(self, message: str, *, repo: str | None = None, filename: str | None = None,
                 partial_bytes: int = 0) -> None:
        super().__init__(message)
        self.repo = repo
        self.filename = filename
        self.partial_bytes = partial_bytes


class NotFoundOnHub(HubError):
    code = "not_found_on_hub"
    reason = "not_found"


class HubAccessDenied(HubError):
    code = "hub_access_denied"


class ChecksumMismatch(HubError):
    code = "checksum_mismatch"
    reason = "checksum_mismatch"

    def __init__(self, repo: str, filename: str, expected: str, actual: str) -> None:
        super().__init__(f"{repo}/{filename}: the downloaded bytes hash to {actual} but the hub advertised "
                         f"{expected}; the file was deleted", repo=repo, filename=filename)
        self.expected = expected
        self.actual = actual


class DownloadCancelled(HubError):
    code = "download_cancelled"
    reason = "cancelled"

    def __init__(self, repo: str, filename: str, partial_bytes: int) -> None:
        super().__init__(f"{repo}/{filename}: download cancelled at {partial_bytes} bytes; the partial file is kept "
                         "for a resume", repo=repo, filename=filename, partial_bytes=partial_bytes)


class HubUnavailable(HubError):
    code = "hub_unavailable"
    reason = "network"


class EngineError(BlazarError):
    code = "engine_error"


class EngineIncompatible(EngineError):
    """The binary's --help does not list a flag, or a value of it, that the instance needs."""

    code = "engine_incompatible"

    def __init__(self, flag: str, detail: str) -> None:
        super().__init__(f"this llama-server has no {flag}: {detail}")
        self.flag = flag


class NoEngine(EngineError):
    code = "no_engine"
    exit_code = 6

    def __init__(self) -> None:
        super().__init__("no engine is active: build one for this machine with `blazar engine build`, or bring "
                         "your own llama-server with `blazar engine install --path BIN`")


class EngineNotFound(EngineError):
    code = "engine_not_found"
    exit_code = 2


class EngineExists(EngineError):
    code = "engine_exists"
    exit_code = 2


class EngineRefused(EngineError):
    """`engine.activation_refused` was recorded at `seq`; the previously active engine stays."""

    code = "engine_activation_refused"
    exit_code = 6

    def __init__(self, message: str, *, tag: str, reason: str, seq: int) -> None:
        super().__init__(message)
        self.tag = tag
        self.reason = reason
        self.seq = seq


class EngineVerifyFailed(EngineError):
    code = "engine_verify_failed"
    exit_code = 6

    def __init__(self, tag: str, problems: list[str]) -> None:
        super().__init__(f"engine {tag}: {len(problems)} file(s) do not match the install record: "
                         + "; ".join(problems))
        self.tag = tag
        self.problems = problems


class EngineBuildFailed(EngineError):
    code = "engine_build_failed"
    exit_code = 7

    def __init__(self, message: str, *, log_path: str | None = None) -> None:
        super().__init__(message if log_path is None else f"{message} (build log: {log_path})")
        self.log_path = log_path


class ModelNotLoaded(ModelError):
    code = "model_not_loaded"
    exit_code = 9


class DoesNotFit(EngineError):
    code = "insufficient_memory"
    exit_code = 6


class ModelPinned(DoesNotFit):
    """A load that would replace a pinned instance of the model: the pin stands (409, not a memory shortage)."""

    code = "model_pinned"


class CircuitOpen(EngineError):
    code = "circuit_open"
    exit_code = 10


class LoadFailed(EngineError):
    code = "load_failed"
    exit_code = 11


# The HTTP status and stable code of each error a request can meet, in one place for the API and the gateway.
# Checked in order, so a subclass comes before its base.
_HTTP: list[tuple[type[BlazarError], int, str]] = [
    (InvalidModelName, 400, "invalid_model_name"),
    (ModelNotFound, 404, "model_not_found"),
    (ModelNotLoaded, 404, "model_not_loaded"),
    (ModelExists, 409, "model_exists"),
    (ModelInUse, 409, "model_in_use"),
    (NotFoundOnHub, 404, "not_found_on_hub"),
    (HubAccessDenied, 403, "hub_access_denied"),
    (HubUnavailable, 502, "hub_unavailable"),
    # Any other hub failure (a listed path that would leave the download directory, a size it did not give): the
    # hub's answer was unusable.
    (HubError, 502, "hub_error"),
    # A file that is not a usable GGUF (pulled or imported): the request cannot be carried out on it.
    (ModelFileError, 422, "invalid_model_file"),
    (CircuitOpen, 503, "circuit_open"),
    (ModelPinned, 409, "model_pinned"),
    (DoesNotFit, 507, "insufficient_memory"),
    (LoadFailed, 502, "load_failed"),  # the engine started but could not load the model: an upstream failure
    (NoEngine, 503, "no_engine"),
    (EngineIncompatible, 503, "engine_incompatible"),
    (EngineError, 503, "engine_error"),  # the active engine cannot be started (missing binary, spawn failed)
]


def http_status(exc: BlazarError) -> tuple[int, str]:
    for cls, status, code in _HTTP:
        if isinstance(exc, cls):
            return status, code
    return 500, "internal_error"
