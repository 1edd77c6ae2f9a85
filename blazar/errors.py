"""The exception tree. Every error Blazar raises on purpose is here, a `BlazarError` with a stable `code` and the
`http_status` a request that meets it is answered with, both class attributes (a `Refused` may set its own).

    BlazarError                     500 internal_error unless a class says otherwise
    ├── LogError                    the event log
    │   ├── UnknownEventType        a stored type no registry entry knows (names the seq)
    │   ├── MalformedEvent          a stored payload that does not validate (names the seq)
    │   ├── EventTooLarge           a new event over `event_max_kib` encoded, refused where it is appended
    │   │   └── EventFieldTooLarge  a new event with a field over its bound (blazar/events/bounds.py)
    │   ├── AppendOnlyViolation     UPDATE/DELETE refused by the log's triggers
    │   ├── LogUnreachable     503  the log's database (PostgreSQL) cannot be reached: control changes wait
    │   ├── InvalidLogLocation 400  a log location that is neither a file path nor a PostgreSQL URL (a bad port)
    │   ├── SchemaOutOfDate         the database needs `blazar db upgrade` (or is newer than this code)
    │   └── ArchiveError            archiving refused or impossible (a segment that does not verify, a range mismatch)
    │       ├── ArchiveBusy         another archive run holds this archive directory's lock
    │       ├── SegmentMissing      a segment the log names is not in the archive directory (names it and its seqs)
    │       └── SegmentBroken       a segment edited, truncated or reordered (names the segment and the first bad line)
    ├── ProjectionError             a projection halted at a seq
    ├── ConfigError            400  unknown key / invalid value / unreadable config.toml
    ├── SnapshotError               a snapshot that cannot be written or restored (damaged, foreign, untrusted paths)
    ├── DiskFull               507  no space left where Blazar writes (names the filesystem, its free space, the need)
    ├── OutsideHome            409  a path the log names leads outside the home's directory for it (names the event)
    ├── DaemonRunning               an operation that must not run under a live daemon
    ├── DaemonUnavailable           the CLI found no daemon to talk to
    ├── ServiceError                `blazar service` refused: no root for a system unit, an unsupported platform
    ├── RemoteError                 the daemon answered with an error (its code, status and the CLI's exit code)
    ├── PortInUse                   the port is taken by another program
    ├── UnsafeBind                  a bind wider than loopback with no API key
    │   └── UnsafeNodeUrl           a node URL that would carry the cluster key in clear (plain http off this machine)
    ├── TraceNotFound          404  `blazar why` of a trace the log does not hold
    ├── KeyCommandError        400  a key command that cannot be carried out (bad pattern, unknown limit)
    ├── DialectError           400  a request a dialect cannot serve as written (`code` says which rule it broke)
    │   ├── GrammarUnsupported 400  a schema the compact grammar cannot express (`keyword`): the engine converts it
    │   ├── TemplateNotConvertible 400 an Ollama Go template the converter does not turn into Jinja (`reason`)
    │   └── RealtimeEventInvalid 400 a realtime client event with a field that does not validate (`param`)
    │       └── RealtimeToolHosted 400 a realtime tool only OpenAI's servers run (MCP): refused by name
    ├── FileTooLarge           413  an upload to /v1/files over files_max_bytes
    ├── AudioError             400  an upload the speech lanes cannot take as audio
    │   ├── NotAudio           400  FFmpeg cannot read it as audio (or it holds no sound)
    │   ├── AudioTooLong       400  longer than the duration limit (names both)
    │   └── AudioFormatError   400  realtime audio: a format the protocol does not name, or bytes that do not fit it
    ├── ChildRefused           400  a whisper child's answer to a request it cannot serve (its own status and param)
    ├── BatchConflict          409  a batch change its status does not allow (cancel a finished batch)
    ├── ShortRead                   internal to GGUF parsing: the bytes end before `needed`
    ├── SearchBudgetSpent           internal to `blazar search`: its header bytes or time ran out (said in a row)
    ├── ModelFileError         422  a model file that cannot be read as GGUF (names the file)
    │   └── HeaderIncomplete        a header prefix too short to parse: fetch `needed_bytes`
    ├── AuditChainBroken            `audit verify` found the first bad line
    ├── ModelError                  the model store
    │   ├── ModelNotFound      404  no model by that name
    │   ├── ModelExists        409  the name is taken
    │   ├── ModelInUse         409  `rm` of a model that is loaded
    │   ├── ModelNotLoaded     404  `stop` of a model with no running instance
    │   ├── InvalidModelName   400  a name outside [a-z0-9._-] (with an optional :tag)
    │   ├── WrongModelKind     400  a route the model's kind does not serve (chat to a whisper model): says what it does
    │   ├── InvalidModelSettings 400 a template, system prompt, parameter or Modelfile Blazar cannot serve as given
    │   └── ForeignStoreError  400  `import --from` of another tool's store it cannot read (no such directory, reader)
    ├── RemoteCommandError     400  `blazar remote add|rm` that cannot be carried out (a bad name, URL or model)
    ├── RealtimeProfileError   400  a realtime profile that cannot be set, or a session's three models that cannot be
    │                               found (a model missing, of another kind, a name taken)
    ├── RealtimeChatRefused    400  a realtime response's chat refused or failed (its `code` is the refusal's own)
    │   └── RealtimeHearRefused 400 a realtime turn's transcription refused or failed (a limit, the scope, whisper)
    ├── RealtimeSpeechRefused  400  a realtime response's speech refused or failed (its `code` is the refusal's own)
    ├── WorkerError            400  `blazar worker` that cannot run (no rpc-server, a bind wider than loopback)
    ├── NodeError              502  another node could not do what it was asked (unknown, down, unreachable, refused)
    ├── SessionError                a session command (`blazar session save|restore|rm`)
    │   ├── SessionNotFound    404  no session by that name (none of its turns or saves is in the log)
    │   └── SessionUnavailable 409  no live slot to save, nothing in the bank to restore, or its slot is busy
    ├── HubError               502  a pull from a Hugging Face hub endpoint (names the repo and file)
    │   ├── NotFoundOnHub      404  no such repo, revision, file, or quant (lists the quants there are)
    │   ├── HubAccessDenied    403  a gated or private repo, and no token or one without access
    │   ├── ChecksumMismatch        the bytes do not hash to what the hub advertised; the bad file is deleted
    │   ├── DownloadCancelled       cancelled on request; the partial file is kept for a resume
    │   └── HubUnavailable     502  connection refused or dropped, a timeout, a 5xx: try again later
    ├── EngineError            503  an engine binary that cannot be run or whose output cannot be read
    │   ├── EngineIncompatible 503  the binary lacks a flag (or value) the plan needs (names the flag)
    │   ├── NoEngine           503  no engine is active (names the command that installs one)
    │   ├── EngineExtraMissing 503  a whisper or piper model whose Python extra is not installed (names the pip command)
    │   ├── EngineNotFound          no engine by that tag
    │   ├── EngineExists            the tag is taken by different files
    │   ├── EngineRefused           activation refused by verify or the smoke gate (carries the event's seq)
    │   ├── EngineVerifyFailed      files that no longer match their install record (names each one)
    │   ├── EngineBuildFailed       a build that could not run or finish (names its log, or the missing tool)
    │   ├── EngineIndexError        `engine update`: the package index unreadable, no sdist on it, a hash mismatch
    │   ├── EngineUnreachable  502  a child's port did not answer
    │   │   └── EngineGone     502  ... because the child had exited: the gateway routes the request again, once
    │   │       └── SwapRecalled      ... or it was served ahead of a swap whose hold ran out: routed behind it
    │   ├── TemplateProbeFailed 502 a template probe's prompt got no /completion answer (the load goes on)
    │   ├── EngineStreamBroken 502  a child's answer broke off mid-body
    │   ├── SynthesisFailed    502  the piper child answered with an error or with audio that is not 16-bit WAV
    │   ├── ProcessExited      502  the child exited before it was healthy
    │   ├── LoadTimeout        504  the child was not healthy in time
    │   ├── DoesNotFit         507  a load no eviction can make room for (the planner's reason)
    │   │   ├── ModelPinned    409  the model is pinned in another shape (context, embeddings): unpin or stop it
    │   │   └── VictimsBusy    503  a request's load waits for busy instances to drain (the swap order's to catch)
    │   ├── CircuitOpen        503  loads of a model refused after repeated crashes (names `ps --reset`)
    │   └── LoadFailed         502  the child exited or stayed unhealthy while loading (reason, log tail)
    └── Refused                503  a request refused before any token: reason, retry_after_s, observations
        ├── AdmissionRefused        admission said no
        │   ├── QueueFull      429  the model's queue is full
        │   ├── QueueTimeout   503  the wait for a slot ran out
        │   ├── GlobalCap      429  max_concurrent_requests reached and its queue full
        │   └── DeadlineUnmeetable 503 the request's deadline cannot be met (estimated from the measured drain)
        ├── LimitExceeded      429  a key's rpm, tpm, daily tokens or concurrency
        ├── AuthRefused        401  no key, or a wrong one
        │   ├── Unauthenticated 401 (with WWW-Authenticate)
        │   └── Forbidden      403  a key without the admin right
        └── EdgeRefused             the Host guard, the Origin check (403), a body that is not JSON (415)

    Exit codes: 1 other, 2 input (config, model, engine tag, log location), 3 snapshot, 4 daemon running,
    5 audit chain, 6 does not fit / no usable engine, 7 engine build, 8 port in use, 9 model not loaded,
    10 circuit open, 11 load failed, 12 disk full.
API dialects map `code` to their own error shapes; the CLI prints `message` and exits non-zero.

Two audiences. `message` is for the machine's owner (the CLI, an admin key, `blazar why`, the daemon log): it may name
the home's files, quote an engine's output or a traceback. `public` is what a key that is not an admin's is told in
its place: what failed and what to do, never a path, a log's name or a traceback (an instance's own, else its class's
`PUBLIC`; None: the message with every path taken out, blazar/redact.py). A refusal made from another error carries
that error's `public` on.
"""

from __future__ import annotations

from typing import Any, Literal

# The end of a public text that withholds the detail: where the machine's owner finds it.
OWNER_SEES = ("the server's owner can see why with `blazar why` and this request's trace id (its x-blazar-trace-id "
              "header)")


class BlazarError(Exception):
    """The root: a stable `code` and the HTTP status a request that meets it gets (a class's own, or an instance's
    where the refusal decides it). `error_type` is a dialect's own kind when the status alone does not say it;
    `headers` go on the response (WWW-Authenticate); `retry_after_s` becomes Retry-After."""

    code: str = "internal_error"
    http_status: int = 500
    exit_code: int = 1
    error_type: str | None = None
    retry_after_s: float | None = None
    # What a key that is not an admin's is told of every error of the class (None: the message, paths taken out).
    PUBLIC: str | None = None

    def __init__(self, message: str, *, public: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.public = public if public is not None else type(self).PUBLIC
        self.headers: dict[str, str] = {}


def exit_code_of(code: str) -> int:
    """The CLI's exit code for an error's stable code (a daemon's answer carries only the code)."""
    todo: list[type[BlazarError]] = [BlazarError]
    while todo:
        cls = todo.pop()
        if cls.__dict__.get("code") == code:
            return cls.exit_code
        todo.extend(cls.__subclasses__())
    return 1


def http_status(exc: BlazarError) -> tuple[int, str]:
    """The status and stable code a request that met `exc` is answered with."""
    return exc.http_status, exc.code


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


class EventTooLarge(LogError):
    """An event whose payload encodes to more than the log takes (`event_max_kib`): raised where it is appended, so
    the code that built it is named in the traceback; nothing of it is written. A client-supplied list or string that
    reaches an event unbounded is the bug this catches."""

    code = "event_too_large"

    def __init__(self, type_name: str, size: int, limit: int) -> None:
        super().__init__(f"a {type_name!r} event of {size} bytes is over the log's bound of {limit} bytes "
                         f"(log.event_max_kib): the code that built it must bound what it carries")
        self.type_name, self.size, self.limit = type_name, size, limit


class EventFieldTooLarge(EventTooLarge):
    """A new event with a field whose JSON text is over the field's bound (blazar/events/bounds.py): refused where
    it is appended, naming the field, so what carried an unbounded value into it is found."""

    def __init__(self, type_name: str, field: str, size: int, limit: int) -> None:
        LogError.__init__(self, f"the {field!r} of a {type_name!r} event takes {size} bytes, over its bound of "
                                f"{limit} (blazar/events/bounds.py): the code that built it must bound what it carries")
        self.type_name, self.size, self.limit, self.field = type_name, size, limit, field


class AppendOnlyViolation(LogError):
    code = "append_only"


class LogUnreachable(LogError):
    """The log's database cannot be reached (PostgreSQL down or the network gone): requests to loaded models go on
    (their events wait in memory), but nothing that must be durable first can be done."""

    code = "log_unavailable"
    http_status = 503


class InvalidLogLocation(LogError):
    """Where the log lives cannot be read: a URL with an unknown scheme, a bad port or host (from database_url,
    BLAZAR_DATABASE_URL or a command's argument). Never taken for a file path instead."""

    code = "invalid_log_location"
    http_status = 400
    exit_code = 2


class SchemaOutOfDate(LogError):
    code = "schema_out_of_date"


class ArchiveError(LogError):
    code = "archive_error"
    exit_code = 5


class ArchiveBusy(ArchiveError):
    code = "archive_busy"
    http_status = 409


class SegmentMissing(ArchiveError):
    code = "segment_missing"

    def __init__(self, name: str, first_seq: int, last_seq: int, detail: str = "") -> None:
        extra = f" ({detail})" if detail else ""
        super().__init__(f"archive segment {name} (seq {first_seq}..{last_seq}) is missing{extra}")
        self.name = name


class SegmentBroken(ArchiveError):
    code = "segment_broken"

    def __init__(self, name: str, line: int | None, detail: str) -> None:
        where = f" line {line}" if line is not None else ""
        super().__init__(f"archive segment {name}{where}: {detail}")
        self.name = name
        self.line = line


class ProjectionError(BlazarError):
    code = "projection_halted"

    def __init__(self, name: str, seq: int, detail: str) -> None:
        super().__init__(f"projection {name!r} halted at seq {seq}: {detail}")
        self.name = name
        self.seq = seq


class ConfigError(BlazarError):
    code = "invalid_config"
    http_status = 400
    exit_code = 2


class SnapshotError(BlazarError):
    code = "snapshot_refused"
    exit_code = 3


class DiskFull(BlazarError):
    """No space left on the filesystem Blazar was writing to: `mount` is where it is mounted, `free_bytes` what it has,
    `needed_bytes` what the write needs free there, `writing` what was being written (blazar/diskspace.py makes
    these, from ENOSPC, SQLite's SQLITE_FULL, or its I/O errors on a disk with no room)."""

    code = "disk_full"
    http_status = 507
    exit_code = 12
    PUBLIC = "the server has no disk space left for this; try again later (its owner is told which disk is full)"

    def __init__(self, message: str, *, mount: str, free_bytes: int, needed_bytes: int, writing: str) -> None:
        super().__init__(message)
        self.mount = mount
        self.free_bytes = free_bytes
        self.needed_bytes = needed_bytes
        self.writing = writing


class OutsideHome(BlazarError):
    """A path an event names resolves outside the home's directory for its kind of file: nothing is opened, run or
    removed there (blazar/confine.py)."""

    code = "path_outside_home"
    http_status = 409
    PUBLIC = ("refused: the server's log names a file outside its home; its owner can see which with "
              "`blazar doctor`")


class DaemonRunning(BlazarError):
    code = "daemon_running"
    exit_code = 4


class ModelFileError(BlazarError):
    code = "invalid_model_file"
    http_status = 422
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
    http_status = 404


class ModelExists(ModelError):
    code = "model_exists"
    http_status = 409


class ModelInUse(ModelError):
    """The model has a running instance: stop it first."""

    code = "model_in_use"
    http_status = 409


class InvalidModelName(ModelError):
    code = "invalid_model_name"
    http_status = 400


class WrongModelKind(ModelError):
    """A request for a route the model's kind does not serve (a chat to a whisper model): the message names the model,
    its kind and the routes it does serve. Raised before any load."""

    code = "model_kind_mismatch"
    http_status = 400


class InvalidModelSettings(ModelError):
    """A model setting (`blazar model set`, Ollama's /api/create) that cannot be served: says what is accepted."""

    code = "invalid_model_settings"
    http_status = 400


class ForeignStoreError(ModelError):
    """`blazar import --from TOOL`: the other tool's store cannot be read (no such directory, no reader for the tool,
    an `--only` name it does not hold)."""

    code = "foreign_store"
    http_status = 400


# Why a pull failed (`model.pull_failed`): each HubError says which.
PullFailReason = Literal["cancelled", "checksum_mismatch", "not_found", "network", "invalid_file", "error"]


class HubError(BlazarError):
    """A pull failed. `reason` is the `ModelPullFailed.reason` it maps to; `partial_bytes` what is kept to resume."""

    code = "hub_error"
    http_status = 502
    reason: PullFailReason = "error"

    def __init__(self, message: str, *, repo: str | None = None, filename: str | None = None,
                 partial_bytes: int = 0) -> None:
        super().__init__(message)
        self.repo = repo
        self.filename = filename
        self.partial_bytes = partial_bytes


class NotFoundOnHub(HubError):
    code = "not_found_on_hub"
    http_status = 404
    reason = "not_found"


class HubAccessDenied(HubError):
    code = "hub_access_denied"
    http_status = 403


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
    http_status = 502
    reason = "network"


class EngineError(BlazarError):
    code = "engine_error"
    http_status = 503


class EngineIncompatible(EngineError):
    """The binary's --help does not list a flag, or a value of it, that the instance needs."""

    code = "engine_incompatible"
    http_status = 503

    def __init__(self, flag: str, detail: str) -> None:
        super().__init__(f"this llama-server has no {flag}: {detail}")
        self.flag = flag


class NoEngine(EngineError):
    code = "no_engine"
    http_status = 503
    exit_code = 6

    def __init__(self) -> None:
        super().__init__("no engine is active: build one for this machine with `blazar engine build`, or bring "
                         "your own llama-server with `blazar engine install --path BIN`")


class EngineExtraMissing(EngineError):
    """A whisper or piper model's runtime is a Python extra that is not installed here: the message names the pip
    command that installs it."""

    code = "engine_extra_missing"
    http_status = 503
    exit_code = 6


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
    PUBLIC = ("the server's engine failed its check before start, so nothing was loaded; its owner can see which "
              "files differ with `blazar engine verify`")

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


class EngineIndexError(EngineError):
    """`engine update`: the package index cannot be read, lists no usable sdist, or a download does not match the
    sha256 it gives."""

    code = "engine_index_error"
    exit_code = 7


class ModelNotLoaded(ModelError):
    code = "model_not_loaded"
    http_status = 404
    exit_code = 9


class DoesNotFit(EngineError):
    code = "insufficient_memory"
    http_status = 507
    exit_code = 6


class ModelPinned(DoesNotFit):
    """A load that would replace a pinned instance of the model: the pin stands (409, not a memory shortage)."""

    code = "model_pinned"
    http_status = 409


class VictimsBusy(DoesNotFit):
    """A request's load that only evicting busy instances makes room for: the swap order (serving/swaps.py) waits
    for them to drain and asks again; met by a caller that did not ask to wait, it is the refusal it stands for."""

    code = "no_room"
    http_status = 503

    def __init__(self, message: str, *, victims: tuple[str, ...], models: tuple[str, ...]) -> None:
        super().__init__(message)
        self.victims = victims  # the busy instances' ids
        self.models = models  # their models


class CircuitOpen(EngineError):
    code = "circuit_open"
    http_status = 503
    exit_code = 10


class LoadFailed(EngineError):
    code = "load_failed"
    http_status = 502
    exit_code = 11


class ProcessExited(EngineError):
    """The engine exited while we waited for it to turn healthy."""

    code = "engine_exited"
    http_status = 502

    def __init__(self, exit_code: int | None, *, pid: int | None = None, detail: str = "") -> None:
        who = f"the engine (pid {pid})" if pid is not None else "the engine"
        super().__init__(f"{who} {detail or 'exited'} before it was healthy")
        self.returncode = exit_code  # the child's (`exit_code` is the CLI's, as for every error)
        self.pid = pid


class LoadTimeout(EngineError):
    """The engine did not answer /health with 200 within the time allowed."""

    code = "engine_load_timeout"
    http_status = 504

    def __init__(self, waited_s: float, *, pid: int | None = None) -> None:
        who = f"the engine (pid {pid})" if pid is not None else "the engine"
        super().__init__(f"{who} was not healthy after {waited_s:.1f}s")
        self.waited_s = waited_s
        self.pid = pid


class EngineStreamBroken(EngineError):
    """An engine's answer broke off mid-body (the connection dropped, or it ended short)."""

    code = "engine_crashed"
    http_status = 502


class EngineUnreachable(EngineError):
    """A child's port did not answer (refused, reset, timed out)."""

    code = "engine_unreachable"
    http_status = 502
    PUBLIC = f"the model's engine did not answer; try again ({OWNER_SEES})"


class TemplateProbeFailed(EngineError):
    """A template probe's prompt got no answer as llama-server's /completion gives one (blazar/instances/
    template_probe.py): the load goes on with the first candidate, and the next load probes again."""

    code = "template_probe_failed"
    http_status = 502


class SynthesisFailed(EngineError):
    """The piper child answered /synthesize with an error (text with nothing to speak) or not with 16-bit WAV."""

    code = "synthesis_failed"
    http_status = 502
    PUBLIC = f"the voice's engine could not speak this text ({OWNER_SEES})"


class EngineGone(EngineUnreachable):
    """The request's engine child had exited before it took the request: the gateway routes the request again
    (once), so a client never sees this one."""

    code = "engine_gone"


class SwapRecalled(EngineGone):
    """A request served ahead of a swap whose hold ran out before it took a slot: the gateway routes it again,
    behind the swap (blazar/serving/swaps.py), so a client never sees this one."""

    code = "swap_recalled"


class ShortRead(BlazarError):
    """Internal to GGUF parsing: the bytes end before `needed` (the caller fetches more, or reports incomplete)."""

    code = "header_short_read"

    def __init__(self, needed: int) -> None:
        super().__init__(f"the header needs at least {needed} bytes")
        self.needed = needed


class SearchBudgetSpent(BlazarError):
    """Internal to `blazar search` (blazar/queries/hub_search.py): the search's budget of header bytes or of time ran
    out before this header was read; its row says so, the search goes on."""

    code = "search_budget_spent"


class PortInUse(BlazarError):
    code = "port_in_use"
    exit_code = 8


class UnsafeBind(BlazarError):
    """A bind wider than loopback with no key: anyone on the network could use (and manage) every model."""

    code = "unsafe_bind"
    exit_code = 9


class UnsafeNodeUrl(UnsafeBind):
    """A node URL other than loopback that is not https: forwarding would send the cluster key in clear."""

    code = "unsafe_node_url"


class DaemonUnavailable(BlazarError):
    code = "daemon_unavailable"


class ServiceError(BlazarError):
    """`blazar service` cannot do what it was asked here: a system unit without root, a platform with neither
    systemd nor launchd, a path a unit file cannot hold."""

    code = "service_error"
    exit_code = 2


class RemoteError(BlazarError):
    """The daemon answered with an error: `code` is its stable code (model_not_loaded, circuit_open, ...)."""

    def __init__(self, message: str, *, code: str, status: int) -> None:
        super().__init__(message)
        self.code = code
        self.http_status = status
        self.exit_code = exit_code_of(code)  # as the command would exit had it run in this process


class TraceNotFound(BlazarError):
    code = "trace_not_found"
    http_status = 404
    exit_code = 2


class KeyCommandError(BlazarError):
    code = "invalid_key_command"
    http_status = 400
    exit_code = 2


class FileTooLarge(BlazarError):
    """An upload to /v1/files over `files_max_bytes`."""

    code = "invalid_request"
    http_status = 413


class AudioError(BlazarError):
    """An upload to a speech route that cannot be served as audio: a 400 invalid_request_error in OpenAI's shape."""

    code = "invalid_audio"
    http_status = 400


class NotAudio(AudioError):
    """FFmpeg's demuxers cannot read the bytes as audio, or they hold no sound."""

    code = "not_audio"


class AudioTooLong(AudioError):
    """Audio longer than the duration limit (the message names both)."""

    code = "audio_too_long"


class AudioFormatError(AudioError):
    """A realtime session's audio format the protocol does not name, or audio bytes that do not fit the session's
    format (not base64, not whole samples, over the bound of a message)."""

    code = "invalid_audio_format"


class ChildRefused(BlazarError):
    """A request one of Blazar's own children (blazar/children/) answers with an OpenAI error: the status (400,
    401, 404, 411, 413, 503), the form field at fault and OpenAI's error type are the instance's."""

    code = "invalid_request"
    http_status = 400

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 error_type: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.http_status, self.param, self.error_type = status, param, error_type
        self.code = code or "invalid_request"


class BatchConflict(BlazarError):
    """A change a batch's status does not allow (cancelling one that is done)."""

    code = "invalid_request"
    http_status = 409


class DialectError(BlazarError):
    """A request a dialect cannot serve as written (a bad role, a schema it cannot follow): a 400 in the caller's
    own shape. `code` says which rule it broke."""

    code = "invalid_request"
    http_status = 400

    def __init__(self, message: str, *, code: str = "invalid_request") -> None:
        super().__init__(message)
        self.code = code


class GrammarUnsupported(DialectError):
    """The schema asserts something Blazar's compact grammar cannot express (blazar/dialects/grammar.py): `keyword`
    names it. Never a refusal: the caller sends the schema for the engine's own conversion instead."""

    code = "grammar_unsupported"
    http_status = 400

    def __init__(self, keyword: str, detail: str = "") -> None:
        self.keyword = keyword
        self.detail = detail
        super().__init__(f"{keyword}: {detail}" if detail else f"{keyword}: not supported by the compact grammar",
                         code="grammar_unsupported")


class TemplateNotConvertible(DialectError):
    """An Ollama chat template (Go's text/template) that blazar/dialects/go_template.py does not turn into Jinja:
    `reason` says what it uses (tools, a function, a construct), in words for `blazar import`'s table."""

    code = "template_not_convertible"
    http_status = 400

    def __init__(self, reason: str) -> None:
        super().__init__(reason, code=self.code)
        self.reason = reason


class RemoteCommandError(BlazarError):
    code = "invalid_remote"
    http_status = 400


class RealtimeProfileError(BlazarError):
    """`blazar realtime set|rm` refused, or a realtime session's `model` that names no profile, no chat model, or one
    whose speech models are not in the store."""

    code = "invalid_realtime_profile"
    http_status = 400


class RealtimeEventInvalid(DialectError):
    """A realtime client event with a field that does not validate: `param` names the first wrong one. The session
    answers with an `error` event and goes on."""

    code = "invalid_value"

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param


class RealtimeToolHosted(RealtimeEventInvalid):
    """A realtime session asked for a tool only OpenAI's servers run (an MCP server they reach): told by name, and
    the session goes on."""

    code = "hosted_tool_not_supported"


class RealtimeChatRefused(BlazarError):
    """A realtime response's chat refused or failed (a limit, the scope, the engine): its words, and the code of the
    `error` event that tells it (the refusal's own code)."""

    code = "realtime_chat_refused"
    http_status = 400

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


class RealtimeSpeechRefused(BlazarError):
    """A realtime response's speech (its internal /v1/audio/speech request) refused or failed (a limit such as
    daily_audio_s, the scope, the voice's child): its words, and the code of the `error` event that tells it."""

    code = "realtime_speech_refused"
    http_status = 400

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


class RealtimeHearRefused(RealtimeChatRefused):
    """A realtime turn's transcription refused or failed (a limit such as daily_audio_s, the scope, the whisper
    child): its words and code, told as an `error` event and the item's `transcription.failed`."""

    code = "realtime_hear_refused"


class WorkerError(BlazarError):
    code = "worker_error"
    http_status = 400


class NodeError(BlazarError):
    """Another node could not do what it was asked (it is unknown, down, unreachable, or refused)."""

    code = "node_error"
    http_status = 502


class SessionError(BlazarError):
    """A session command that cannot be carried out."""

    code = "session_error"
    http_status = 409


class SessionNotFound(SessionError):
    code = "session_not_found"
    http_status = 404


class SessionUnavailable(SessionError):
    code = "session_unavailable"
    http_status = 409


class Refused(BlazarError):
    """A request refused before any token, as a decision: `reason` (its stable code), `retry_after_s` where waiting
    helps, and the `observations` the decision relied on (recorded with `request.rejected`)."""

    code = "refused"
    http_status = 503

    def __init__(self, message: str, *, reason: str | None = None, http_status: int | None = None,
                 retry_after_s: float | None = None, observations: dict[str, Any] | None = None,
                 error_type: str | None = None, public: str | None = None) -> None:
        super().__init__(message, public=public)
        if reason is not None:
            self.code = reason
        if http_status is not None:
            self.http_status = http_status
        if error_type is not None:
            self.error_type = error_type
        self.retry_after_s = retry_after_s
        self.observations = dict(observations or {})

    @property
    def reason(self) -> str:
        return self.code


class AdmissionRefused(Refused):
    """Admission said no: the queue is full, the wait ran out, or the global cap is reached."""


class QueueFull(AdmissionRefused):
    code = "queue_full"
    http_status = 429


class QueueTimeout(AdmissionRefused):
    code = "queue_timeout"
    http_status = 503


class GlobalCap(AdmissionRefused):
    code = "global_cap"
    http_status = 429


class DeadlineUnmeetable(AdmissionRefused):
    code = "deadline_unmeetable"
    http_status = 503


class LimitExceeded(Refused):
    """A key's rpm, tpm, daily tokens or concurrency: `limit` is which, `value` its setting."""

    code = "rate_limit_exceeded"
    http_status = 429

    def __init__(self, message: str, *, limit: str, value: int, retry_after_s: float) -> None:
        super().__init__(message, retry_after_s=retry_after_s, observations={"limit": limit, "value": value})
        self.limit = limit
        self.value = value


class AuthRefused(Refused):
    """No key, a wrong key (401), or a key without the right (403)."""

    code = "invalid_api_key"
    http_status = 401
    error_type = "authentication_error"


class Unauthenticated(AuthRefused):
    code = "invalid_api_key"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.headers = {"WWW-Authenticate": "Bearer"}


class Forbidden(AuthRefused):
    code = "admin_key_required"
    http_status = 403
    error_type = "permission_error"


class EdgeRefused(Refused):
    """The edge's guard: a Host not allowed, a foreign Origin (403), a body that is not JSON (415)."""

    def __init__(self, message: str, *, status: int, code: str) -> None:
        super().__init__(message, reason=code, http_status=status,
                         error_type="permission_error" if status == 403 else "invalid_request_error")
