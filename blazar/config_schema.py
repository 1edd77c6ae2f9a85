"""The settings schema: every configuration key, in sections (a section is a TOML table of config.toml), with its
type, range, default and what it means. Parsing, the old flat names and the file itself are blazar/config.py's.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from blazar.durations import parse_duration
from blazar.errors import InvalidLogLocation
from blazar.events.location import PostgresUrl

_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}")
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
MAX_PRELOAD = 16  # engine.preload's most models: each is a load at start


def host_names(v: list[str]) -> list[str]:
    """Host names or origins, stripped; refuses empty ones, whitespace and control characters."""
    out = []
    for item in v:
        item = item.strip()
        if not item or len(item) > 253 or any(c.isspace() or ord(c) < 32 for c in item):
            raise ValueError(f"not a host name or origin: {item!r}")
        out.append(item)
    return out


class Section(BaseModel):
    """One [table] of config.toml. Unknown keys are refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Server(Section):
    """[server] How `blazar serve` listens: address, TLS, connections, request bodies, streams."""

    host: str = Field(
        default="127.0.0.1",
        description="Address `blazar serve` binds (wider than loopback: on purpose only).",
    )
    port: int = Field(default=11435, ge=1, le=65535, description="Port `blazar serve` listens on.")
    allowed_hosts: list[str] = Field(
        default_factory=list,
        description="Host names served besides localhost, 127.0.0.1 and [::1] (others get 403: DNS rebinding).",
    )
    cors_origins: list[str] = Field(
        default_factory=list,
        description="Web origins (https://app.example) allowed to call from a browser; '*' only once keys exist.",
    )
    tls_cert: str = Field(default="", description="PEM certificate file for https (with tls_key; both or neither).")
    tls_key: str = Field(default="", description="PEM private key file for https (with tls_cert; both or neither).")
    idle_timeout_s: float = Field(
        default=30.0, ge=1.0, le=3600.0,
        description="Seconds a client connection may sit idle, or take to send its headers, before it is closed.",
    )
    max_connections: int = Field(
        default=8192, ge=64, le=1_000_000,
        description="Client connections served at once (more wait in the listen backlog).",
    )
    backlog: int = Field(default=2048, ge=128, le=65535, description="The listen backlog of `blazar serve`'s socket.")
    body_idle_timeout_s: float = Field(
        default=5.0, ge=0.1, le=3600.0,
        description="Seconds a request body may pause between bytes before the request gets 408 and its connection "
                    "is closed.",
    )
    body_timeout_s: float = Field(
        default=60.0, ge=1.0, le=3600.0,
        description="Seconds a request body may take to arrive whole (from the end of its headers), else 408 and "
                    "the connection is closed.",
    )
    max_incoming_bodies: int = Field(
        default=1024, ge=1, le=1_000_000,
        description="Requests whose body is still arriving, at once; more get 503 at once (at most half of "
                    "max_connections is used, so slow bodies never hold every connection).",
    )
    max_body_mib: int = Field(
        default=32, ge=1, le=1024,
        description="The largest request body accepted, in MiB (else 413).",
    )
    stream_heartbeat_s: float = Field(
        default=15.0, ge=0.05, le=3600.0,
        description="Seconds a streamed answer may stay silent before the client gets a heartbeat in its dialect "
                    "(while the engine reads a long prompt): clients and proxies drop a stream silent for long.",
    )

    @field_validator("allowed_hosts", "cors_origins")
    @classmethod
    def _names(cls, v: list[str]) -> list[str]:
        return host_names(v)

    @field_validator("cors_origins")
    @classmethod
    def _origins(cls, v: list[str]) -> list[str]:
        for item in v:
            if item != "*" and not item.startswith(("http://", "https://")):
                raise ValueError(f"an origin is scheme://host[:port], like https://app.example: {item!r}")
        return v


class Log(Section):
    """[log] The event log: where it lives, how it batches and checkpoints, how large an event may be."""

    database_url: str = Field(
        default="",
        description="The log on PostgreSQL: postgresql+asyncpg://USER@HOST:PORT/DB (empty: the embedded SQLite file). "
                    "Read at start, before the log opens; BLAZAR_DATABASE_URL wins over it. A password goes in "
                    "PGPASSWORD or ~/.pgpass, never here (this file's changes are recorded in the log).",
    )
    checkpoint_every: int = Field(
        default=10_000, ge=100, le=10_000_000, description="Write projection checkpoints after this many new events."
    )
    group_commit_ms: float = Field(
        default=5.0, ge=0.5, le=1000.0, description="How long the group-commit writer gathers request events per batch."
    )
    event_max_kib: int = Field(
        default=64, ge=64, le=16384,
        description="The most one event's payload may encode to, in KiB: a bigger one is refused where it is built "
                    "(read at start). Every event's largest legal payload fits in 64.",
    )

    @field_validator("database_url")
    @classmethod
    def _database_url(cls, v: str) -> str:
        v = v.strip()
        if not v:
            return v
        try:
            PostgresUrl.parse(v)
        except InvalidLogLocation as e:
            raise ValueError(f"{e.message}, or empty for the embedded SQLite log") from None
        creds = urlsplit(v).password
        if creds:
            raise ValueError("the URL holds a password: put it in PGPASSWORD or ~/.pgpass (or the whole URL in "
                             "BLAZAR_DATABASE_URL), since every change to this file is recorded in the log")
        return v


class Retention(Section):
    """[retention] How long things stay: request traces in the live log, archive segments, stored responses."""

    request_retention: str = Field(
        default="30d",
        description="How long request traces and node heartbeats stay in the live log before they move into archive "
                    "segments: 30d, 12h, 3600; 0: keep everything live (nothing is archived).",
    )
    archive_dir: str = Field(
        default="",
        description="Where archive segments go (empty: the home's archive/ directory; BLAZAR_ARCHIVE_DIR wins). An "
                    "absolute path. Local to this home: on a shared PostgreSQL log, every node that reads archived "
                    "events needs the same directory (shared storage).",
    )
    archive_every_s: float = Field(
        default=3600.0, ge=10.0, le=7 * 86400.0,
        description="Seconds between the daemon's archive runs (off the request path; each run is recorded).",
    )
    log_disk_share: float = Field(
        default=0.25, gt=0.0, le=1.0,
        description="`blazar doctor` warns when the live log or the archive takes more than this share of its disk.",
    )
    responses_retention_s: float = Field(
        default=30 * 86400.0, ge=60.0, le=10 * 31_536_000.0,
        description="Seconds a stored Response (/v1/responses with store: true) is kept; older ones are deleted.",
    )

    @field_validator("request_retention")
    @classmethod
    def _request_retention(cls, v: str) -> str:
        if parse_duration(v) < 0:
            raise ValueError("a retention is 0 (keep everything) or a positive duration such as 30d")
        return v.strip()

    @field_validator("archive_dir")
    @classmethod
    def _archive_dir(cls, v: str) -> str:
        v = v.strip()
        if v and not Path(v).expanduser().is_absolute():
            raise ValueError(f"archive_dir must be an absolute path, not {v!r}")
        return v

    def retention_s(self) -> float:
        """request_retention in seconds; 0 keeps everything live."""
        return parse_duration(self.request_retention)


class Telemetry(Section):
    """[telemetry] What Blazar says about itself: its diagnostic log, audit output, OTLP spans and metrics."""

    log_level: Literal["debug", "info", "warning", "error"] = Field(
        default="warning", description="Level of Blazar's own diagnostic logging (stderr and log/blazar.log)."
    )
    pii_scrub: bool = Field(
        default=True, description="Pseudonymise user names in audit output (content is never included either way)."
    )
    otlp_endpoint: str = Field(
        default="",
        description="OTLP/HTTP collector URL that request spans are exported to (empty: off; /v1/traces added to a "
                    "bare host).",
    )
    otlp_headers: dict[str, str] = Field(
        default_factory=dict,
        description="Headers sent with each OTLP export, name=value (recorded in the log: put secrets in "
                    "OTEL_EXPORTER_OTLP_HEADERS).",
    )

    otlp_metrics: bool = Field(
        default=True,
        description="Export /metrics' families over OTLP too, beside the spans, to the same collector (/v1/metrics).",
    )
    otlp_metrics_interval_s: float = Field(
        default=60.0, ge=0.1, le=86400.0, description="Seconds between two OTLP metrics exports.",
    )

    @field_validator("otlp_endpoint")
    @classmethod
    def _otlp_endpoint(cls, v: str) -> str:
        v = v.strip()
        if v:
            url = urlsplit(v)
            if url.scheme not in ("http", "https") or not url.hostname or url.query or url.fragment:
                raise ValueError(f"an OTLP/HTTP endpoint is http(s)://host[:port][/path], like "
                                 f"http://127.0.0.1:4318: {v!r}")
        return v

    @field_validator("otlp_headers")
    @classmethod
    def _otlp_headers(cls, v: dict[str, str]) -> dict[str, str]:
        for name, value in v.items():
            if not _HEADER_NAME.fullmatch(name) or any(c in value for c in "\r\n\0"):
                raise ValueError(f"not an HTTP header (a token name, a value on one line): {name!r}")
        return {name.strip(): value.strip() for name, value in v.items()}


class Fit(Section):
    """[fit] What a new instance is planned with: context, slots, memory, how many are loaded."""

    ctx: int = Field(
        default=8192, ge=0, le=1 << 22,
        description="Context tokens per slot for a new instance (0: the largest that fits, up to training ctx).",
    )
    slots: int = Field(
        default=0, ge=0, le=256, description="Parallel slots (-np) per instance (0: the most that fit, up to 4)."
    )
    memory_limit_mib: int = Field(
        default=0, ge=0, description="MiB that loaded instances may use in all (0: what the machine has free)."
    )
    max_loaded_models: int = Field(
        default=0, ge=0, le=64, description="Most instances loaded at once (0: no count limit; memory decides)."
    )
    adaptive_slots: bool = Field(
        default=False,
        description="Slots that follow the load: an instance whose queue stays full is relaunched with more slots "
                    "(when the fit plans them), and shrinks back once its queue stays empty.",
    )
    adaptive_slots_max: int = Field(
        default=8, ge=1, le=256, description="Most slots (-np) adaptive slots grows an instance to.",
    )
    adaptive_tick_s: float = Field(
        default=10.0, ge=0.01, le=3600.0,
        description="Seconds between the adaptive slots governor's looks at the queues.",
    )
    adaptive_grow_after: int = Field(
        default=6, ge=1, le=100_000,
        description="Looks in a row with every slot busy and requests queued before an instance grows.",
    )
    adaptive_shrink_after: int = Field(
        default=30, ge=1, le=100_000,
        description="Looks in a row with an empty queue and no more busy than its first shape's slots before it "
                    "shrinks back.",
    )
    adaptive_drain_s: float = Field(
        default=30.0, ge=0.1, le=3600.0,
        description="Seconds a reshape waits for the requests in flight to end (never cut) before it gives up.",
    )

    @property
    def ctx_chosen(self) -> bool:
        """The owner set `fit.ctx` (config.toml or `config set`): a prompt over it is not met by a larger context."""
        return "ctx" in self.model_fields_set



class Engine(Section):
    """[engine] Engine children: how they load, run, stop and crash, how long they stay, and the engine gate."""

    keep_alive: str = Field(
        default="5m",
        description="How long a model stays loaded after its last use: 300, 45s, 5m, 1h30m; negative: forever.",
    )
    engine_threads: int = Field(
        default=0, ge=0, le=1024,
        description="Threads per engine child (0: the engine's default).",
    )
    load_mode: Literal["auto", "mmap", "mlock", "mmap+mlock", "none"] = Field(
        default="auto",
        description="How engines load weights: auto (the engine's choice, mmap), mlock keeps them in RAM.",
    )
    load_timeout_s: float = Field(
        default=180.0, ge=1.0, le=7200.0, description="Seconds a model may take to load before the child is killed."
    )
    stop_grace_s: float = Field(
        default=10.0, ge=0.0, le=600.0, description="Seconds between SIGTERM and SIGKILL when stopping an engine child."
    )
    crash_limit: int = Field(
        default=3, ge=1, le=100,
        description="Crashes within crash_window_s that open a model's circuit.",
    )
    crash_window_s: float = Field(default=60.0, ge=1.0, le=86400.0, description="The window crash_limit counts in.")
    circuit_open_s: float = Field(
        default=300.0, ge=1.0, le=86400.0,
        description="How long an open circuit refuses loads (or until `blazar ps --reset`).",
    )
    engine_gate: bool = Field(
        default=True,
        description="Measure a new engine build against the active one before activating it, and refuse one that "
                    "decodes slower by more than engine_gate_threshold (`--force` activates it anyway).",
    )
    engine_gate_threshold: float = Field(
        default=0.05, ge=0.0, le=0.9,
        description="How much slower (a fraction of the active build's decode tokens/s) a new engine build may be.",
    )
    engine_gate_models: list[str] = Field(
        default_factory=list,
        description="Models the engine gate measures (at most 2; empty: the pinned or keep-alive-forever ones "
                    "loaded, else the most requested).",
    )

    preload: list[str] = Field(
        default_factory=list,
        description=f"Models loaded when the daemon starts, in this order (at most {MAX_PRELOAD}), within the memory "
                    "plan: a preload never evicts another model, so one that would is not loaded (an event says so).",
    )

    @field_validator("keep_alive")
    @classmethod
    def _keep_alive(cls, v: str) -> str:
        parse_duration(v)
        return v.strip()

    @field_validator("engine_gate_models")
    @classmethod
    def _gate_models(cls, v: list[str]) -> list[str]:
        names = [m.strip() for m in v if m.strip()]
        if len(names) > 2:
            raise ValueError("the engine gate measures at most 2 models")
        return names

    @field_validator("preload")
    @classmethod
    def _preload(cls, v: list[str]) -> list[str]:
        names = [m.strip() for m in v if m.strip()]
        if len(names) > MAX_PRELOAD:
            raise ValueError(f"at most {MAX_PRELOAD} models are preloaded")
        for name in names:
            if len(name) > 256 or any(c.isspace() or ord(c) < 32 for c in name):
                raise ValueError(f"not a model name: {name!r}")
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"named twice: {', '.join(twice)}")
        return names


class Queue(Section):
    """[queue] Admission: how many requests wait, for how long, and how many run at once."""

    queue_depth: int = Field(
        default=64, ge=0, le=100_000,
        description="Requests that may wait per model for a slot; more get 429 with Retry-After.",
    )
    queue_timeout_s: float = Field(
        default=120.0, ge=0.1, le=3600.0, description="Seconds a request may wait for a slot before a 503."
    )
    max_concurrent_requests: int = Field(
        default=0, ge=0, le=100_000,
        description="Requests in flight across all models at once (0: only the slots limit).",
    )
    fair_share: bool = Field(
        default=True,
        description="Within a priority, serve each key (the keyless caller as one) its weighted share of a model's "
                    "slots, charged in tokens (keys' --weight); false: by arrival, whoever sends.",
    )
    swap_hold_s: float = Field(
        default=10.0, ge=0.0, le=3600.0,
        description="With more models wanted than fit: how long requests for a loaded model may still be served ahead "
                    "of a swap that would evict it, from the swap's turn (0: strict order).",
    )
    batch_concurrency: int = Field(
        default=1, ge=1, le=64,
        description="Batch lines in flight at once across every batch (each holds a slot while it runs; they queue "
                    "behind every interactive request).",
    )



class Inputs(Section):
    """[inputs] What one request may carry: files, images, audio, speech text, output tokens."""

    files_max_bytes: int = Field(
        default=100 << 20, ge=1, le=1 << 40,
        description="The largest file /v1/files accepts, in bytes (else 413); it is written to disk as it arrives.",
    )
    image_max_count: int = Field(
        default=8, ge=0, le=256,
        description="Images (and audio parts) one chat request may carry (0: none; more is a 400).",
    )
    image_max_mib: int = Field(
        default=20, ge=1, le=1024,
        description="MiB of image and audio bytes (decoded) one chat request may carry in all (more is a 400).",
    )
    image_max_megapixels: int = Field(
        default=33, ge=1, le=1000,
        description="Megapixels of images one chat request may carry in all (more is a 400; bombs never decoded).",
    )
    image_fetch: bool = Field(
        default=False,
        description="Fetch http(s) image URLs in chat requests (off: such a URL is a 400; data: URLs always work). "
                    "Never to private, loopback or link-local addresses unless image_fetch_allow_hosts names the host.",
    )
    image_fetch_timeout_s: float = Field(
        default=10.0, ge=0.5, le=300.0, description="Seconds one image fetch may take, redirects included.",
    )
    image_fetch_allow_hosts: list[str] = Field(
        default_factory=list,
        description="Hosts (exact names or addresses) image_fetch may reach even at non-global addresses (a test or "
                    "intranet server); others must resolve only to global addresses.",
    )
    max_audio_mib: int = Field(
        default=25, ge=1, le=1024,
        description="The largest audio file /v1/audio/transcriptions and /translations accept, in MiB (else 413); "
                    "it is written to a temporary file under the home as it arrives.",
    )
    max_audio_s: float = Field(
        default=3600.0, ge=1.0, le=86400.0,
        description="The longest audio, in seconds, a transcription or translation accepts (else 400).",
    )
    max_speech_chars: int = Field(
        default=4096, ge=1, le=1_000_000,
        description="The longest text /v1/audio/speech speaks, in characters (else 400).",
    )
    realtime_max_message_kib: int = Field(
        default=1024, ge=1, le=1 << 20,
        description="The largest event a /v1/realtime client may send, in KiB (else an error event and the socket "
                    "closed with 1009).",
    )
    realtime_max_items: int = Field(
        default=256, ge=1, le=100_000,
        description="Items one realtime conversation may hold (more is an error event: delete some first).",
    )
    realtime_max_output_tokens: int = Field(
        default=4096, ge=1, le=1 << 20,
        description="The most tokens one realtime response may generate (a session's or response's "
                    "max_output_tokens is capped at it; \"inf\" means this).",
    )
    realtime_max_tools: int = Field(
        default=128, ge=1, le=4096,
        description="Function tools one realtime session or response may offer the model (more is an error event).",
    )
    realtime_idle_s: float = Field(
        default=300.0, ge=1.0, le=86400.0,
        description="Seconds a realtime session may go without a client event before it is closed (1001).",
    )
    realtime_max_session_s: float = Field(
        default=1800.0, ge=1.0, le=86400.0,
        description="Seconds a realtime session may last: past it, an error event (session_expired), the running "
                    "response cancelled, and the socket closed (1001).",
    )
    realtime_max_buffer_s: float = Field(
        default=60.0, ge=1.0, le=3600.0,
        description="Seconds of audio a realtime session's input buffer may hold uncommitted (an append past it is "
                    "refused with an error event and not kept; commit or clear).",
    )
    max_tokens_over_context: Literal["bound", "refuse"] = Field(
        default="bound",
        description="When a prompt fits the context but prompt + max_tokens does not: bound (the output is capped "
                    "at what the context leaves, and the answer says so) or refuse (400 context_length_exceeded). A "
                    "prompt that does not fit is refused either way.",
    )

    @field_validator("image_fetch_allow_hosts")
    @classmethod
    def _names(cls, v: list[str]) -> list[str]:
        return host_names(v)


class Keys(Section):
    """[keys] What an API key may hold unless it has limits of its own."""

    key_storage_max_mib: int = Field(
        default=1024, ge=0, le=1 << 30,
        description="MiB of /v1/files storage a key may hold unless it has its own --max-storage: its uploads and its "
                    "batches' output and error files (an upload past it is a 413; a batch whose next answer does "
                    "not fit fails, keeping the answers it has). 0: no limit.",
    )
    key_open_batches_max: int = Field(
        default=16, ge=0, le=1_000_000,
        description="Batches a key may have open at once (validating, in progress or cancelling) unless it has its "
                    "own --max-open-batches (more is a 429). 0: no limit.",
    )



class Sessions(Section):
    """[sessions] Saved KV sessions: how long they keep an instance, and the bank that saves their slots."""

    session_keep_s: float = Field(
        default=1800.0, ge=0.0, le=31_536_000.0,
        description="While a slot of an instance holds a session, the instance stays loaded this many seconds after "
                    "its last use, if its keep_alive is shorter (idle eviction only: memory pressure still evicts it, "
                    "saving the session's slot).",
    )
    session_bank_mib: int = Field(
        default=2048, ge=0, le=1 << 24,
        description="MiB of disk the KV bank may hold for saved session slots; the oldest saves are dropped first "
                    "(0: sessions are not saved).",
    )
    session_save_max_mib: int = Field(
        default=1024, ge=1, le=1 << 24,
        description="The largest one session's saved slot may be, in MiB (a larger save is not kept).",
    )
    session_save_timeout_s: float = Field(
        default=10.0, ge=0.1, le=600.0, description="Seconds an eviction waits for one session's slot to be saved.",
    )
    session_swa_full: bool = Field(
        default=True,
        description="Instances a session's request loads keep a full-size sliding-window cache (SWA models), which "
                    "restoring a saved slot needs; it costs memory, and the fit counts it.",
    )



class Routing(Section):
    """[routing] Remote engines' health and circuits, what a cascade accepts, and the response cache's size."""

    remote_health_s: float = Field(
        default=30.0, ge=1.0, le=3600.0, description="Seconds between health checks of each remote engine.",
    )
    remote_circuit_failures: int = Field(
        default=3, ge=1, le=100,
        description="Failures in a row (health checks or requests) that open a remote engine's circuit.",
    )
    remote_circuit_s: float = Field(
        default=30.0, ge=1.0, le=86400.0,
        description="How long an open circuit refuses requests to a remote engine before one is tried again.",
    )
    cascade_min_logprob: float = Field(
        default=-1.0, ge=-100.0, le=0.0,
        description="The mean token log-probability a cascade's answer needs to be accepted (else the next model is "
                    "tried).",
    )
    response_cache_mib: int = Field(
        default=64, ge=0, le=1 << 20,
        description="MiB of memory the response cache may hold (answers of deterministic requests, replayed to the "
                    "same tenant: docs/8.GATEWAY.md); the least recently used go first (0: nothing is stored).",
    )
    semantic_cache_model: str = Field(
        default="", max_length=200,
        description="The model (from the store, one that serves embeddings) whose embeddings of a request's prompt "
                    "find a similar cached answer, for keys and models set to `--cache semantic` (empty: no semantic "
                    "lookups; the exact cache still answers).",
    )
    semantic_cache_threshold: float = Field(
        default=0.95, gt=0.0, le=1.0,
        description="The cosine similarity of two prompts' embeddings at or above which a semantic cache hit is "
                    "given (everything else about the two requests must be equal).",
    )
    semantic_cache_entries: int = Field(
        default=4096, ge=0, le=1 << 20,
        description="How many prompt embeddings the semantic cache keeps in memory (the least recently used go "
                    "first; 0: none).",
    )



class Cluster(Section):
    """[cluster] This node among the gateways sharing a PostgreSQL log."""

    node_name: str = Field(
        default="",
        description="This gateway's name among the nodes sharing a PostgreSQL log (empty: the host name; "
                    "BLAZAR_NODE_NAME wins). Local to this home.",
    )
    node_url: str = Field(
        default="",
        description="The URL other nodes reach this gateway at (empty: http://127.0.0.1:PORT; BLAZAR_NODE_URL wins). "
                    "Off loopback it must be https (the cluster key travels with forwarded requests): a plain-http "
                    "one refuses `blazar serve` unless --insecure-cluster. Local to this home.",
    )
    node_heartbeat_s: float = Field(
        default=5.0, ge=1.0, le=300.0,
        description="Seconds between a node's heartbeat events (only with the log on PostgreSQL).",
    )
    node_down_after_s: float = Field(
        default=20.0, ge=3.0, le=3600.0,
        description="A node with no heartbeat for this long is marked down by the others, its instances lost.",
    )

    @field_validator("node_name")
    @classmethod
    def _node_name(cls, v: str) -> str:
        v = v.strip()
        if v and not NODE_NAME.fullmatch(v):
            raise ValueError("a node name is 1-64 letters, digits, '.', '_' and '-'")
        return v

    @field_validator("node_url")
    @classmethod
    def _node_url(cls, v: str) -> str:
        v = v.strip().rstrip("/")
        if v and (not v.startswith(("http://", "https://")) or urlsplit(v).password or not urlsplit(v).hostname):
            raise ValueError("expected http(s)://HOST:PORT, without credentials")
        return v


class Speculation(Section):
    """[speculation] The speculation governor (blazar/serving/spec_rule.py): when speculative decoding is used."""

    spec_governor: bool = Field(
        default=True,
        description="Govern speculative decoding while serving: per speculative instance, turn it off per request "
                    "when it loses (low acceptance, or more requests than slots) and back on when it would win.",
    )
    spec_window_s: float = Field(
        default=10.0, ge=0.2, le=3600.0,
        description="Seconds of each window the speculation governor judges (acceptance, throughput, demand).",
    )
    spec_min_acceptance: float = Field(
        default=0.4, ge=0.0, le=1.0,
        description="Speculation is turned off when fewer than this share of its drafted tokens are accepted.",
    )
    spec_min_drafted: int = Field(
        default=32, ge=1, le=1_000_000,
        description="Tokens a window must have drafted before its acceptance is judged.",
    )
    spec_reprobe_s: float = Field(
        default=60.0, ge=1.0, le=86400.0,
        description="Seconds after speculation was turned off for low acceptance before it is tried again "
                    "(doubled after each try that still finds it low, at most 16x).",
    )


class Settings(BaseModel):
    """Every configuration key, by section: `settings.server.port`. Unknown sections and keys are refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    server: Server = Field(default_factory=Server)
    log: Log = Field(default_factory=Log)
    retention: Retention = Field(default_factory=Retention)
    telemetry: Telemetry = Field(default_factory=Telemetry)
    fit: Fit = Field(default_factory=Fit)
    engine: Engine = Field(default_factory=Engine)
    queue: Queue = Field(default_factory=Queue)
    inputs: Inputs = Field(default_factory=Inputs)
    keys: Keys = Field(default_factory=Keys)
    sessions: Sessions = Field(default_factory=Sessions)
    routing: Routing = Field(default_factory=Routing)
    cluster: Cluster = Field(default_factory=Cluster)
    speculation: Speculation = Field(default_factory=Speculation)

    def retention_s(self) -> float:
        """retention.request_retention in seconds; 0 keeps everything live."""
        return self.retention.retention_s()
